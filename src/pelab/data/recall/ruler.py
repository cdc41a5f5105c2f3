"""What the RULER-style kinds share (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"; reference: NVIDIA/RULER ``scripts/data/synthetic/niah.py``, ``variable_tracking.py``,
``common_words_extraction.py``, read at c3f5e3b): one builder per kind makes an `Instance` of exactly ``length``
tokens from a haystack of real text and a numpy generator; `ruler_probe`, `ruler_row` and `ruler_rows` turn a builder
into the probe-kind table's three hooks (probe samples, one training row, a batch's training rows over its own text).

Deviations from RULER shared by every kind (each module states its own):

* **single-token items**: keys, values, variable names and words are reserved ids of the tokenizer (RULER: words,
  7-digit numbers, UUIDs, 5-letter names of several tokens each), so an answer token is a copy of a context token
  whatever the tokenizer, and a 2-layer model can learn the task on a CPU;
* **scoring**: exact match of every answer token, teacher-forced (greedy decoding of the answer), in one fixed order
  (RULER: the fraction of the expected strings found anywhere in the generated text, any order);
* **haystack**: real text of the run's corpus (the code corpus by default: the Python standard library; probes take
  the validation split, training rows their own text rows) instead of Paul Graham's essays or the repeated noise
  sentence; needles and statements are their ids alone, with no sentence around them, and the questions have no
  instruction (see `pelab.data.recall.niah` for why);
* **lengths** scaled to small models: the training length (128 tokens by default) and its multiples, not 4K-128K.

Draws: a probe sample's generator is seeded by (probes.seed, kind, length, sample index), drawn before the depth is
used, so the same instance appears at every depth (the paired design of README.md); training rows draw from the
batch's generator. Probes and training rows use the same reserved ranges (too small to split; see README.md,
Disjoint instances). Training rows ask more questions about the same context where the kind has more to ask, as
mqar's rows ask all their keys (more answers per row, the same skill): every key of a niah_multikey context, every
chain of a vt context, each answer scored; the probes ask the one question RULER asks."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.sample import RecallSample, with_mask
from pelab.data.recall.spaces import TRAIN_SPACE
from pelab.errors import RecallLengthError


@dataclass
class Instance:
    """One built instance: prompt ``ids`` and ``answer`` (``len(ids) + len(answer) == length``), ``gold_index`` (the
    first answer token's copy in the context), ``items`` (index of every candidate answer token in the context, in
    context order: values, names or distinct words), ``answer_space`` (possible answers, for the chance level),
    ``spans``: the (start, end) indices in ids + answer of every answer a training row scores (its earlier questions'
    answers, then the final one; empty: the final answer only)."""

    ids: list[int]
    answer: list[int]
    gold_index: int
    items: list[int]
    answer_space: int
    spans: list[tuple[int, int]] = field(default_factory=list)
    any_order: bool = False  # a probe scores the answer in any order (RecallSample.any_order)

    def answer_spans(self) -> list[tuple[int, int]]:
        return self.spans or [(len(self.ids), len(self.ids) + len(self.answer))]


# build(pc, g, hay, length, depth, opts, name, train=False): ``train`` = a training row, which may ask more questions
Builder = Callable[..., Instance]


def ruler_key(opts: RecallOptions) -> str:
    """The config group the options came from, for error messages: the training rows' or the probes'."""
    return "data.recall_ruler" if opts.space == TRAIN_SPACE else "probes.ruler"


def draw_ids(ids: range, n: int, g: np.random.Generator, what: str, setting: str) -> np.ndarray:
    """``n`` distinct ids of a reserved range, in random order; a RecallLengthError naming ``setting`` when it holds
    fewer (the config check `ruler_vocabulary` says so first)."""
    if n > len(ids):
        raise RecallLengthError(f"{setting} needs {n} distinct reserved {what} ids but the tokenizer reserves "
                                f"{len(ids)}; raise tokenizer.reserved_{what} or lower {setting}")
    return ids.start + g.choice(len(ids), n, replace=False)


def haystack(filler: np.ndarray, g: np.random.Generator, n: int) -> np.ndarray:
    """``n`` tokens of real text from a random start of ``filler`` (wrapping around a short one)."""
    return filler[(g.integers(len(filler)) + np.arange(n)) % len(filler)]


def spread(hay: np.ndarray, items: Sequence[Sequence[int]], depth: float,
           g: np.random.Generator | None = None) -> tuple[list[int], list[int]]:
    """The haystack with ``items`` (token lists) inserted in order at evenly spaced places, as mqar's probe pairs: item
    j after ``round(j * H / (N - 1))`` haystack tokens (one item: after ``round(depth * H)``). With ``g`` (a training
    row) at uniformly random places instead, as mqar's training pairs: content, not a fixed position, tells a needle.
    Returns the ids and each item's start index."""
    H, N = len(hay), len(items)
    if g is not None:
        cuts = np.sort(g.integers(0, H + 1, size=N)).tolist()
    else:
        cuts = [round(j * H / (N - 1)) for j in range(N)] if N > 1 else [round(float(depth) * H)]
    ids: list[int] = []
    starts: list[int] = []
    prev = 0
    for cut, item in zip(cuts, items, strict=True):
        ids += hay[prev:cut].tolist()
        starts.append(len(ids))
        ids += list(item)
        prev = cut
    ids += hay[prev:].tolist()
    return ids, starts


