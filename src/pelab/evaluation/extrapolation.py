"""Length extrapolation: perplexity beyond the training window (ALiBi-paper protocols).

The evaluation text is K blocks of N tokens (N + 1 with the last target), N the longest evaluated length:
``spread_blocks`` draws them at random places of the whole split, stratified by document (a fixed ``eval.seed``,
so every run of a study scores the same blocks; disjoint; a block may cross a document boundary, as the training
windows do, and belongs to the document holding most of its scored tokens: ``pelab.evaluation.blocks``).
Two protocols over each block:

* ``nonoverlap`` -- the span is cut into independent windows of L tokens; every token is scored
  once and sees context back to its window start only (the "early token curse").
* ``sliding``    -- window L, stride S: the first window scores all of its L tokens, every following
  window re-encodes L - S tokens of context and scores only its last S tokens. S = L is exactly
  ``nonoverlap``; S = 1 is the strictest (and slowest) setting.

Every length and protocol scores the *same* K x N target tokens, so the curves are comparable across lengths
and across runs, and lengths are paired block by block. NLL is summed in fp32 from ``F.cross_entropy`` (never
softmax-then-log, which turns peaked logits into inf) per block, in float64. Blocks of one document are
correlated, so the document is the sampling unit: the 95% interval of a perplexity is a bootstrap over the
documents (``stats.clustered_ppl_interval``: whole documents resampled, exp(sum NLL / sum tokens) recomputed),
that of a ratio ppl@L / ppl@train_length the same bootstrap of both, paired. Blocks with no document ids (a bare
stream) fall back to a bootstrap over the blocks, labelled so.

Each window is an independent sequence at positions ``0..len-1`` (``model(idx)`` with ``start=0``).
A model whose encoding cannot represent a length (learned absolute positions past their table)
raises ``pelab.encodings.PositionOutOfRange``; that length is recorded as NaN with a note,
never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pelab.errors import PositionOutOfRange
from pelab.evaluation import progress, stats
from pelab.evaluation.blocks import slots_by_document, uniform_slots
from pelab.evaluation.common import (
    evaluating,
    model_device,
    not_applicable_note,
    safe_exp,
    stoppable_forward,
    windows_per_batch,
)
from pelab.evaluation.config import PROTOCOLS
from pelab.metric_keys import metric_key
from pelab.summary import json_safe

# ---------------------------------------------------------------------------------------------
# lengths, token budget, window plans


def blocks_for_budget(eval_tokens: int | None, block_length: int) -> int | None:
    """Blocks of ``block_length`` scored tokens for a budget of ``eval_tokens`` (rounded up, at least one);
    None = the whole split."""
    if eval_tokens is None:
        return None
    return max(1, -(-int(eval_tokens) // int(block_length)))


def spread_blocks(tokens: Any, block_length: int, n_blocks: int | None, seed: int,
                  doc_starts: np.ndarray | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """K blocks of ``block_length + 1`` tokens drawn at random places of ``tokens`` (a split's stream), in stream
    order: (K, block_length + 1) int64 and their start offsets (K,). The split is cut into slots of
    ``block_length`` tokens (a block's last target is the next slot's first input, so the blocks' scored tokens
    never overlap) and ``n_blocks`` slots are drawn without replacement by ``seed``: stratified by document when
    ``doc_starts`` (n_docs + 1,) says where the documents start (``blocks.slots_by_document``), else uniformly
    over the stream (``blocks.uniform_slots``, the draw of runs that record no ``block_docs``). None, or more
    than there are: every slot, i.e. the whole split scored as one contiguous stream."""
    if doc_starts is None:
        starts = uniform_slots(len(tokens), block_length, n_blocks, seed)
    else:
        starts = slots_by_document(len(tokens), block_length, n_blocks, seed, doc_starts)
    idx = starts[:, None] + np.arange(block_length + 1)  # (K, N + 1)
    return torch.from_numpy(np.asarray(tokens[idx.ravel()], dtype=np.int64).reshape(idx.shape)), starts


@dataclass(frozen=True)
class Window:
    """One forward pass: inputs ``tokens[start:end]``, targets ``tokens[start+1:end+1]``; only the
    targets of ``tokens[score_from+1:end+1]`` are scored (``start <= score_from < end``)."""

    start: int
    end: int
    score_from: int

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def n_scored(self) -> int:
        return self.end - self.score_from


def window_plan(n_tokens: int, length: int, stride: int | None = None) -> list[Window]:
    """Windows over a span of ``n_tokens`` scored tokens.

    ``stride=None`` (or ``stride >= length``) is ``nonoverlap``: windows ``[kL, (k+1)L)``, the last one
    shorter if L does not divide N. Otherwise sliding: the first window ``[0, L)`` scores all L tokens;
    each next one scores the following S tokens with L - S tokens of context before them. The last
    window keeps exactly that context (``start = scored_from - (L - S)``) and may be shorter, so that
    S = L reproduces ``nonoverlap`` window for window. Every token in ``[0, n_tokens)`` is scored once.
    """
    if length < 1 or n_tokens < 1:
        raise ValueError(f"window_plan needs length >= 1 and n_tokens >= 1, got {length}, {n_tokens}")
    s = length if stride is None else min(int(stride), length)
    if s < 1:
        raise ValueError(f"eval.stride must be >= 1, got {stride}")
    plan: list[Window] = []
    scored_to = 0
    while scored_to < n_tokens:
        if scored_to == 0:
            start, end = 0, min(length, n_tokens)
        else:
            start = scored_to - (length - s)
            end = min(start + length, n_tokens)
        plan.append(Window(start, end, scored_to))
        scored_to = end
    return plan


# ---------------------------------------------------------------------------------------------
# result container


@dataclass
class ExtrapolationCell:
    """Summed NLL over the scored tokens at one (length, protocol), in total and per block."""

    length: int
    protocol: str
    stride: int
    nll_sum: float = 0.0
    n_tokens: int = 0
    note: str = ""
    block_nll: list[float] = field(default_factory=list)  # summed NLL of each block (each scores the same count)

    @property
    def nll(self) -> float:
        """Mean NLL per token in nats (NaN when not applicable)."""
        return self.nll_sum / self.n_tokens if self.n_tokens > 0 else float("nan")

    @property
    def ppl(self) -> float:
        return safe_exp(self.nll)

    def block_means(self) -> np.ndarray:
        """Mean NLL of each block (nats per token)."""
        k = len(self.block_nll)
        return np.asarray(self.block_nll, dtype=float) / (self.n_tokens / k) if k and self.n_tokens else np.array([])

    def interval(self) -> tuple[float, float]:
        """95% bootstrap interval of the perplexity over the blocks, as if they were independent (NaN with fewer
        than two blocks); ``ExtrapolationResult.interval`` clusters them by document when it can."""
        lo, hi = stats.mean_interval(self.block_means())
        return safe_exp(lo), safe_exp(hi)

    def relative_se(self) -> float:
        """Standard error of the perplexity relative to it (= that of the mean NLL, delta method), over blocks."""
        m = self.block_means()
        return float(m.std(ddof=1) / math.sqrt(m.size)) if m.size > 1 else float("nan")

    def bpb(self, bytes_per_token: float | None) -> float:
        """Bits per byte = mean NLL / ln 2 / (bytes per token)."""
        if not bytes_per_token:
            return float("nan")
        return self.nll / math.log(2) / bytes_per_token


@dataclass
class ExtrapolationResult:
    train_length: int
    lengths: list[int]
    protocols: tuple[str, ...]
    stride: int  # requested sliding stride (per length it is min(stride, L))
    n_tokens: int  # scored tokens per (length, protocol): blocks x block length
    bytes_per_token: float | None = None
    blocks: int = 1  # K, the bootstrap's unit
    split: str | None = None  # where the blocks come from (eval.split)
    seed: int | None = None  # eval.seed, which drew them
    cells: dict[tuple[int, str], ExtrapolationCell] = field(default_factory=dict)
    # Mean NLL by token position 0..L-1 over the nonoverlap windows at `loss_by_position_length`
    # (the longest length that could be evaluated; None if none could).
    loss_by_position: list[float] = field(default_factory=list)
    loss_by_position_length: int | None = None
    # An extended run (train.py extend.from=...): its parent's training length, the second axis the lengths
    # are given on (x_parent = length / parent_train_length), so parent and child curves share one axis.
    parent_train_length: int | None = None
    # The document of each block (blocks.block_documents), (K,): the intervals' resampling unit; None: a bare
    # stream, the intervals resample blocks. The split's document count, to say how many the blocks cover.
    block_docs: list[int] | None = None
    split_documents: int | None = None

    def x_parent(self, length: int) -> float | None:
        return length / self.parent_train_length if self.parent_train_length else None

    def cell(self, length: int, protocol: str = "nonoverlap") -> ExtrapolationCell:
        return self.cells[(length, protocol)]

    def ppl(self, length: int, protocol: str = "nonoverlap") -> float:
        c = self.cells.get((length, protocol))
        return c.ppl if c is not None else float("nan")

    def ppl_ratio(self, length: int) -> float:
        """ppl@L / ppl@train_length, both nonoverlap (NaN if either is missing)."""
        base = self.ppl(self.train_length, "nonoverlap")
        val = self.ppl(length, "nonoverlap")
        if math.isnan(base) or math.isnan(val):
            return float("nan")
        if math.isinf(base):
            return float("nan") if math.isinf(val) else 0.0
        return val / base if base > 0 else float("nan")

    def clustered(self, length: int, protocol: str = "nonoverlap",
                  ratio: bool = False) -> stats.ClusteredInterval | None:
        """The perplexity at (length, protocol), or with ``ratio`` ppl@L / ppl@train_length (nonoverlap), with
        its interval over the blocks' documents (``stats.clustered_ppl_interval``); None without document ids or
        without the cells."""
        cell = self.cells.get((length, protocol))
        base = self.cells.get((self.train_length, "nonoverlap")) if ratio else None
        if self.block_docs is None or cell is None or not cell.n_tokens:
            return None
        if ratio and (base is None or not base.n_tokens):
            return None
        per_block = cell.n_tokens // len(cell.block_nll)  # every block scores the same count
        return stats.clustered_ppl_interval(cell.block_nll, per_block, self.block_docs,
                                            base_nll=base.block_nll if ratio else None)

    def interval(self, length: int, protocol: str = "nonoverlap") -> tuple[float, float]:
        """95% interval of the perplexity at (length, protocol): clustered by document when the blocks' documents
        are known, else the blocks' own bootstrap (``ExtrapolationCell.interval``)."""
        c = self.clustered(length, protocol)
        return (c.lo, c.hi) if c is not None else self.cells[(length, protocol)].interval()

    def ratio_interval(self, length: int) -> tuple[float, float]:
        """95% interval of ppl@L / ppl@train_length: both recomputed from the same resampled documents (or, with
        no document ids, a bootstrap of the blocks' paired NLL differences); none at the training length itself,
        where the ratio is 1 by definition."""
        if length == self.train_length:
            return float("nan"), float("nan")
        a, b = self.cells.get((length, "nonoverlap")), self.cells.get((self.train_length, "nonoverlap"))
        if a is None or b is None or not a.n_tokens or not b.n_tokens:
            return float("nan"), float("nan")
        c = self.clustered(length, ratio=True)
        if c is not None:
            return c.lo, c.hi
        lo, hi = stats.mean_interval(a.block_means() - b.block_means())
        return safe_exp(lo), safe_exp(hi)

    def interval_label(self) -> str:
        """How the intervals were made (summary.json ``evaluation.extrapolation.interval``)."""
        if self.block_docs is None:
            return "95% percentile bootstrap over blocks"
        return stats.cluster_label(len(set(self.block_docs)))

    def design_effects(self) -> dict[str, float]:
        """{"protocol@L": design effect} of every scored cell and {"ratio@L": ...} of every ratio past the training
        length (``stats.design_effect``); empty without document ids."""
        out = {}
        for (L, p) in self.cells:
            c = self.clustered(L, p)
            if c is not None:
                out[f"{p}@{L}"] = c.design_effect
            r = self.clustered(L, ratio=True) if p == "nonoverlap" and L != self.train_length else None
            if r is not None:
                out[f"ratio@{L}"] = r.design_effect
        return out

    def ppl_by_length(self, protocol: str = "nonoverlap") -> dict[int, float]:
        """{length: ppl} for plots (``plots.plot_ppl_vs_length``)."""
        return {L: self.ppl(L, protocol) for L in self.lengths if (L, protocol) in self.cells}

    def metrics(self) -> dict[str, float]:
        """Dashboard scalars: ``extrap/ppl@{L}`` (nonoverlap) with ``extrap/ppl_lo@{L}`` / ``_hi`` (its 95%
        interval), ``extrap/ppl_sliding@{L}`` (+ ``_lo`` / ``_hi``), ``extrap/bpb@{L}`` (nonoverlap; only when
        bytes_per_token is known), ``extrap/ppl_ratio@{L}`` (+ ``_lo`` / ``_hi``). Not-applicable lengths
        give NaN; a diverged model gives inf."""
        m: dict[str, float] = {}
        for L in self.lengths:
            if (L, "nonoverlap") in self.cells:
                c = self.cells[(L, "nonoverlap")]
                m[metric_key("extrap/ppl", L)] = c.ppl
                m[metric_key("extrap/ppl", L, "lo")], m[metric_key("extrap/ppl", L, "hi")] = self.interval(L)
                if self.bytes_per_token:
                    m[metric_key("extrap/bpb", L)] = c.bpb(self.bytes_per_token)
                m[metric_key("extrap/ppl_ratio", L)] = self.ppl_ratio(L)
                m[metric_key("extrap/ppl_ratio", L, "lo")], m[metric_key("extrap/ppl_ratio", L, "hi")] = (
                    self.ratio_interval(L))
            if (L, "sliding") in self.cells:
                c = self.cells[(L, "sliding")]
                m[metric_key("extrap/ppl_sliding", L)] = c.ppl
                m[metric_key("extrap/ppl_sliding", L, "lo")], m[metric_key("extrap/ppl_sliding", L, "hi")] = (
                    self.interval(L, "sliding"))
            if self.parent_train_length and (L, "nonoverlap") in self.cells:  # e.g. extrap/ppl@parent_x4
                m[metric_key("extrap/ppl", parent_x=self.x_parent(L))] = self.cells[(L, "nonoverlap")].ppl
        return m

    def rows(self) -> list[dict[str, Any]]:
        """One row per (length, protocol) for a W&B table: length, protocol, ppl with its 95% interval
        (ppl_lo, ppl_hi) and relative standard error (se; times the square root of the design effect when the
        blocks are clustered by document), bpb, nll, n_tokens, note (NaN where not applicable)."""
        out = []
        for L in self.lengths:
            for p in self.protocols:
                c = self.cells.get((L, p))
                if c is None:
                    continue
                lo, hi = self.interval(L, p)
                clustered = self.clustered(L, p)
                deff = clustered.design_effect if clustered is not None else 1.0
                out.append(
                    {
                        "length": L,
                        **({"x_parent": self.x_parent(L)} if self.parent_train_length else {}),
                        "protocol": p,
                        "ppl": c.ppl,
                        "ppl_lo": lo,
                        "ppl_hi": hi,
                        "se": c.relative_se() * math.sqrt(deff),  # standard error relative to ppl
                        "bpb": c.bpb(self.bytes_per_token),
                        "nll": c.nll,
                        "n_tokens": c.n_tokens,
                        "note": c.note,
                    }
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary; non-finite floats are the strings "nan" / "inf" (see json_safe)."""
        return json_safe(
            {
                "train_length": self.train_length,
                "parent_train_length": self.parent_train_length,
                "lengths": list(self.lengths),
                "protocols": list(self.protocols),
                "stride": self.stride,
                "n_tokens": self.n_tokens,
                "blocks": self.blocks,
                "split": self.split,
                "seed": self.seed,
                "interval": self.interval_label(),
                # the document of each block (the intervals' unit), how many the blocks cover of the split's,
                # and each cell's design effect (variance clustered by document / as if blocks were independent)
                "block_docs": self.block_docs,
                "n_documents": len(set(self.block_docs)) if self.block_docs is not None else None,
                "split_documents": self.split_documents,
                "design_effect": self.design_effects(),
                "bytes_per_token": self.bytes_per_token,
                "metrics": self.metrics(),
                "rows": self.rows(),
                # per-block NLL sums of every cell: runs evaluated on the same blocks (eval.seed) pair block by block
                "block_nll": {f"{p}@{L}": c.block_nll for (L, p), c in self.cells.items() if c.block_nll},
                "loss_by_position_length": self.loss_by_position_length,
                "loss_by_position": list(self.loss_by_position),
            }
        )


# ---------------------------------------------------------------------------------------------
# the evaluation


def _batches(items: list[tuple[int, Window]], per_batch: int) -> Iterator[list[tuple[int, Window]]]:
    """Consecutive (block, window) items of equal window shape (length and scored count) grouped into batches."""
    batch: list[tuple[int, Window]] = []
    for item in items:
        w, first = item[1], batch[0][1] if batch else None
        if batch and (len(batch) >= per_batch or (w.length, w.n_scored) != (first.length, first.n_scored)):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def score_windows(
    model: nn.Module,
    blocks: torch.Tensor,
    plan: list[Window],
    per_batch: int,
    position_sums: torch.Tensor | None = None,
    position_counts: torch.Tensor | None = None,
) -> tuple[list[float], int]:
    """Summed NLL of each block (float64) and the count per block over the scored targets of ``plan``, the
    same windows in every block of ``blocks`` (K, N + 1). Optionally accumulates the per-position NLL of every
    window into ``position_sums/counts`` (indexed by position in window). Call under ``evaluating(model)``."""
    sums = [0.0] * blocks.shape[0]
    items = [(k, w) for w in plan for k in range(blocks.shape[0])]  # window-major: same shapes are adjacent
    for batch in _batches(items, per_batch):
        T, n_s = batch[0][1].length, batch[0][1].n_scored
        idx = torch.stack([blocks[k, w.start : w.end] for k, w in batch])  # (B, T)
        tgt = torch.stack([blocks[k, w.start + 1 : w.end + 1] for k, w in batch])  # (B, T)
        logits = stoppable_forward(model, idx)  # (B, T, V), positions 0..T-1
        for b, (k, _) in enumerate(batch):  # one window at a time: the log-softmax temporary stays (T, V)
            if position_sums is not None:
                nll = F.cross_entropy(logits[b].float(), tgt[b], reduction="none")  # (T,)
                position_sums[:T] += nll.double()
                position_counts[:T] += 1
                sums[k] += float(nll[T - n_s :].double().sum())
            else:
                # only the scored suffix is needed; fp32 log-softmax inside cross_entropy
                sums[k] += float(F.cross_entropy(logits[b, T - n_s :].float(), tgt[b, T - n_s :], reduction="sum"))
        del logits
    return sums, sum(w.n_scored for w in plan)


def evaluate_extrapolation(
    model: nn.Module,
    tokens: torch.Tensor,
    lengths: Sequence[int],
    train_length: int,
    stride: int | None = None,
    batch_size: int = 64,
    device: torch.device | str | None = None,
    bytes_per_token: float | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    batch_tokens: int | None = 16384,
) -> ExtrapolationResult:
    """Perplexity at each length (absolute token counts; see ``resolve_lengths``) on the same blocks.

    ``tokens``: LongTensor (K, N + 1) -- K blocks of N scored targets (``spread_blocks``), or (N + 1,), one
    block. The training length is always evaluated too (``ppl_ratio`` needs it). ``stride``: sliding stride,
    default the training length (clamped to L for L < stride, which makes sliding = nonoverlap there).
    ``batch_size`` windows per forward at most, and at most ``batch_tokens // L`` (memory bound).
    Runs under ``evaluating(model)`` (eval mode, no grad; the previous mode restored).
    """
    protocols = tuple(protocols)
    for p in protocols:
        if p not in PROTOCOLS:
            raise ValueError(f"unknown eval.protocols entry {p!r}; known: {list(PROTOCOLS)}")
    blocks = torch.as_tensor(tokens).long()
    blocks = blocks[None] if blocks.dim() == 1 else blocks  # (K, N + 1)
    n = blocks.shape[1] - 1
    if n < 1 or blocks.dim() != 2:
        raise ValueError("evaluate_extrapolation needs (N + 1,) or (K, N + 1) tokens with N >= 1")
    stride = int(stride) if stride is not None else int(train_length)
    if stride < 1:
        raise ValueError(f"eval.stride must be >= 1, got {stride}")
    lens = sorted({int(L) for L in lengths} | {int(train_length)})
    if lens[0] < 1:
        raise ValueError(f"eval lengths must be >= 1, got {lens}")

    device = torch.device(device) if device is not None else model_device(model)
    blocks = blocks.to(device)
    result = ExtrapolationResult(
        train_length=int(train_length),
        lengths=lens,
        protocols=protocols,
        stride=stride,
        n_tokens=n * blocks.shape[0],
        bytes_per_token=bytes_per_token,
        blocks=int(blocks.shape[0]),
    )

    plans = {(L, p): window_plan(n, L, None if p == "nonoverlap" else min(stride, L)) for L in lens for p in protocols}
    parts = [(len(plan) * blocks.shape[0], L) for (L, _), plan in plans.items()]  # (windows, length)
    with evaluating(model), progress.opened("extrapolation", "windows", parts, model):
        for L in lens:
            per_batch = windows_per_batch(L, batch_size, batch_tokens)
            note = ""
            for p in protocols:
                s = min(stride, L) if p == "sliding" else L
                cell = ExtrapolationCell(length=L, protocol=p, stride=s)
                result.cells[(L, p)] = cell
                if note:  # this length already failed for another protocol
                    cell.note = note
                    progress.advance(len(plans[(L, p)]) * blocks.shape[0], L)  # skipped
                    continue
                # the longest length's nonoverlap windows also give the loss by position
                track = p == "nonoverlap"
                sums = torch.zeros(L, dtype=torch.float64, device=device) if track else None
                counts = torch.zeros(L, dtype=torch.float64, device=device) if track else None
                try:
                    block_nll, per_block = score_windows(model, blocks, plans[(L, p)], per_batch, sums, counts)
                except PositionOutOfRange as exc:
                    note = not_applicable_note(exc)
                    cell.note = note
                    progress.advance(len(plans[(L, p)]) * blocks.shape[0], L)  # skipped
                    continue
                cell.block_nll, cell.n_tokens = block_nll, per_block * len(block_nll)
                cell.nll_sum = math.fsum(block_nll) if len(block_nll) > 1 else block_nll[0]
                if track and (
                    result.loss_by_position_length is None or L > result.loss_by_position_length
                ):
                    result.loss_by_position = (
                        (sums / counts.clamp_min(1))
                        .where(counts > 0, torch.full_like(sums, float("nan")))
                        .tolist()
                    )
                    result.loss_by_position_length = L
    return result
