"""Lost-in-the-middle probes: kv retrieval and passkey accuracy by depth x context length.

Scoring is teacher-forced on prompt + answer (one forward per sample, positions 0..L-1):

* **exact match** = the argmax at every answer position equals the gold answer token. This is the
  same as greedy decoding of ``len(answer)`` tokens: if greedy decoding reproduces the answer, each
  step sees exactly the gold prefix, so the teacher-forced argmaxes are the greedy choices, and the
  first wrong argmax is where greedy decoding would leave the answer. (Ties resolve like argmax.)
* **logprob** = mean over answer tokens of ``log_softmax`` (fp32) at the gold token; informative
  even when accuracy sits at chance.

Chance level per cell: ``1 / answer_space`` -- a uniform guess over the answer space of the probe
(kv: hex values of ``value_len`` chars in the probe space, ~16**value_len / 2; passkey: the 5-digit
numbers of the probe space, 45,000). For kv we also report ``chance_copy`` = mean of 1 / n_pairs, the
accuracy of a model that copies a random value from the context (the meaningful floor for retrieval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pelab.data.recall import KINDS, RecallLengthError, RecallSample, as_id_list, make_probe_samples
from pelab.evaluation.extrapolation import (
    is_position_out_of_range,
    json_safe,
    model_device,
    not_applicable_note,
    windows_per_batch,
)

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


# ---------------------------------------------------------------------------------------------
# scoring


def score_samples(
    model: nn.Module,
    samples: Sequence[RecallSample],
    device: torch.device | str | None = None,
    batch_size: int = 16,
    batch_tokens: int | None = 16384,
) -> list[tuple[bool, float]]:
    """(greedy exact match, mean gold log-prob) per sample, in input order.

    Samples of equal total length are batched (at most ``batch_size`` and ``batch_tokens // length``
    per forward). Raises ``PositionOutOfRange`` from the model unchanged (``run_probes`` catches it).
    Runs under ``torch.no_grad()`` with ``model.eval()`` (previous mode restored).
    """
    device = torch.device(device) if device is not None else model_device(model)
    out: list[tuple[bool, float] | None] = [None] * len(samples)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        if not s.answer_ids:
            raise ValueError(f"sample {i} has no answer tokens")
        by_len.setdefault(len(s.input_ids) + len(s.answer_ids), []).append(i)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for T, idxs in by_len.items():
                per_batch = windows_per_batch(T, batch_size, batch_tokens)
                for b0 in range(0, len(idxs), per_batch):
                    chunk = idxs[b0 : b0 + per_batch]
                    x = torch.tensor(
                        [samples[i].input_ids + samples[i].answer_ids for i in chunk],
                        dtype=torch.long,
                        device=device,
                    )  # (B, T)
                    logits = model(x)  # (B, T, V)
                    for row, i in enumerate(chunk):
                        s = samples[i]
                        p0, a = len(s.input_ids) - 1, len(s.answer_ids)  # logits at p0 + j predict answer j
                        lg = logits[row, p0 : p0 + a].float()  # (A, V)
                        gold = torch.tensor(s.answer_ids, dtype=torch.long, device=lg.device)  # (A,)
                        logp = F.log_softmax(lg, dim=-1).gather(1, gold[:, None]).squeeze(1)  # (A,)
                        correct = bool((lg.argmax(-1) == gold).all())
                        out[i] = (correct, float(logp.double().mean()))
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


def lim_gap(depths: Sequence[float], accs: Sequence[float]) -> float:
    """Mean accuracy at the two edge depths (min and max) minus the mean at the interior depths.
    Positive = lost in the middle. NaN with fewer than 3 distinct depths or any NaN accuracy."""
    pairs = sorted(zip((float(d) for d in depths), (float(a) for a in accs)))
    if len({d for d, _ in pairs}) < 3 or any(math.isnan(a) for _, a in pairs):
        return float("nan")
    lo, hi = pairs[0][0], pairs[-1][0]
    edges = [a for d, a in pairs if d in (lo, hi)]
    middle = [a for d, a in pairs if d not in (lo, hi)]
    return sum(edges) / len(edges) - sum(middle) / len(middle)


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class ProbeCell:
    kind: str
    depth: float
    length: int
    acc: float = float("nan")
    logprob: float = float("nan")
    n: int = 0
    chance: float = float("nan")
    chance_copy: float = float("nan")  # kv only: 1 / n_pairs averaged
    note: str = ""


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs and not any(math.isnan(x) for x in xs) else float("nan")


@dataclass
class ProbeResult:
    kinds: list[str]
    depths: list[float]
    lengths: list[int]
    train_len: int | None = None
    cells: dict[tuple[str, float, int], ProbeCell] = field(default_factory=dict)

    def cell(self, kind: str, depth: float, length: int) -> ProbeCell:
        return self.cells[(kind, float(depth), int(length))]

    def grid(self, kind: str, metric: str = "acc") -> list[list[float]]:
        """``metric`` of ``kind`` as rows = depths, columns = lengths (for ``plots.plot_probe_heatmap``)."""
        return [[getattr(self.cell(kind, d, L), metric) for L in self.lengths] for d in self.depths]

    def depth_curve(self, kind: str, length: int, metric: str = "acc") -> list[float]:
        """``metric`` by depth at one length (the U-curve; ``plots.plot_depth_curve``)."""
        return [getattr(self.cell(kind, d, length), metric) for d in self.depths]

    def chance(self, kind: str) -> float:
        vals = [c.chance for c in self.cells.values() if c.kind == kind and not math.isnan(c.chance)]
        return _mean(vals) if vals else float("nan")

    def metrics(self) -> dict[str, float]:
        """``probe/{kind}/acc@{L}`` and ``logprob@{L}`` (means over depths) and ``lim_gap@{L}``."""
        m: dict[str, float] = {}
        for k in self.kinds:
            for L in self.lengths:
                accs = self.depth_curve(k, L, "acc")
                m[f"probe/{k}/acc@{L}"] = _mean(accs)
                m[f"probe/{k}/logprob@{L}"] = _mean(self.depth_curve(k, L, "logprob"))
                m[f"probe/{k}/lim_gap@{L}"] = lim_gap(self.depths, accs)
        return m

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        """W&B table rows: kind, depth, length, acc, logprob, n, chance, note (one kind if given)."""
        return [
            {
                "kind": c.kind,
                "depth": c.depth,
                "length": c.length,
                "acc": c.acc,
                "logprob": c.logprob,
                "n": c.n,
                "chance": c.chance,
                "note": c.note,
            }
            for (k, d, L), c in sorted(self.cells.items())
            if kind is None or k == kind
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable; non-finite floats become "nan" / "inf" strings (see extrapolation.json_safe)."""
        return json_safe(
            {
                "kinds": list(self.kinds),
                "depths": list(self.depths),
                "lengths": list(self.lengths),
                "train_len": self.train_len,
                "metrics": self.metrics(),
                "chance": {k: self.chance(k) for k in self.kinds},
                "grids": {
                    k: {"acc": self.grid(k, "acc"), "logprob": self.grid(k, "logprob")} for k in self.kinds
                },
                "rows": self.rows(),
            }
        )