def too_short(name: str, need: int, length: int, setting: str) -> RecallLengthError:
    return RecallLengthError(f"{name} needs at least {need} tokens ({setting}); got length={length}")


def _sample(inst: Instance, name: str, length: int, depth: float, n_items: int) -> RecallSample:
    s = RecallSample(inst.ids, inst.answer, inst.gold_index, depth, length, name, n_items, inst.answer_space)
    s.candidates = [inst.ids[j] for j in inst.items]
    s.candidate_depths = [j / (len(inst.ids) - 1) for j in inst.items]
    s.gold_distance = len(inst.ids) - inst.gold_index
    s.any_order = inst.any_order
    return s


def ruler_probe(pc: Pieces, name: str, length: int, depth: float, n: int, seed: int, opts: RecallOptions,
                build: Builder) -> list[RecallSample]:
    """``n`` probe samples of one cell; sample i's generator is seeded by (seed, kind, length, i) and draws the
    haystack (``opts.filler_ids``: the validation text; None: the fixed sentence) before anything else."""
    filler = pc.filler_array(opts.filler_ids)
    tag = zlib.crc32(name.encode())
    out = []
    for i in range(n):
        g = np.random.default_rng([int(seed) % 2**64, tag, int(length), i])
        inst = build(pc, g, haystack(filler, g, length), length, depth, opts, name)
        assert len(inst.ids) + len(inst.answer) == length, (name, len(inst.ids), len(inst.answer), length)
        out.append(_sample(inst, name, length, depth, len(inst.items)))
    return out


def ruler_row(pc: Pieces, length: int, rng: random.Random, opts: RecallOptions, build: Builder,
              name: str) -> tuple[list[int], list[bool]]:
    """One training sequence (haystack: ``opts.filler_ids`` or the sentence; depth uniform in [0, 1]; the kind's
    training questions) and its answer mask."""
    g = np.random.default_rng(rng.getrandbits(64))
    hay = haystack(pc.filler_array(opts.filler_ids), g, length)
    inst = build(pc, g, hay, length, float(g.random()), opts, name, train=True)
    return with_mask(inst.ids, inst.answer, inst.answer_spans())


def ruler_rows(pc: Pieces, text: np.ndarray, g: np.random.Generator, span: int, opts: RecallOptions,
               build: Builder, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Training rows over a batch's own text ``text`` (n, T): row r holds one instance of ``span`` tokens whose
    haystack is the row's first tokens, at a uniform depth, with the kind's training questions (each answer scored),
    then the row's text from ``span`` on. Returns (rows, answer mask), both (n, T)."""
    rows = np.array(text, dtype=np.int64)
    mask = np.zeros(rows.shape, dtype=bool)
    S = min(int(span), rows.shape[1])
    for r in range(len(rows)):
        inst = build(pc, g, rows[r, :S].copy(), S, float(g.random()), opts, name, train=True)
        rows[r, :S] = inst.ids + inst.answer
        for a, b in inst.answer_spans():
            mask[r, a:b] = True
    return rows, mask
