"""The effective length (pelab.evaluation.effective_length) on hand-worked cases: the largest probed length l such
that at every probed length <= l the 95% Wilson lower bound of the accuracy (mean over depths, n = the instances) is
>= max(floor, fraction x in-window accuracy); n/a when never acquired; over seeds the median and range. The Wilson
bounds quoted are worked by hand from the score interval's formula (Wilson 1927):
(p + z^2/2n - z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = 1.959964."""

from __future__ import annotations

import math

import pytest

from pelab.data.recall import RecallSample
from pelab.evaluation.effective_length import (
    EffectiveLengthRule,
    describe,
    effective_length,
    effective_length_metrics,
    kind_effective_length,
    over_seeds,
)
from pelab.evaluation.probes import ProbeCell, ProbeRecord, ProbeResult

NAN = float("nan")
Z = 1.959963984540054


def wilson_lower(k: int, n: int) -> float:
    p = k / n
    return (p + Z * Z / (2 * n) - Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))) / (1 + Z * Z / n)


def result(correct: dict[int, list[int]], n: int = 100, train_length: int = 128) -> ProbeResult:
    """A probe run of one kind: ``correct[L]`` = instances right (of n) at each of the depths, cells filled the way
    the probes fill them."""
    lengths = sorted(correct)
    depths = [0.0, 0.5, 1.0][: len(next(iter(correct.values())))]
    res = ProbeResult(kinds=["k"], depths=depths, lengths=lengths, train_length=train_length)
    for L, ks in correct.items():
        for d, k in zip(depths, ks, strict=True):
            cell = res.cells[("k", d, L)] = ProbeCell("k", d, L)
            if k is None:  # a length the model cannot represent: no instances, a note
                cell.note = "n/a"
                continue
            samples = [RecallSample([1], [2], 0, d, L, "k", 2, 10) for _ in range(n)]
            cell.fill(samples, [ProbeRecord(i < k, 0.0, 1, 2, "ok") for i in range(n)])
    return res


def test_the_hand_worked_wilson_bounds():
    assert wilson_lower(99, 100) == pytest.approx(0.94551, abs=1e-4)
    assert wilson_lower(96, 100) == pytest.approx(0.90163, abs=1e-4)
    assert wilson_lower(94, 100) == pytest.approx(0.87523, abs=1e-4)
    assert wilson_lower(282, 300) == pytest.approx(0.90716, abs=1e-4)
    assert wilson_lower(60, 100) == pytest.approx(0.50200, abs=1e-4)


def test_a_length_that_fails_ends_the_effective_length_and_the_depths_share_their_instances():
    # 128: 100, 99, 98 of 100 -> in-window 0.99, threshold max(0.5, 0.9 x 0.99) = 0.891; bound of 99/100: 0.946 passes.
    # 256: 97, 95, 96 -> 96/100: 0.902 passes. 384: 95, 93, 94 -> 94/100: 0.875 fails, where the 282 of 300 outcomes
    # counted as independent would give 0.907 and pass: the depths share their 100 instances. 512 passes: too late.
    res = result({128: [100, 99, 98], 256: [97, 95, 96], 384: [95, 93, 94], 512: [100, 100, 100]})
    e = kind_effective_length(res, "k", EffectiveLengthRule())
    assert e["in_window"] == pytest.approx(0.99) and e["threshold"] == pytest.approx(0.891)
    assert e["lower"][:3] == pytest.approx([wilson_lower(99, 100), wilson_lower(96, 100), wilson_lower(94, 100)])
    assert e["length"] == 256
    # 256 at 97/100: bound 0.915 passes; 512 at 100/100: bound n / (n + z^2) = 0.963; 1024 at 0.5 fails
    res = result({128: [100, 99, 98], 256: [97, 97, 97], 512: [100, 100, 100], 1024: [50, 50, 50]})
    assert kind_effective_length(res, "k", EffectiveLengthRule())["length"] == 512
    m = effective_length_metrics(res, EffectiveLengthRule())
    assert m == {"probe/k/eff_length": 512.0, "probe/k/eff_threshold": pytest.approx(0.891)}


def test_never_acquired_in_window_is_na_and_the_floor_binds_below_it():
    # in-window 0.35: threshold the floor 0.5, not 0.9 x 0.35; the bounds (about 0.26) never reach it
    e = kind_effective_length(result({128: [30, 40, 35], 256: [99, 99, 99]}), "k", EffectiveLengthRule())
    assert e["threshold"] == 0.5 and e["length"] == 0  # 0: not acquired (NaN is kept for "not measured")
    # in-window 0.6: 0.9 x 0.6 = 0.54 > floor; bound 0.502 < 0.54 fails; with fraction 0.8, 0.48 < floor 0.5 and
    # 0.502 >= 0.5 passes
    res = result({128: [60, 60, 60], 256: [60, 60, 60]})
    assert kind_effective_length(res, "k", EffectiveLengthRule(0.5, 0.9))["length"] == 0
    assert kind_effective_length(res, "k", EffectiveLengthRule(0.5, 0.8))["length"] == 256


def test_an_unmeasured_length_fails_and_the_in_window_length_is_the_longest_up_to_training():
    # 256 not representable (n/a cells): the effective length stops at 128
    res = result({128: [100, 100, 100], 256: [None, None, None], 512: [100, 100, 100]})
    assert kind_effective_length(res, "k", EffectiveLengthRule())["length"] == 128
    # training length 128 not probed: in-window = 64's accuracy (0.9), threshold 0.81; bound at 90/100 0.826 passes
    e = kind_effective_length(result({64: [90, 90, 90], 256: [100, 100, 100]}), "k", EffectiveLengthRule())
    assert e["in_window_length"] == 64 and e["threshold"] == pytest.approx(0.81)
    assert e["lower"][0] == pytest.approx(0.82565, abs=1e-4) == wilson_lower(90, 100) and e["length"] == 256
    e = kind_effective_length(result({256: [100, 100, 100]}), "k", EffectiveLengthRule())
    assert math.isnan(e["in_window"]) and math.isnan(e["length"])  # nothing probed in-window: not measured


def test_the_rule_itself_on_plain_numbers():
    assert effective_length([128, 256, 512, 1024], [0.95, 0.90, 0.80, 0.95], 0.85) == 256
    assert effective_length([1024, 128, 256], [0.95, 0.95, 0.95], 0.85) == 1024  # any order
    assert effective_length([128, 256], [0.84, 0.95], 0.85) is None
    assert effective_length([128, 256], [0.95, NAN], 0.85) == 128
    assert effective_length([128], [0.95], NAN) is None


def test_over_seeds_the_median_and_range_of_a_grid_statistic():
    assert over_seeds([512, 256, 1024]) == (512, 256, 1024)
    assert over_seeds([256, 512]) == (256, 256, 512)  # the lower median: an evaluated length, not 384
    med, lo, hi = over_seeds([256, NAN, 512])  # n/a ranks below every length
    assert (med, hi) == (256, 512) and math.isnan(lo)
    assert math.isnan(over_seeds([NAN, NAN, 128])[0]) and over_seeds([0, 0, 128])[0] == 0
    assert over_seeds([0, 512, 256]) == (256, 0, 512)
    assert describe([256, NAN, 512]) == "256 [n/a, 512] (3 seeds)"
    assert describe([NAN]) == "n/a" == describe([0]) and describe([]) == "—"
    assert describe([0, 256]) == "n/a [n/a, 256] (2 seeds)"