# ---------------------------------------------------------------------------------------------
# the probe run


def run_probes(
    model: nn.Module,
    tokenizer: Any,
    kinds: Sequence[str] = KINDS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    lengths: Sequence[int] = (256,),
    samples_per_cell: int = 8,
    seed: int = 1234,
    filler_ids: Sequence[int] | None = None,
    device: torch.device | str | None = None,
    batch_size: int = 16,
    batch_tokens: int | None = 16384,
    train_len: int | None = None,
    key_len: int = 3,
    value_len: int = 3,
) -> ProbeResult:
    """Accuracy / log-prob per (kind, depth, length) cell on seeded samples (see ``make_probe_samples``).

    ``lengths`` are absolute token counts (``extrapolation.resolve_lengths`` converts multiples).
    A length the model cannot represent (``PositionOutOfRange``) or that is too short for a kind gives
    NaN cells with a note; nothing raises for those.
    """
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"unknown probes.kinds entry {k!r}; known: {list(KINDS)}")
    filler_ids = as_id_list(filler_ids)  # once, not per cell
    depths_f = sorted({float(d) for d in depths})
    lens = sorted({int(L) for L in lengths})
    res = ProbeResult(kinds=list(kinds), depths=depths_f, lengths=lens, train_len=train_len)
    for kind in kinds:
        for L in lens:
            cells = {d: ProbeCell(kind=kind, depth=d, length=L) for d in depths_f}
            for d, c in cells.items():
                res.cells[(kind, d, L)] = c
            try:
                per_depth = {
                    d: make_probe_samples(
                        kind,
                        tokenizer,
                        L,
                        d,
                        samples_per_cell,
                        seed,
                        filler_ids=filler_ids,
                        key_len=key_len,
                        value_len=value_len,
                    )
                    for d in depths_f
                }
            except RecallLengthError as exc:
                for c in cells.values():
                    c.note = f"n/a — {exc}"
                continue
            flat = [s for d in depths_f for s in per_depth[d]]
            try:
                scores = score_samples(
                    model, flat, device=device, batch_size=batch_size, batch_tokens=batch_tokens
                )
            except ValueError as exc:
                if not is_position_out_of_range(exc):
                    raise
                for c in cells.values():
                    c.note = not_applicable_note(exc)
                continue
            i = 0
            for d in depths_f:
                ss, sc = per_depth[d], scores[i : i + len(per_depth[d])]
                i += len(ss)
                c = cells[d]
                c.n = len(ss)
                if c.n:
                    c.acc = sum(ok for ok, _ in sc) / c.n
                    c.logprob = sum(lp for _, lp in sc) / c.n
                    c.chance = sum(1.0 / s.answer_space for s in ss) / c.n
                    if kind == "kv":
                        c.chance_copy = sum(1.0 / s.n_items for s in ss) / c.n
    return res
