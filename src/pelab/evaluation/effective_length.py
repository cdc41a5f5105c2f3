"""The effective context length of a probe kind: one number per model, as RULER reports it (Hsieh et al. 2024,
section 4: "the maximum length at which the model's performance exceeds a threshold", the threshold being
Llama-2-7B's score at 4K, 85.6%), made statistical and relative to what the model learned in-window.

Rule (issue 56): the largest evaluated length l such that at **every** evaluated length <= l the Wilson lower bound is
>= max(``floor``, ``fraction`` x the in-window accuracy). Here

* the in-window accuracy is the kind's mean accuracy over depths at the training length (at the longest evaluated
  length below it when the training length itself was not probed);
* the Wilson lower bound at a length is the 95% Wilson lower bound (``stats.wilson``) of its accuracy, the mean over
  depths, with n = the number of instances, not instances x depths: the depths of one length share their instances
  (the paired design), and an instance's mean outcome over the depths varies no more than one Bernoulli outcome, so
  this bound is conservative (k = the mean number right over the depths, rounded down);
* n/a when even the shortest evaluated length fails: the kind was never acquired in-window. In the metrics that is 0
  (as ``probe/<kind>/effective_length``'s "none": a logged number, where W&B drops a NaN), and NaN is kept for "not
  measured" (no in-window accuracy: every cell n/a, or no length up to the training length probed).

Defaults (``probes.effective_length``): floor 0.5, fraction 0.9. Deviations from RULER: a per-model relative threshold
with a floor instead of one absolute score; the lower bound of an interval instead of the point accuracy; every
shorter length must pass too (RULER takes the largest passing length). Over seeds the statistic lives on the grid of
evaluated lengths, so it gets the median (the lower median with an even number of seeds) and the range, never a t
interval (`over_seeds`). Torch-free: the report reads it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pelab.summary import json_safe

if TYPE_CHECKING:
    from pelab.evaluation.probes import ProbeResult

NAN = float("nan")


@dataclass
class EffectiveLengthRule:
    """``floor``: the least lower bound any length must reach; ``fraction``: of the in-window accuracy."""

    floor: float = 0.5
    fraction: float = 0.9

    def threshold(self, in_window: float) -> float:
        """max(floor, fraction x in-window accuracy); NaN when the in-window accuracy is unknown."""
        return max(self.floor, self.fraction * in_window) if math.isfinite(in_window) else NAN


def effective_length(lengths: Sequence[int], lower: Sequence[float], threshold: float) -> int | None:
    """The largest of ``lengths`` such that ``lower`` (the lower bound at each length) is >= ``threshold`` at it and
    at every shorter length; None when the shortest already fails (or the threshold is NaN). A NaN bound (a length
    not measured) fails."""
    if not math.isfinite(threshold):
        return None
    best = None
    for L, lo in sorted(zip((int(x) for x in lengths), (float(x) for x in lower), strict=True)):
        if not (math.isfinite(lo) and lo >= threshold):
            break
        best = L
    return best


def length_lower_bound(accuracy: float, n: int) -> float:
    """The 95% Wilson lower bound of a length's accuracy (mean over depths) over its ``n`` instances (see the module
    doc); NaN when not measured."""
    # imported here: the config layer imports this module, and scipy.stats costs 0.8 s at every train.py start
    from pelab.evaluation.stats import wilson

    if not (n > 0 and math.isfinite(accuracy)):
        return NAN
    return wilson(math.floor(accuracy * n + 1e-9), n)[0]


def in_window_length(lengths: Sequence[int], train_length: int | None) -> int | None:
    """The training length if evaluated, else the longest evaluated length below it (None: none is)."""
    below = [int(L) for L in lengths if train_length is not None and int(L) <= train_length]
    return max(below) if below else None


def kind_effective_length(result: ProbeResult, kind: str, rule: EffectiveLengthRule) -> dict[str, float]:
    """The rule on one kind of a probe run: ``length`` (0 = not acquired, NaN = not measured), ``threshold``,
    ``in_window`` (accuracy), ``in_window_length`` (NaN when none) and ``lower`` (the lower bound per evaluated
    length, ascending)."""
    L_w = in_window_length(result.lengths, result.train_length or min(result.lengths))
    curve = dict(zip(result.lengths, result.length_curve(kind), strict=True))
    acc = curve[L_w] if L_w is not None else NAN
    lower = [length_lower_bound(a, min((result.cell(kind, d, L).n for d in result.depths), default=0))
             for L, a in curve.items()]
    threshold = rule.threshold(acc)
    eff = effective_length(result.lengths, lower, threshold)
    length = float(eff) if eff is not None else (0.0 if math.isfinite(threshold) else NAN)
    return {"length": length, "threshold": threshold, "in_window": acc,
            "in_window_length": NAN if L_w is None else float(L_w), "lower": lower}


def effective_length_metrics(result: ProbeResult, rule: EffectiveLengthRule) -> dict[str, float]:
    """Per grid kind ``probe/{kind}/eff_length`` (0 = not acquired in-window, NaN = not measured) and
    ``probe/{kind}/eff_threshold`` (the threshold its lower bounds had to reach; NaN without an in-window accuracy)."""
    m: dict[str, float] = {}
    for kind in result.kinds:
        e = kind_effective_length(result, kind, rule)
        m[f"probe/{kind}/eff_length"] = e["length"]
        m[f"probe/{kind}/eff_threshold"] = e["threshold"]
    return m


def effective_length_record(result: ProbeResult, rule: EffectiveLengthRule) -> dict:
    """summary.json's ``evaluation.probes.eff_length``: the rule and, per grid kind, what `kind_effective_length`
    found (non-finite numbers as "nan")."""
    return json_safe({"floor": rule.floor, "fraction": rule.fraction, "lengths": list(result.lengths),
                      "kinds": {k: kind_effective_length(result, k, rule) for k in result.kinds}})


def acquired(value: float) -> bool:
    """Whether a recorded effective length is a length (not 0 = not acquired, not NaN = not measured)."""
    return math.isfinite(value) and value > 0


def over_seeds(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, smallest, largest) of per-seed effective lengths, n/a (0 or NaN) ranked below every length: the lower
    median with an even count (a length that was evaluated, not a midpoint), n/a where one falls there. (nan, nan,
    nan) without values."""
    if not len(values):
        return NAN, NAN, NAN
    ranked = sorted((float(v) for v in values), key=lambda v: v if acquired(v) else -math.inf)
    return ranked[(len(ranked) - 1) // 2], ranked[0], ranked[-1]


def describe(values: Sequence[float]) -> str:
    """Per-seed effective lengths as a table cell: one seed "256" / "n/a"; several "256 [128, 512] (3 seeds)", the
    median and the range."""
    def show(v: float) -> str:
        return str(int(v)) if acquired(v) else "n/a"

    if not len(values):
        return "—"
    median, lo, hi = over_seeds(values)
    if len(values) == 1:
        return show(median)
    return f"{show(median)} [{show(lo)}, {show(hi)}] ({len(values)} seeds)"
