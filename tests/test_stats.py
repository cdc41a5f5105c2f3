"""The statistics (scipy.stats underneath) at hand-computed points: Wilson intervals, the bootstrap interval of a
mean, the paired lim_gap interval, effective length, AUC over log-length, McNemar's exact test. The Wilson and
McNemar points are the values the hand-written formulas gave before scipy replaced them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pelab.evaluation import stats

Z2 = 1.959963984540054**2  # the 0.975 normal quantile, squared: 3.8415


def test_wilson_at_hand_computed_points():
    # k = 0: [0, z^2 / (n + z^2)]; k = n: [n / (n + z^2), 1]
    assert stats.wilson(0, 10) == (0.0, pytest.approx(Z2 / (10 + Z2)))
    assert stats.wilson(0, 10)[1] == pytest.approx(0.27753, abs=1e-5)
    assert stats.wilson(20, 20) == (pytest.approx(20 / (20 + Z2)), 1.0)
    assert stats.wilson(20, 20)[0] == pytest.approx(0.83887, abs=1e-5)
    # k / n = 1/2: centre 1/2, half-width z sqrt(1/(4n) + z^2/(4n^2)) / (1 + z^2/n)
    lo, hi = stats.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.23659, abs=1e-5), pytest.approx(0.76341, abs=1e-5))
    assert lo + hi == pytest.approx(1.0)
    # Newcombe (1998), Statistics in Medicine 17:857, table I: 81/263 -> 0.2553 to 0.3662
    lo, hi = stats.wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    for n in (1, 3, 7, 20, 200):  # exact ends, no rounding residue
        assert stats.wilson(0, n)[0] == 0.0 and stats.wilson(n, n)[1] == 1.0
    assert all(math.isnan(x) for x in stats.wilson(0, 0))
    with pytest.raises(ValueError, match="k <= n"):
        stats.wilson(3, 2)


def test_wilson_shrinks_like_one_over_root_n():
    w20 = stats.wilson(10, 20)
    w200 = stats.wilson(100, 200)
    assert (w20[1] - w20[0]) / (w200[1] - w200[0]) == pytest.approx(math.sqrt(10), rel=0.08)
    assert 0.065 < (w200[1] - w200[0]) / 2 < 0.07  # the "±7 points at 0.5" for 200 instances


def test_depth_summary_gap_is_the_mean_of_per_instance_gaps_with_a_paired_interval():
    depths = [0.0, 0.5, 1.0]
    # 40 instances: retrieved at both edges, in the middle only for the first 10
    outcomes = [[True] * 40, [True] * 10 + [False] * 30, [True] * 40]
    s = stats.depth_summary(depths, outcomes)
    assert s["lim_gap"] == pytest.approx(0.75) and s["acc"] == pytest.approx((40 + 10 + 40) / 120)
    assert s["lim_gap_lo"] < 0.75 < s["lim_gap_hi"]
    # the per-instance gaps are 0 or 1 with mean 0.75: the bootstrap interval is about +- 2 standard errors
    se = math.sqrt(0.75 * 0.25 / 40)
    assert s["lim_gap_hi"] - s["lim_gap_lo"] == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert stats.depth_summary(depths, outcomes) == s  # fixed seed: reproducible
    # fewer than three depths: no middle
    two = stats.depth_summary([0.0, 1.0], [[True, False], [True, True]])
    assert math.isnan(two["lim_gap"]) and two["acc"] == 0.75
    assert math.isnan(stats.depth_summary(depths, [[True], [True, False], [True]])["acc"])  # unpaired


def test_depth_mean_interval_is_never_narrower_than_wilson_over_every_outcome():
    """One miss among 200 instances x 5 depths: the bootstrap over instances resamples one imperfect instance and
    claims [0.997, 1.000] (printed [1.00, 1.00]); the interval is at least Wilson's for 999 of 1,000 outcomes.
    Away from the boundary (instances correlated across depths) the bootstrap is the wider one and stands."""
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    outcomes = [[True] * 200 for _ in depths]
    outcomes[2][7] = False
    s = stats.depth_summary(depths, outcomes)
    assert s["acc"] == pytest.approx(0.999) and s["acc_lo"] == pytest.approx(stats.wilson(999, 1000)[0])
    assert f"{s['acc_lo']:.2f}" == "0.99" and s["acc_hi"] == 1.0
    rng = np.random.default_rng(0)
    easy = rng.random(200) < 0.5  # an instance is easy or hard at every depth
    correlated = [list(easy ^ (rng.random(200) < 0.1)) for _ in depths]
    s = stats.depth_summary(depths, correlated)
    assert (s["acc_lo"], s["acc_hi"]) == stats.mean_interval(np.mean(correlated, axis=0))


def test_bootstrap_interval_of_a_mean_at_a_hand_computed_case():
    """400 values, half 0 and half 1: mean 0.5, standard error 0.5 / sqrt(400) = 0.025, so the 95% percentile
    interval is 0.5 +- 1.96 x 0.025 = [0.451, 0.549] up to resampling noise; reproducible by its seed."""
    x = [0.0, 1.0] * 200
    lo, hi = stats.mean_interval(x)
    assert lo == pytest.approx(0.451, abs=0.006) and hi == pytest.approx(0.549, abs=0.006)
    assert stats.mean_interval(x) == (lo, hi)
    # 4x the values: half the width
    lo4, hi4 = stats.mean_interval(x * 4)
    assert (hi - lo) / (hi4 - lo4) == pytest.approx(2.0, rel=0.1)
    assert all(math.isnan(v) for v in stats.mean_interval([1.0]))  # one value: no interval
    assert all(math.isnan(v) for v in stats.mean_interval([1.0, float("nan")]))


def test_lim_gap_interval_never_collapses_to_a_point():
    """Every instance with the same gap (here 0: retrieved at every depth) gives no bootstrap spread; the
    interval is bounded by the instances that could differ (Wilson's 0 of n), not [0, 0]."""
    depths = [0.0, 0.5, 1.0]
    s = stats.depth_summary(depths, [[True] * 20] * 3)
    w = stats.wilson(0, 20)[1]
    assert s["lim_gap"] == 0.0 and (s["lim_gap_lo"], s["lim_gap_hi"]) == (pytest.approx(-w), pytest.approx(w))
    edge_only = stats.depth_summary(depths, [[True] * 20, [False] * 20, [True] * 20])  # gap 1 everywhere
    assert edge_only["lim_gap"] == 1.0 and edge_only["lim_gap_lo"] == pytest.approx(1 - 2 * w)
    assert edge_only["lim_gap_hi"] == 1.0


def test_depth_summary_interval_at_all_wrong_or_all_right_is_wilson_over_instances():
    """20 instances that fail (pass) at all 5 depths: the bootstrap alone would give [0, 0] ([1, 1]); the
    interval is Wilson's for 0 (20) of 20 instances, the independent unit."""
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    none = stats.depth_summary(depths, [[False] * 20] * 5)
    assert none["acc"] == 0.0 and (none["acc_lo"], none["acc_hi"]) == stats.wilson(0, 20)
    assert none["acc_hi"] == pytest.approx(0.161, abs=0.001)  # z^2 / (n + z^2) at z = 1.96, n = 20
    every = stats.depth_summary(depths, [[True] * 20] * 5)
    assert (every["acc_lo"], every["acc_hi"]) == stats.wilson(20, 20) and every["acc_lo"] < 1.0


def test_effective_length_and_auc_over_log_length():
    assert stats.effective_length([128, 256, 512, 1024], [0.99, 0.92, 0.5, 0.95]) == 1024
    assert stats.effective_length([128, 256], [0.95, float("nan")]) == 128
    assert stats.effective_length([128, 256], [0.5, 0.89]) is None
    # x = log2(L / 128) = 0, 1, 2: trapezoids (1 + 0.5) / 2 + (0.5 + 0) / 2 = 1, over the range 2
    assert stats.auc_log_length([128, 256, 512], [1.0, 0.5, 0.0], 128) == pytest.approx(0.5)
    assert stats.auc_log_length([512, 128, 256], [0.0, 1.0, 0.5], 128) == pytest.approx(0.5)  # any order
    assert stats.auc_log_length([128, 256, 512], [1.0, 1.0, float("nan")], 128) == pytest.approx(0.75)
    assert stats.auc_log_length([128, 512], [1.0, 1.0], 128) == 1.0
    assert stats.auc_log_length([256], [0.4], 128) == 0.4


def test_mcnemar_exact_at_hand_computed_points():
    # 5 discordant pairs all one way: p = 2 * (1/2)^5
    r = stats.mcnemar([True] * 5 + [False] * 3, [False] * 5 + [False] * 3)
    assert (r["n"], r["b01"], r["b10"]) == (8, 0, 5) and r["p"] == pytest.approx(0.0625)
    # 1 vs 9: p = 2 * (C(10,0) + C(10,1)) / 2^10 = 22 / 1024
    a = [False] + [True] * 9 + [True] * 20
    b = [True] + [False] * 9 + [True] * 20
    assert stats.mcnemar(a, b)["p"] == pytest.approx(22 / 1024)
    assert stats.mcnemar([True, False], [True, False])["p"] == 1.0  # no discordant pair
    assert stats.mcnemar([True, False, True], [False, True, True])["p"] == 1.0  # balanced: capped at 1
    with pytest.raises(ValueError, match="equal lengths"):
        stats.mcnemar([True], [True, False])


def test_outcome_bits_round_trip():
    o = [True, False, False, True]
    assert stats.bits(o) == "1001" and stats.unbits("1001") == o


def test_bulk_bounded_draws_are_numpys_integers_including_rejected_words():
    """stats._integers reads the generator's 32-bit words in bulk and applies numpy's Lemire rule itself: a call of
    rng.integers per draw must give the same numbers. A bound of 2^31 + 1 rejects about half the words (threshold
    2^31 - 1), so the retry-with-the-next-word path is exercised as often as the plain one."""
    big = (1 << 31) + 1
    bounds = np.array([big, 3, 7, big, 2, 1000, big, big, 5] * 40, dtype=np.uint64)
    thresholds = (np.uint64(1 << 32) - bounds) % bounds
    for seed in range(5):
        calls = np.random.default_rng(seed)
        expected = [calls.integers(0, int(b)) for b in bounds]
        got = stats._integers(stats._Words(np.random.default_rng(seed)), bounds, thresholds)
        assert got.tolist() == expected


@pytest.mark.parametrize("sizes", [[50, 50, 50], [2, 2], [333, 333, 333, 333, 333]])
def test_the_bulk_two_level_bootstrap_equals_the_call_per_draw_loop(sizes):
    """Groups of one size take the bulk path (hierarchical_interval): the same means as drawing call by call, for
    every chunking of the draws, so the committed reports' intervals are unchanged to the last digit."""
    rng = np.random.default_rng(sum(sizes))
    gs = [rng.random(n) for n in sizes]
    loop = stats._resampled_means_loop(gs, np.random.default_rng(7), 2000)
    for chunk in (1, 997, 1 << 21):
        assert np.array_equal(stats._resampled_means_equal(gs, np.random.default_rng(7), 2000, chunk=chunk), loop)
    expected = np.quantile(loop.sum(axis=1) / len(gs), [0.025, 0.975])  # the interval from the loop's means
    assert stats.hierarchical_interval(gs, seed=7) == (float(expected[0]), float(expected[1]))
