"""Lost-in-the-middle probes: retrieval by depth x context length, scored per instance with intervals.

Scoring is teacher-forced on prompt + answer (one forward per sample, positions 0..L-1), batched across
samples of one length. Only the answer positions go through the LM head (``GPT.hidden`` then ``lm_head``
on the gathered rows: the head is 8-20% of a tiny model's forward at 512 tokens on CPU), and the last block
runs on the last rows only (``GPT.hidden(from_index=...)``: the answers end each sample). Per sample a
``ProbeRecord``:

* **correct** (exact match) = the argmax at every answer position equals the gold answer token. This is
  greedy decoding of ``len(answer)`` tokens: if greedy decoding reproduces the answer, each step sees
  exactly the gold prefix, so the teacher-forced argmaxes are the greedy choices. (Ties resolve like argmax.)
  A sample with ``any_order`` (RULER's scoring of a set of answers) that misses the gold order is decoded
  greedily, one forward per answer token, and is correct when the tokens generated are the answer's in any
  order; its other fields stay those of the gold order.
* **logprob** = mean over answer tokens of ``log_softmax`` (fp32) at the gold token; informative even when
  accuracy sits at chance.
* **rank** of the gold among the distinct candidate values of the context (``RecallSample.candidates``,
  their first tokens) at the first answer position: 1 + the number of other candidates with a strictly
  higher logit (1 = best; a tie does not count against the gold).
* **pred** = the argmax token at the first answer position, and **error**, judged on it: "ok";
  "other_in_context" = the first token of another value of the context (``error_depth`` = that value's
  depth, the first such candidate in context order); "not_in_context" = anything else, including a right
  first token followed by a wrong one (multi-token answers).

Cells (kind, depth, length) carry n, the accuracy with its Wilson 95% interval, the per-instance outcomes
(a bit string, for paired comparisons between encodings), chance = mean 1 / answer_space (a uniform guess
over the answer space) and copy = mean 1 / n_items over samples with several values in context (copying a
random value of the context: the floor for retrieval). Summaries over depths (mean accuracy, ``lim_gap``)
get paired-bootstrap intervals over instances (``pelab.evaluation.stats``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pelab.data.recall import (
    OFFSET,
    RecallSample,
    as_id_list,
    kind_names,
    make_probe_samples,
    probe_kind,
)
from pelab.errors import PositionOutOfRange, RecallLengthError
from pelab.evaluation import progress, stats
from pelab.evaluation.common import (
    evaluating,
    model_device,
    not_applicable_note,
    stoppable_forward,
    windows_per_batch,
)
from pelab.metric_keys import metric_key
from pelab.summary import json_safe

log = logging.getLogger(__name__)

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
ERRORS = ("ok", "other_in_context", "not_in_context")
NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# scoring


@dataclass(frozen=True)
class ProbeRecord:
    """The outcome of one probe instance (see the module docstring)."""

    correct: bool
    logprob: float
    rank: int
    pred: int
    error: str
    error_depth: float = NAN


def answer_logits(model: nn.Module, x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """fp32 logits (N, V) at the positions (rows[i], cols[i]) of the batch ``x`` (B, T). A model with
    ``hidden`` (pelab's GPT) runs its last block on the rows from the first answer on and the LM head on
    the answer rows only; any other module is run whole."""
    if hasattr(model, "hidden") and hasattr(model, "lm_head"):
        # Answers end their rows: the last block runs on the rows from the first answer column on. Their
        # number is rounded up to a multiple of 8 (as the head rows below) so that a sample scored alone and
        # in a batch with other answer lengths (7 tokens or fewer) goes through the same kernels with the
        # same rows per sample: its record does not depend on its batch.
        T, n = x.shape[1], x.shape[1] - int(cols.min())
        first = max(0, T - n - (-n % 8))
        h = model.hidden(x, from_index=first)[rows, cols - first]  # (N, D)
        # BLAS computes 1-3 rows with another kernel (gemv) than many rows, a few ulps apart: zero rows up
        # to a multiple of 8 keep every row on one kernel, so a record does not depend on its batch.
        pad = -len(h) % 8
        return model.lm_head(F.pad(h, (0, 0, 0, pad)))[: len(h)].float()
    return model(x)[rows, cols].float()


def _records(chunk: Sequence[RecallSample], logits: Tensor, gold: Tensor) -> list[ProbeRecord]:
    """The records of one batch from its answer rows: logits (N, V) fp32 and gold ids (N,), the rows of
    each sample consecutive. Tensor work on the logits' device, then a light Python pass per sample."""
    dev = logits.device
    n_ans = torch.tensor([len(s.answer_ids) for s in chunk], device=dev)
    owner = torch.repeat_interleave(torch.arange(len(chunk), device=dev), n_ans)  # (N,) sample of each row
    first = torch.cumsum(n_ans, 0) - n_ans  # (B,) each sample's first answer row
    logp = F.log_softmax(logits, dim=-1).gather(1, gold[:, None]).squeeze(1).double()  # (N,)
    argmax = logits.argmax(-1)  # (N,)
    logprob = torch.zeros(len(chunk), dtype=torch.float64, device=dev).index_add_(0, owner, logp) / n_ans
    n_wrong = torch.zeros(len(chunk), device=dev).index_add_(0, owner, (argmax != gold).float())
    # rank: the other distinct candidates, padded with the gold itself (never above itself)
    g0 = [s.answer_ids[0] for s in chunk]
    others = [sorted(set(s.candidates) - {g}) for s, g in zip(chunk, g0)]
    width = max(1, max(len(o) for o in others))
    cand = torch.tensor([o + [g] * (width - len(o)) for o, g in zip(others, g0)], device=dev)  # (B, C)
    top = logits[first]  # (B, V): the first answer position
    above = (top.gather(1, cand) > top.gather(1, torch.tensor(g0, device=dev)[:, None])).sum(1)
    out = []
    for s, g, o, lp, wrong, rank, pred in zip(chunk, g0, others, logprob.tolist(), n_wrong.tolist(),
                                              (1 + above).tolist(), argmax[first].tolist()):
        error, depth = "ok", NAN
        if wrong:
            error = "not_in_context"
            if pred != g and pred in o:
                error, j = "other_in_context", list(s.candidates).index(pred)
                depth = float(s.candidate_depths[j]) if j < len(s.candidate_depths) else NAN
        out.append(ProbeRecord(wrong == 0, lp, int(rank), int(pred), error, depth))
    return out


def _batch(chunk: Sequence[RecallSample], length: int) -> Tensor:
    """(B, length) LongTensor of prompt + answer. Row by row into numpy: 5x faster than torch.tensor on
    nested lists (0.1 s for 256 x 4,096 tokens), and a memcpy when the ids are arrays."""
    x = np.empty((len(chunk), length), dtype=np.int64)
    for r, s in enumerate(chunk):
        p = len(s.input_ids)
        x[r, :p], x[r, p:] = s.input_ids, s.answer_ids
    return torch.from_numpy(x)


def score_samples(
    model: nn.Module,
    samples: Sequence[RecallSample],
    device: torch.device | str | None = None,
    batch_size: int = 16,
    batch_tokens: int | None = 16384,
) -> list[ProbeRecord]:
    """One ``ProbeRecord`` per sample, in input order.

    Samples of equal total length are batched (at most ``batch_size`` and ``batch_tokens // length`` per
    forward); the result does not depend on the batching (tested: equal to one sample at a time on CPU
    fp32). Raises ``PositionOutOfRange`` from the model unchanged (``run_probes`` catches it). Runs under
    ``torch.no_grad()`` with ``model.eval()`` (previous mode restored).
    """
    device = torch.device(device) if device is not None else model_device(model)
    out: list[ProbeRecord | None] = [None] * len(samples)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        if not s.answer_ids:
            raise ValueError(f"sample {i} has no answer tokens")
        by_len.setdefault(len(s.input_ids) + len(s.answer_ids), []).append(i)

    with evaluating(model):
        for T, idxs in by_len.items():
            per_batch = windows_per_batch(T, batch_size, batch_tokens)
            for b0 in range(0, len(idxs), per_batch):
                chunk = [samples[i] for i in idxs[b0 : b0 + per_batch]]
                x = _batch(chunk, T)
                # logits at p0 + j predict answer token j (p0 = the last prompt position)
                rows = [r for r, s in enumerate(chunk) for _ in s.answer_ids]
                cols = [len(s.input_ids) - 1 + j for s in chunk for j in range(len(s.answer_ids))]
                gold = torch.tensor([t for s in chunk for t in s.answer_ids], dtype=torch.long)
                rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
                logits = stoppable_forward(partial(answer_logits, model, rows=rows_t, cols=cols_t), x.to(device))  # (N, V)
                records = _records(chunk, logits, gold.to(logits.device))
                for i, r in zip(idxs[b0 : b0 + per_batch], records):
                    out[i] = r
        missed = [i for i, s in enumerate(samples) if s.any_order and not out[i].correct]  # type: ignore[union-attr]
        for i, found in zip(missed, _any_order_found(model, [samples[i] for i in missed], device, batch_size)):
            if found:
                out[i] = replace(out[i], correct=True, error="ok")  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _any_order_found(model: nn.Module, samples: Sequence[RecallSample], device: torch.device,
                     batch_size: int) -> list[bool]:
    """Per sample: do ``len(answer)`` greedy steps from its prompt generate its answer tokens in some order
    (a multiset match)? Samples of one prompt length share each step's forward."""
    found = [False] * len(samples)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_len.setdefault(len(s.input_ids), []).append(i)
    for P, idxs in by_len.items():
        for b0 in range(0, len(idxs), batch_size):
            chunk = [samples[i] for i in idxs[b0 : b0 + batch_size]]
            x = torch.tensor(np.array([s.input_ids for s in chunk], dtype=np.int64), device=device)  # (B, P)
            rows = torch.arange(len(chunk), device=device)
            for _ in range(max(len(s.answer_ids) for s in chunk)):
                cols = torch.full_like(rows, x.shape[1] - 1)
                step = stoppable_forward(partial(answer_logits, model, rows=rows, cols=cols), x)  # (B, V)
                x = torch.cat([x, step.argmax(-1, keepdim=True)], dim=1)
            for i, s, row in zip(idxs[b0 : b0 + batch_size], chunk, x[:, P:].tolist()):
                found[i] = sorted(row[: len(s.answer_ids)]) == sorted(s.answer_ids)
    return found


def lim_gap(depths: Sequence[float], accs: Sequence[float]) -> float:
    """Mean accuracy at the two edge depths (min and max) minus the mean at the interior depths.
    Positive = lost in the middle. NaN with fewer than 3 distinct depths or any NaN accuracy.
    (With the per-instance outcomes, ``stats.depth_summary`` gives the same number and its interval.)"""
    edges = stats.edge_mask(depths)
    a = [float(x) for x in accs]
    if edges is None or any(math.isnan(x) for x in a):
        return NAN
    e = [x for x, is_edge in zip(a, edges) if is_edge]
    m = [x for x, is_edge in zip(a, edges) if not is_edge]
    return sum(e) / len(e) - sum(m) / len(m)


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class ProbeCell:
    """One (kind, depth, length) cell. ``lo`` / ``hi``: Wilson 95% interval of ``acc``; ``rank``: mean
    rank of the gold among the candidates; ``other`` / ``absent``: fractions of instances answered with
    another in-context value / with something not in the context, ``other_depth`` the mean depth of those
    wrongly picked values; ``outcomes``: "1"/"0" per instance, in sample order (the same instance at every
    depth, and in every run with the same probes.seed and tokenizer). ``prefix``: mqar_offset's filler
    prefix in multiples of the training length (None for the other kinds)."""

    kind: str
    depth: float
    length: int
    acc: float = NAN
    lo: float = NAN
    hi: float = NAN
    logprob: float = NAN
    rank: float = NAN
    other: float = NAN
    absent: float = NAN
    other_depth: float = NAN
    n: int = 0
    chance: float = NAN
    chance_copy: float = NAN
    outcomes: str = ""
    note: str = ""
    prefix: int | None = None

    def fill(self, samples: Sequence[RecallSample], records: Sequence[ProbeRecord]) -> None:
        n = self.n = len(records)
        if not n:
            return
        k = sum(r.correct for r in records)
        self.acc, (self.lo, self.hi) = k / n, stats.wilson(k, n)
        self.logprob = sum(r.logprob for r in records) / n
        self.rank = sum(r.rank for r in records) / n
        picked = [r.error_depth for r in records if r.error == "other_in_context"]
        self.other = len(picked) / n
        self.absent = sum(r.error == "not_in_context" for r in records) / n
        self.other_depth = _mean(picked)
        self.outcomes = stats.bits([r.correct for r in records])
        self.chance = sum(1.0 / s.answer_space for s in samples) / n
        multi = [1.0 / s.n_items for s in samples if s.n_items > 1]
        self.chance_copy = _mean(multi) if len(multi) == n else NAN


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs and not any(math.isnan(x) for x in xs) else NAN


@dataclass
class ProbeResult:
    kinds: list[str]
    depths: list[float]
    lengths: list[int]
    train_length: int | None = None
    cells: dict[tuple[str, float, int], ProbeCell] = field(default_factory=dict)
    # the cells of kinds with the offset layout (mqar_offset), by (kind, prefix multiple)
    offset: dict[tuple[str, int], ProbeCell] = field(default_factory=dict)

    def cell(self, kind: str, depth: float, length: int) -> ProbeCell:
        return self.cells[(kind, float(depth), int(length))]

    def grid(self, kind: str, metric: str = "acc") -> list[list[float]]:
        """``metric`` of ``kind`` as rows = depths, columns = lengths (for ``plots.plot_probe_heatmap``)."""
        return [[getattr(self.cell(kind, d, L), metric) for L in self.lengths] for d in self.depths]

    def depth_curve(self, kind: str, length: int, metric: str = "acc") -> list[float]:
        """``metric`` by depth at one length (the U-curve; ``plots.plot_depth_curve``)."""
        return [getattr(self.cell(kind, d, length), metric) for d in self.depths]

    def chance(self, kind: str) -> float:
        return self._baseline(kind, "chance")

    def copy(self, kind: str) -> float:
        """Copy-a-random-value baseline (NaN for kinds with one value in context, e.g. passkey)."""
        return self._baseline(kind, "chance_copy")

    def _baseline(self, kind: str, attr: str) -> float:
        vals = [getattr(c, attr) for c in self.cells.values() if c.kind == kind and c.n]
        return _mean(vals) if vals else NAN

    def summary(self, kind: str, length: int) -> dict[str, float]:
        """Mean accuracy over depths and lim_gap at one length, with paired-bootstrap intervals
        (``stats.depth_summary``; point values from the cell accuracies when outcomes are missing)."""
        cells = [self.cell(kind, d, length) for d in self.depths]
        out = stats.depth_summary(self.depths, [stats.unbits(c.outcomes) for c in cells])
        out["acc"] = _mean([c.acc for c in cells])
        out["lim_gap"] = lim_gap(self.depths, [c.acc for c in cells])
        return out

    def length_curve(self, kind: str) -> list[float]:
        """Mean accuracy over depths at each length."""
        return [_mean(self.depth_curve(kind, L)) for L in self.lengths]

    def measured(self, kind: str) -> bool:
        """Whether any length of ``kind`` has an accuracy (not every cell n/a)."""
        return any(math.isfinite(a) for a in self.length_curve(kind))

    def effective_length(self, kind: str) -> int | None:
        """Longest length with mean accuracy >= 0.9 (None: no length reaches it)."""
        return stats.effective_length(self.lengths, self.length_curve(kind))

    def auc(self, kind: str) -> float:
        """Area under mean accuracy vs log2(length / train_length), normalised to [0, 1]; NaN when no length
        was measured."""
        if not self.measured(kind):
            return NAN
        train_length = self.train_length or min(self.lengths)
        return stats.auc_log_length(self.lengths, self.length_curve(kind), train_length)

    def metrics(self) -> dict[str, float]:
        """Per kind and length ``probe/{kind}/{name}@{L}``: acc (mean over depths), acc_lo / acc_hi,
        logprob, lim_gap, lim_gap_lo / lim_gap_hi, rank (mean rank of the gold among the candidates),
        other_in_context / not_in_context (error fractions); per kind ``effective_length`` (0 = none;
        NaN when every cell is n/a) and ``auc``; for the offset kinds (mqar_offset) ``acc``, ``acc_lo``,
        ``acc_hi`` at each total length."""
        m: dict[str, float] = {}
        for k in self.kinds:
            for L in self.lengths:
                s = self.summary(k, L)
                for stat in ("acc", "acc_lo", "acc_hi"):
                    m[metric_key(f"probe/{k}/{stat}", L)] = s[stat]
                m[metric_key(f"probe/{k}/logprob", L)] = _mean(self.depth_curve(k, L, "logprob"))
                for stat in ("lim_gap", "lim_gap_lo", "lim_gap_hi"):
                    m[metric_key(f"probe/{k}/{stat}", L)] = s[stat]
                m[metric_key(f"probe/{k}/rank", L)] = _mean(self.depth_curve(k, L, "rank"))
                m[metric_key(f"probe/{k}/other_in_context", L)] = _mean(self.depth_curve(k, L, "other"))
                m[metric_key(f"probe/{k}/not_in_context", L)] = _mean(self.depth_curve(k, L, "absent"))
            eff = float(self.effective_length(k) or 0) if self.measured(k) else NAN
            m[f"probe/{k}/effective_length"] = eff
            m[f"probe/{k}/auc"] = self.auc(k)
        for c in self.offset.values():
            m[metric_key(f"probe/{c.kind}/acc", c.length)] = c.acc
            m[metric_key(f"probe/{c.kind}/acc", c.length, "lo")] = c.lo
            m[metric_key(f"probe/{c.kind}/acc", c.length, "hi")] = c.hi
        return m

    def offset_kinds(self) -> list[str]:
        """The kinds probed with the offset layout (their cells in ``offset``), in order."""
        return list(dict.fromkeys(k for k, _ in self.offset))

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        """One dict per cell (every ProbeCell field; the W&B tables pick their columns), one kind if given
        (an offset kind: its cells by prefix)."""
        if kind in self.offset_kinds():
            return [asdict(c) for (k, _), c in sorted(self.offset.items()) if k == kind]
        return [asdict(c) for (k, _, _), c in sorted(self.cells.items()) if kind is None or k == kind]

    def offset_rows(self) -> list[dict[str, Any]]:
        """The cells of every offset kind, by kind then prefix."""
        return [asdict(c) for _, c in sorted(self.offset.items())]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable; non-finite floats become "nan" / "inf" strings (see extrapolation.json_safe).
        ``rows`` carry the per-instance outcomes (bit strings) for paired comparisons in pelab.report."""
        return json_safe(
            {
                "kinds": list(self.kinds),
                "depths": list(self.depths),
                "lengths": list(self.lengths),
                "train_length": self.train_length,
                "metrics": self.metrics(),
                "chance": {k: self.chance(k) for k in self.kinds},
                "copy": {k: self.copy(k) for k in self.kinds},
                "effective_length": {k: self.effective_length(k) for k in self.kinds},
                "grids": {
                    k: {m: self.grid(k, m) for m in ("acc", "lo", "hi", "logprob")} for k in self.kinds
                },
                "rows": self.rows(),
                "offset": self.offset_rows(),
            }
        )


# ---------------------------------------------------------------------------------------------
# the probe run


def run_probes(
    model: nn.Module,
    tokenizer: Any,
    kinds: Sequence[str] | None = None,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    lengths: Sequence[int] = (256,),
    samples_per_cell: int = 20,
    seed: int = 1234,
    filler_ids: Sequence[int] | None = None,
    device: torch.device | str | None = None,
    batch_size: int = 16,
    batch_tokens: int | None = 16384,
    train_length: int | None = None,
    prefix_multiples: Sequence[int] = (0, 1, 3, 7),
    **sample_options: Any,
) -> ProbeResult:
    """Records per (kind, depth, length) cell on seeded samples (``make_probe_samples``; ``sample_options``
    such as key_len / value_len go to it), every kind and depth of one length scored in the same batches.

    ``kinds``: names in the probe-kind table (None: every registered kind). ``lengths`` are absolute token
    counts (``extrapolation.resolve_lengths`` converts multiples). A kind with the offset layout (mqar_offset)
    is probed once per prefix multiple m at (m + 1) * ``train_length`` tokens. A length the model cannot
    represent (``PositionOutOfRange``) or that is too short for a kind gives NaN cells with a note; nothing
    raises for those.
    """
    kinds = list(kind_names() if kinds is None else kinds)
    layout = {k: probe_kind(k).layout for k in kinds}  # unknown kinds raise here
    filler_ids = as_id_list(filler_ids)  # once, not per cell
    depths_f = sorted({float(d) for d in depths})
    lens = sorted({int(L) for L in lengths})
    grid_kinds = [k for k in kinds if layout[k] != OFFSET]
    res = ProbeResult(kinds=grid_kinds, depths=depths_f, lengths=lens, train_length=train_length)
    n = int(samples_per_cell)
    lo, hi = stats.wilson(n // 2, n)
    log.info("probes: n=%d instances per cell (95%% interval at accuracy 0.5: %.2f-%.2f)", n, lo, hi)

    def make(kind: str, length: int, depth: float, **extra: Any) -> list[RecallSample]:
        return make_probe_samples(kind, tokenizer, length, depth, n, seed, filler_ids=filler_ids,
                                  **sample_options, **extra)

    score = {"model": model, "device": device, "batch_size": batch_size, "batch_tokens": batch_tokens}
    offset_kinds, prefixes = [k for k in kinds if layout[k] == OFFSET], sorted({int(m) for m in prefix_multiples})
    # the progress bar's plan: (instances, length) of each length, then of each offset probe
    parts = [(len(grid_kinds) * len(depths_f) * n, L) for L in lens]
    parts += [(n, (m + 1) * train_length) for _ in offset_kinds for m in prefixes] if train_length else []
    with progress.opened("probes", "instances", parts, model):
        for L in lens:
            batch: list[tuple[ProbeCell, list[RecallSample]]] = []
            for kind in grid_kinds:
                cells = [ProbeCell(kind=kind, depth=d, length=L) for d in depths_f]
                res.cells.update({(kind, c.depth, L): c for c in cells})
                try:
                    batch += [(c, make(kind, L, c.depth)) for c in cells]
                except RecallLengthError as exc:
                    for c in cells:
                        c.note = f"n/a — {exc}"
                    progress.advance(len(cells) * n, L)  # skipped
            _score_cells(batch, **score)
        for kind in offset_kinds:
            if train_length is None:
                raise ValueError(f"probes.kinds contains {kind}: run_probes needs train_length")
            for m in prefixes:
                c = res.offset[(kind, m)] = ProbeCell(kind=kind, depth=NAN, length=(m + 1) * train_length, prefix=m)
                try:
                    # a training-length window (the gold pair at a fixed distance from the query) after
                    # m * train_length filler tokens: (m + 1) * train_length tokens in all
                    _score_cells([(c, make(kind, train_length, 0.0, prefix_multiple=m))], **score)
                except RecallLengthError as exc:
                    c.note = f"n/a — {exc}"
                    progress.advance(n, c.length)  # skipped
    return res


def _score_cells(
    batch: Sequence[tuple[ProbeCell, list[RecallSample]]], model: nn.Module, **score: Any
) -> None:
    """Score the samples of several cells of one length together and fill the cells; a length the model
    cannot represent leaves them NaN with a note."""
    flat = [s for _, ss in batch for s in ss]
    if not flat:
        return
    try:
        records = score_samples(model, flat, **score)
    except PositionOutOfRange as exc:
        for c, _ in batch:
            c.note = not_applicable_note(exc)
        progress.advance(len(flat), batch[0][0].length)  # skipped
        return
    i = 0
    for c, ss in batch:
        c.fill(ss, records[i : i + len(ss)])
        i += len(ss)
