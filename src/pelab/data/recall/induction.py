"""induction_heads: the induction-heads task of the Mamba paper (Gu & Dao 2023, §4.1.2, App. E.1, Table 11), as
HazyResearch/safari generates it (`src/dataloaders/synthetics.py`: `generate_induction_head` with
induction_len 1 and one trigger, `Vocab`, `ICLDataModule`), on its own 16-token vocabulary. numpy only.

A sequence of task length L has L + 2 tokens::

    x[0:L]   L tokens drawn uniformly from the 14 ordinary symbols
    x[p]     the copy prefix "=>" (the special token), p uniform in {0, ..., L - 3}: it replaces the draw there
    x[L]     the copy prefix again: the query, the last input
    x[L+1]   the answer: x[p + 1], the token that followed the first copy prefix

so the special token occurs exactly twice, the answer is uniform over the ordinary symbols and may recur
elsewhere by chance. The model reads L + 1 tokens (positions 0..L) and predicts the answer at the last one.
safari's vocabulary of 16 holds 14 ordinary symbols, the copy prefix and a no-op "." that this task never
draws (chance 1/14). Training rows (``induction_rows``) are scored on every position, as safari's labels, or on
the answer only (``data.recall_loss``, pelab.data.recall.induction_data); the probes score the answer.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.sample import RecallSample
from pelab.errors import RecallLengthError

INDUCTION_HEADS = "induction_heads"
MIN_LENGTH = 3  # p uniform in {0, ..., L - 3}: L >= 3


class InductionVocabulary:
    """The task's 16 ids: ordinary symbols "0".."13" (ids 0..13), the copy prefix "=>" (14) and the no-op "."
    (15, never drawn), as safari's ``Vocab(vocab_size=16 - 2, {"copy_prefix": "=>", "noop": "."})`` (whose ids
    follow the sorted strings; the order does not matter to a model whose embedding is drawn at random).
    Text is safari's: symbols separated by spaces (``encode("3 => 3")``). ``eot_id`` is the no-op: there
    are no documents. No reserved recall ids: the single-token kinds of the byte / BPE tokenizers do not run
    on it.

    ``long_samples`` / ``long_from``: the probes score at most ``long_samples`` instances per cell at task lengths
    >= ``long_from`` (None: probes.samples at every length); the data module sets them from data.long_probe_samples
    / data.long_probe_from (the paper's 256 at 2^13-2^14, where one sequence costs 0.4-1.5 CPU s)."""

    symbols: tuple[str, ...] = (*(str(i) for i in range(14)), "=>", ".")
    n_ordinary = 14
    copy_prefix = 14
    noop = 15
    vocab_size = len(symbols)
    eot_id = noop
    reserved_key_ids = range(0)
    reserved_value_ids = range(0)

    def __init__(self, long_samples: int | None = None, long_from: int = 8192) -> None:
        self._ids = {s: i for i, s in enumerate(self.symbols)}
        self.long_samples, self.long_from = long_samples, int(long_from)
        self.reserved: dict[str, list[int]] = {"keys": [0, 0], "values": [0, 0]}  # none ([start, stop) ranges)

    def probe_samples(self, length: int, n: int) -> int:
        """Instances of a probe cell of task length ``length`` when ``n`` are asked (see ``long_samples``)."""
        if self.long_samples is not None and length >= self.long_from:
            return min(int(n), int(self.long_samples))
        return int(n)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[s] for s in text.split()]
        except KeyError as err:
            raise ValueError(f"induction_heads vocabulary: unknown symbol {err.args[0]!r}; the symbols are "
                             f"{' '.join(self.symbols)}") from None

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.symbols[int(i)] for i in ids)


VOCABULARY = InductionVocabulary()


def check_length(length: int, setting: str = "probes.lengths") -> int:
    L = int(length)
    if L < MIN_LENGTH:
        raise RecallLengthError(f"induction_heads needs a task length >= {MIN_LENGTH} ({setting}); got {L}")
    return L


def induction_rows(g: np.random.Generator, n: int, length: int,
                   vocab: InductionVocabulary = VOCABULARY) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of task length L = ``length``: (rows (n, L + 2) int64, trigger positions p (n,)), drawn
    from ``g`` in one pass (see the module doc; safari draws the same distribution one sequence at a time)."""
    L = check_length(length, "data.seq_len")
    rows = g.integers(0, vocab.n_ordinary, size=(n, L + 2), dtype=np.int64)  # (n, L + 2); L+1 is set below
    p = g.integers(0, L - 2, size=n)  # (n,) in {0, ..., L - 3}: safari's rng.integers(L - (1 + induction_len))
    r = np.arange(n)
    rows[r, p] = vocab.copy_prefix
    rows[:, L] = vocab.copy_prefix  # the query
    rows[:, L + 1] = rows[r, p + 1]  # the answer: the token after the first copy prefix
    return rows, p


def induction_probe(pc: object, kind: str, length: int, depth: float, n: int, seed: int,
                    opts: RecallOptions) -> list[RecallSample]:
    """``n`` probe instances of task length L = ``length`` (L + 2 tokens: the L + 1 inputs and the answer).
    Instance i draws from a generator seeded by (seed, kind, L, i): the same instance in every run and for any
    n (at long lengths the vocabulary may cap n: ``InductionVocabulary.long_samples``; the first instances are
    kept). The trigger position is uniform (safari's distribution), so ``depth`` is not used (each sample's
    ``depth`` records where its trigger fell, p / (L - 1)); one depth per cell suffices (``probes.depths``).
    The filler is not read. The task has its own vocabulary: with another tokenizer (``pc.tok``) the cells are
    n/a with a note naming the fix (RecallLengthError, which run_probes turns into a note)."""
    vocab = getattr(pc, "tok", pc)
    if not isinstance(vocab, InductionVocabulary):
        raise RecallLengthError("induction_heads has its own 16-token vocabulary: probe it in a run with "
                                "data=induction_heads (experiment=induction_heads), not with this tokenizer")
    L = check_length(length)
    tag = zlib.crc32(kind.encode())
    out = []
    for i in range(vocab.probe_samples(L, n)):
        g = np.random.default_rng([int(seed) % 2**64, tag, L, i])
        rows, p = induction_rows(g, 1, L)
        row, q = rows[0].tolist(), int(p[0])
        gold = q + 1  # the answer's copy in the context
        out.append(RecallSample(
            input_ids=row[: L + 1], answer_ids=[row[L + 1]], gold_index=gold, depth=q / (L - 1), length=L + 2,
            kind=kind, n_items=1, answer_space=VOCABULARY.n_ordinary, candidates=[row[L + 1]],
            candidate_depths=[gold / L], gold_distance=L + 1 - gold,
        ))
    return out


def induction_probe_length(pairs: int) -> int:
    """The shortest task length (the probe ignores probes.pairs)."""
    return MIN_LENGTH
