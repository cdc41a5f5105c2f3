"""The report's probe sections from real ProbeResult summaries: intervals, the summary at the training
length, McNemar paired comparisons on the same instances, the mqar_offset table, the accuracy-vs-length
figure (issue 16)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pelab import report
from pelab.data.recall import MQAR_OFFSET
from pelab.evaluation import stats
from pelab.evaluation.probes import ProbeCell, ProbeResult
from pelab.summary import write_summary

DEPTHS = [0.0, 0.5, 1.0]


def _result(bits: dict[int, str], offset: dict[int, str] | None = None) -> ProbeResult:
    """mqar cells with the same outcome bits at every depth of each length (bits[L]), train length 128."""
    res = ProbeResult(kinds=["mqar"], depths=DEPTHS, lengths=sorted(bits), train_length=128)
    for L, b in bits.items():
        for d in DEPTHS:
            c = res.cells[("mqar", d, L)] = ProbeCell("mqar", d, L, chance=1 / 64, chance_copy=1 / 8)
            c.n, c.outcomes, c.acc = len(b), b, b.count("1") / len(b)
            c.lo, c.hi = stats.wilson(b.count("1"), len(b))
    for m, b in (offset or {}).items():
        c = ProbeCell(MQAR_OFFSET, float("nan"), 128 * (m + 1), prefix=m, n=len(b), outcomes=b)
        res.offset[(MQAR_OFFSET, m)] = c
        c.acc, (c.lo, c.hi) = b.count("1") / len(b), stats.wilson(b.count("1"), len(b))
    return res


def _write(folder: Path, pe: str, res: ProbeResult, probe_seed: int = 1234, seed: int = 0, mix: float | None = None,
           **metrics) -> None:
    data = {"seq_len": 128} if mix is None else {"seq_len": 128, "recall_mix": mix}
    write_summary(folder, {
        "status": "ok",
        "config": {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": data, "seed": seed,
                   "probes": {"seed": probe_seed, "samples": 10}, "trainer": {"max_steps": 3000}},
        "data": {"fingerprint": {"key": "f00d"}},
        "metrics": {"val/ppl": 10.0, **res.metrics(), **metrics},
        "evaluation": {"probes": res.to_dict()},
    })


def _table(md: str, title: str) -> tuple[list[str], list[list[str]]]:
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if title in line)
    i += next(k for k, line in enumerate(lines[i:]) if line.startswith("|"))
    rows = []
    for line in lines[i:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[0], rows[2:]


@pytest.fixture
def built(tmp_path):
    all_right, eight = "1" * 10, "1" * 8 + "00"
    half = "1" * 5 + "0" * 5
    rope = _result({128: all_right, 256: half}, {0: all_right, 1: "1" * 9 + "0", 3: "1" * 4 + "0" * 6})
    _write(tmp_path / "runs" / "0_rope", "rope", rope)
    alibi = _result({128: eight, 256: half}, {0: all_right, 1: all_right, 3: all_right})
    _write(tmp_path / "runs" / "1_alibi", "alibi", alibi)
    # probed with another seed: other instances, so never paired with the two above
    _write(tmp_path / "runs" / "2_nope", "nope", _result({128: "0" * 10, 256: "0" * 10}), probe_seed=7)
    return report.build_report([tmp_path / "runs"], tmp_path / "out")


def test_paired_comparisons_are_mcnemar_on_the_same_instances(built):
    header, rows = _table(built.markdown, "mqar: paired comparisons on the same instances")
    assert header == ["pair", "128", "256"]
    # at 128 rope is right on 2 instances x 3 depths where alibi is wrong, never the reverse:
    # p = 2 * (1/2)^6; at 256 both give the same outcomes
    assert rows == [["rope vs alibi", "+0.20 (p=0.031, n=30)", "+0.00 (p=1, n=30)"]]


def test_probe_summary_and_accuracy_tables_carry_intervals(built):
    header, rows = _table(built.markdown, "mqar: summary at the training length")
    assert header[:6] == ["encoding", "L", "accuracy", "lim_gap", "effective length", "AUC"]
    by_pe = {r[0]: r for r in rows}
    # every paired instance right: Wilson's interval for 10 of 10 instances (the bootstrap alone is a point)
    assert by_pe["rope"][2] == "1.00 [0.72, 1.00]"
    # every instance has gap 0: bounded by the instances that could differ (Wilson's 0 of 10), not [0, 0]
    assert by_pe["alibi"][2].startswith("0.80 [") and by_pe["alibi"][3] == "0.00 [-0.28, 0.28]"
    assert by_pe["rope"][4] == "128" and by_pe["alibi"][4] == "none" and by_pe["nope"][4] == "none"
    assert by_pe["rope"][5] == "0.75"  # (1 + 0.5) / 2 over log2 lengths 0..1
    # where the 95% interval reaches copying a random value (1/8): never for rope (0.5 at 256 is above it),
    # from the training length on for nope
    assert header[6] == "at copy baseline from" and by_pe["rope"][6] == "—" and by_pe["nope"][6] == "128"
    _, acc = _table(built.markdown, "mqar: accuracy (mean over depths)")
    assert [r[0] for r in acc] == ["rope", "alibi", "nope"] and acc[0][2].startswith("**1.00 [")


def test_offset_table_and_the_accuracy_vs_length_figure(built):
    header, rows = _table(built.markdown, f"{MQAR_OFFSET}: position vs distance")
    assert header == ["encoding", "seed", "prefix 0×L", "prefix 1×L", "prefix 3×L"]
    lo, hi = stats.wilson(4, 10)
    assert rows[0] == ["rope", "0", "1.00 [0.72, 1.00]", "0.90 [0.60, 0.98]", f"0.40 [{lo:.2f}, {hi:.2f}]"]
    header, paired = _table(built.markdown, f"{MQAR_OFFSET}: paired comparisons")
    assert header[1:] == ["prefix 0×L", "prefix 1×L", "prefix 3×L"]
    assert paired[0][0] == "rope vs alibi" and paired[0][3].startswith("-0.60 (p=0.031")  # 6 vs 0 at 3×L
    fig = built.figures["probe_mqar_vs_length"]
    assert fig.stat().st_size > 5000 and f"]({fig.name})" in built.markdown
    assert "copying a random value of the context ≈ 0.125" in built.markdown  # 1 of the 8 values: not rounded to 0.12


def test_runs_that_did_not_acquire_retrieval_are_labelled_and_not_plotted(tmp_path):
    runs = tmp_path / "runs"
    right = _result({128: "1" * 10, 256: "1" * 5 + "0" * 5})
    _write(runs / "0", "rope", right, **{"train/retrieval_acc": 0.97, "train/steps_to_criterion": 350.0})
    _write(runs / "1", "nope", _result({128: "0" * 10, 256: "0" * 10}),
           **{"train/retrieval_acc": 0.13, "train/steps_to_criterion": "nan"})  # as summary.json stores NaN
    _write(runs / "2", "nope", right, seed=1, **{"train/retrieval_acc": 0.96, "train/steps_to_criterion": 2900.0})
    built = report.build_report([runs], tmp_path / "out")
    header, rows = _table(built.markdown, "Retrieval training: the in-window criterion")
    assert header == ["encoding", "seeds", "steps to criterion", "in-window accuracy at the end"]
    assert rows == [["rope", "0", "350", "0.970"],
                    ["nope", "0,1", "not acquired (by step 3000), 2900", "0.130, 0.960"]]
    assert "training stops once it reaches the threshold" in built.markdown  # the callback's default, stop=true
    header, rates = _table(built.markdown, "Retrieval training: acquisition rate")
    lo, hi = stats.wilson(1, 2)
    assert rates == [["rope", "0", "1 of 1", "1.00 [0.21, 1.00]"], ["nope", "0,1", "1 of 2", f"0.50 [{lo:.2f}, {hi:.2f}]"]]
    assert "left out of the probe tables and figures: nope (seed 0)." in built.markdown
    _, summary = _table(built.markdown, "mqar: summary at the training length")
    assert {r[0]: r[2] for r in summary}["nope"] == "1.00 [0.72, 1.00]"  # only the seed that acquired it
    # the seed that never acquired it: in a table of its own, after the others
    _, own = _table(built.markdown, "mqar, not acquired: accuracy (mean over depths)")
    assert [(r[0], r[1], r[2]) for r in own] == [("nope", "0", "**0.00 [0.00, 0.28]**")]
    # read against the baselines of the runs it shows (a run at the copy baseline learned to copy, not to look up)
    caption = built.markdown.split("**mqar, not acquired: accuracy (mean over depths)**")[1].split("|")[0]
    assert "copying a random value of the context ≈ 0.125" in caption and "chance ≈ " in caption
    assert built.markdown.index("## Runs that did not acquire retrieval") > built.markdown.index("## Probe: mqar")


def test_the_report_recomputes_probe_intervals_from_the_outcomes_a_summary_keeps():
    """A run scored before the all-pass rule (a bootstrap claiming [1.00, 1.00] from 40 instances) reads as it
    would today: Wilson over its 40 instances, from the outcomes in its summary."""
    from pelab.report.discovery import probe_intervals

    ev = _result({128: "1" * 40, 256: "10" * 20}).to_dict()
    stale = {"probe/mqar/acc@128": 1.0, "probe/mqar/acc_lo@128": 1.0, "probe/mqar/acc_hi@128": 1.0}
    fresh = probe_intervals({"metrics": stale, "evaluation": {"probes": ev}})
    assert (fresh["probe/mqar/acc_lo@128"], fresh["probe/mqar/acc_hi@128"]) == pytest.approx(stats.wilson(40, 40))
    assert fresh["probe/mqar/acc_lo@256"] < 0.5 < fresh["probe/mqar/acc_hi@256"]
    assert probe_intervals({"metrics": stale}) == {}  # no outcomes kept: the summary's own numbers stand


def test_retrieval_is_compared_over_seeds_not_over_probe_instances(tmp_path):
    """--compare probe/mqar/acc: the seed is the unit, as for perplexity: per seed the difference of the two runs'
    accuracies, a t over the seeds (not over the instances of 3 models, which share their model and filler);
    seeds that did not acquire retrieval are left out; fewer than 3 paired seeds: no verdict; every seed at 100 %
    in both rows: "no measurable difference"."""
    import scipy.stats

    from pelab.report.aggregation import group_rows
    from pelab.report.comparisons import compare
    from pelab.report.discovery import find_jobs

    n, ok = 60, {"train/retrieval_acc": 0.99, "train/steps_to_criterion": 300}
    acc = {"alibi": (54, 50, 57), "rope": (30, 33, 28), "xpos": (54, 20, 40), "full": (60, 60, 60)}
    bits = lambda k: "1" * k + "0" * (n - k)
    for s in (0, 1, 2):
        for pe, ks in acc.items():
            _write(tmp_path / f"{pe}_s{s}", pe, _result({256: bits(ks[s])}), seed=s, **ok)
        _write(tmp_path / f"full2_s{s}", "full2", _result({256: bits(60)}), seed=s, **ok)
        _write(tmp_path / f"nope_s{s}", "nope", _result({256: bits(54)}), seed=s,
               **{"train/retrieval_acc": 0.5, "train/steps_to_criterion": float("nan")})  # never acquired
        _write(tmp_path / f"t5_bias_s{s}", "t5_bias", _result({256: bits(54)}), seed=s,  # acquired in seed 0 only
               **{"train/retrieval_acc": 0.99 if s == 0 else 0.1, "train/steps_to_criterion": 300 if s == 0 else "nan"})
    g = group_rows(find_jobs([tmp_path]))
    cs = {c.a.label: c for c in compare(g.rows, g.shown, ["probe/mqar/acc"], chosen=[
        "alibi/rope", "xpos/rope", "nope/rope", "t5_bias/rope", "full/full2"])}
    assert cs["t5_bias"].verdict() == "1 paired seed(s): no between-setting verdict below 3"
    assert cs["nope"].note == "not compared: nope did not acquire retrieval" and math.isnan(cs["nope"].p_adj)
    assert cs["full"].verdict() == "no measurable difference (the same value in both rows in every seed)"
    a, x = cs["alibi"], cs["xpos"]
    per_seed = lambda pe: [(u - v) / n for u, v in zip(acc[pe], acc["rope"])]  # recomputed from the bits' counts
    assert a.scale == "diff" and a.n == 3 and a.ratio == pytest.approx(sum(per_seed("alibi")) / 3)
    assert a.p == pytest.approx(scipy.stats.ttest_1samp(per_seed("alibi"), 0.0).pvalue)
    assert x.p == pytest.approx(scipy.stats.ttest_1samp(per_seed("xpos"), 0.0).pvalue)
    lo_p, hi_p = sorted((a.p, x.p))  # Holm over the two tested pairs, by hand: 2 x the smaller, then the larger
    assert sorted((a.p_adj, x.p_adj)) == pytest.approx([min(1, 2 * lo_p), min(1, max(2 * lo_p, hi_p))])
    # the interval beside the verdict: a t interval over the 3 seeds at 1 - 0.05 / 2 (Bonferroni over 2)
    ci = scipy.stats.ttest_1samp(per_seed("alibi"), 0.0).confidence_interval(1 - 0.05 / 2)
    assert (a.lo, a.hi) == pytest.approx((ci.low, ci.high)) and a.level == pytest.approx(0.975)
    assert a.resolved and not x.resolved and x.verdict() == "not resolved at 3 seeds"


def _by_depth(bits: dict[float, str], length: int = 256) -> ProbeResult:
    """mqar at one length with its own outcome bits at each depth."""
    res = ProbeResult(kinds=["mqar"], depths=DEPTHS, lengths=[length], train_length=128)
    for d in DEPTHS:
        b = bits[d]
        c = res.cells[("mqar", d, length)] = ProbeCell("mqar", d, length, chance=1 / 64, chance_copy=1 / 8)
        c.n, c.outcomes, c.acc = len(b), b, b.count("1") / len(b)
        c.lo, c.hi = stats.wilson(b.count("1"), len(b))
    return res


def test_depth_curve_shape_names_u_recency_and_flat_with_intervals(tmp_path):
    from pelab.report.probe_tables import curve_shape

    n = 100
    hi, mid, lo = "1" * 90 + "0" * 10, "1" * 50 + "0" * 50, "1" * 10 + "0" * 90
    _write(tmp_path / "nope", "nope", _by_depth({0.0: hi, 0.5: mid, 1.0: hi}))  # both edges above the middle
    _write(tmp_path / "rope", "rope", _by_depth({0.0: lo, 0.5: mid, 1.0: hi}))  # rising towards the query
    _write(tmp_path / "alibi", "alibi", _by_depth({0.0: "1" * n, 0.5: "1" * n, 1.0: "1" * n}))  # all retrieved
    built = report.build_report([tmp_path], tmp_path / "out")
    header, rows = _table(built.markdown, "mqar: shape of the depth curve")
    assert header == ["encoding", "seeds", "256"]
    cells = {r[0]: r[2] for r in rows}
    assert cells["nope"].startswith("U: +0.40 [") and cells["rope"].startswith("recency: -0.40 [")
    # every instance retrieved at every depth: no difference, and a Wilson-sized interval, not [0, 0]
    assert cells["alibi"].startswith("flat: +0.00 [-0.04, +0.04] / +0.00 [-0.04, +0.04]")
    assert curve_shape((-0.3, -0.4, -0.2), (-0.3, -0.4, -0.2)) == "∩"
    assert curve_shape((0.2, 0.1, 0.3), (0.0, -0.1, 0.1)) == "primacy"


def test_several_seeds_that_retrieve_everything_keep_an_interval(tmp_path):
    """Two seeds, every instance right at every depth: a bootstrap over seeds and instances can only redraw 1.0;
    the cell is Wilson over the seeds' instances together (20 of 20), as one seed's is over its own."""
    for s in (0, 1):
        _write(tmp_path / f"alibi_s{s}", "alibi", _result({128: "1" * 10, 256: "1" * 9 + "0"}), seed=s)
    md = report.build_report([tmp_path], tmp_path / "out").markdown
    _, rows = _table(md, "mqar: accuracy (mean over depths)")
    lo = stats.wilson(20, 20)[0]
    assert rows[0][2] == f"**1.00 [{lo:.2f}, 1.00] (2 seeds)**" and lo < 0.9
    # 9 of 10 instances in each seed: never narrower than Wilson over the 60 outcomes
    assert rows[0][3].startswith("0.90 [") and float(rows[0][3].split("[")[1].split(",")[0]) <= stats.wilson(54, 60)[0]


def test_retrieval_only_runs_get_no_perplexity_sections_and_offset_intervals_over_seeds(tmp_path):
    """data.recall_mix=1 everywhere: no text was trained, so no perplexity table; mqar_offset with two seeds reads
    an interval over seeds and instances, not mean ± std."""
    for s in (0, 1):
        res = _result({128: "1" * 10}, {0: "1" * 10, 3: "1" * 6 + "0" * 4})
        _write(tmp_path / f"rope_s{s}", "rope", res, seed=s, mix=1.0, **{"extrap/ppl@128": 5e4})
    md = report.build_report([tmp_path], tmp_path / "out").markdown
    assert "No run trained on text" in md and "## Perplexity" not in md
    _, rows = _table(md, f"{MQAR_OFFSET}: position vs distance")
    assert rows[0][2] == f"1.00 [{stats.wilson(20, 20)[0]:.2f}, 1.00] (2 seeds)" and rows[0][3].startswith("0.60 [")


def test_a_kinds_tables_hold_only_the_runs_that_probed_it(tmp_path):
    """Runs trained and probed on different kinds (one RULER kind per run): each kind's tables have the runs that
    probed it, not a row of empty cells for every other run."""
    _write(tmp_path / "0_mqar", "rope", _result({128: "1" * 9 + "0", 256: "1" * 5 + "0" * 5}))
    single = ProbeResult(kinds=["niah_single"], depths=DEPTHS, lengths=[128, 256], train_length=128)
    for L, b in {128: "1" * 10, 256: "1" * 7 + "000"}.items():
        for d in DEPTHS:
            c = single.cells[("niah_single", d, L)] = ProbeCell("niah_single", d, L, chance=1 / 64, chance_copy=1.0)
            c.n, c.outcomes, c.acc = len(b), b, b.count("1") / len(b)
            c.lo, c.hi = stats.wilson(b.count("1"), len(b))
    _write(tmp_path / "1_niah", "alibi", single)
    md = report.build_report([tmp_path], tmp_path / "out").markdown
    for kind, pe, acc in (("mqar", "rope", "**0.90"), ("niah_single", "alibi", "**1.00")):
        _, rows = _table(md, f"{kind}: accuracy (mean over depths)")
        assert [r[0] for r in rows] == [pe] and rows[0][2].startswith(acc), (kind, rows)
