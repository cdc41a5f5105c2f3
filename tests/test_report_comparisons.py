"""Paired comparisons over seeds with Holm's adjustment, and the along-training section of the report, on
hand-built run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import scipy.stats

from pelab import report
from pelab.errors import ReportError
from pelab.report.aggregation import group_rows
from pelab.report.comparisons import compare, holm
from pelab.report.discovery import find_jobs
from pelab.summary import write_summary

SEEDS = (0, 1, 2)
BASE = [2.0, 2.2, 1.9]  # ppl_ratio@1024 of the baseline's three seeds
# log(other / baseline) per seed: a large steady gap, a small steady one, noise
DIFFS = {"big": [1.0, 1.01, 0.99], "small": [0.1, 0.13, 0.07], "noise": [0.05, -0.05, 0.02]}


def run(folder: Path, pe: str, seed: int, ratio: float, **extra) -> None:
    cfg = {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed,
           "trainer": {"max_steps": extra.pop("steps", 100)}}
    write_summary(folder, {"status": "ok", "config": cfg, "data": {"fingerprint": {"key": "corpus"}},
                           "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}},
                           "metrics": {"extrap/ppl_ratio@1024": ratio, "extrap/ppl@1024": 10 * ratio}, **extra})


@pytest.fixture
def study(tmp_path):
    for s, base in zip(SEEDS, BASE):
        run(tmp_path / f"base_s{s}", "base", s, base)
        for name, d in DIFFS.items():
            run(tmp_path / f"{name}_s{s}", name, s, base * math.exp(d[s]))
    return tmp_path


def rows_of(folder: Path):
    g = group_rows(find_jobs([folder]))
    return g.rows, g.shown


def test_holm_at_hand_computed_points():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; 2 x 0.03; max(0.06, 1 x 0.04)
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002]) and holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1


def test_resolved_not_resolved_and_resolved_only_before_adjustment(study):
    rows, shown = rows_of(study)
    cs = {c.a.label: c for c in compare(rows, shown, ["extrap/ppl_ratio"], baseline="base")}
    p = {k: scipy.stats.ttest_rel(DIFFS[k], [0, 0, 0]).pvalue for k in DIFFS}
    assert {k: c.p for k, c in cs.items()} == pytest.approx(p)
    assert p["big"] < p["small"] < 0.05 < p["noise"]
    assert cs["big"].resolved and cs["big"].verdict() == "resolved"
    assert cs["small"].p < 0.05 < cs["small"].p_adj == pytest.approx(2 * p["small"])  # lost to Holm
    assert cs["small"].verdict() == cs["noise"].verdict() == "not resolved at 3 seeds"
    # the ratio of the two settings and its t interval, on the log scale
    assert cs["big"].ratio == pytest.approx(math.exp(1.0)) and cs["big"].lo < math.exp(1.0) < cs["big"].hi
    md = report.build_report([study], study / "out", baseline="base", compare=["extrap/ppl_ratio"]).markdown
    assert "1 of 3 differences resolved" in md
    line = next(x for x in md.splitlines() if x.startswith("| small / base"))
    assert "not resolved at 3 seeds" in line and "p_adj=0.057" in line


def test_every_pair_that_differs_in_one_setting_is_one_family(study):
    rows, shown = rows_of(study)
    cs = compare(rows, shown, ["extrap/ppl_ratio", "extrap/ppl"])
    assert len(cs) == 2 * 6  # 4 rows: 6 pairs, two metrics at one length
    assert sorted(c.p_adj for c in cs) == pytest.approx(sorted(holm([c.p for c in cs])))


def test_chosen_pairs_are_a_smaller_family_at_every_value_of_the_other_settings(study):
    for s, base in zip(SEEDS, BASE):  # a second budget of base and big
        run(study / f"base_long_s{s}", "base", s, base, steps=400)
        run(study / f"big_long_s{s}", "big", s, base * math.exp(DIFFS["big"][s]), steps=400)
    rows, shown = rows_of(study)
    cs = compare(rows, shown, ["extrap/ppl_ratio"], chosen=["big/base"])
    assert sorted((c.a.label, c.b.label) for c in cs) == [
        ("big trainer.max_steps=100", "base trainer.max_steps=100"),
        ("big trainer.max_steps=400", "base trainer.max_steps=400")]
    assert all(c.ratio == pytest.approx(math.exp(1.0)) for c in cs)
    assert [c.p_adj for c in cs] == pytest.approx(holm([c.p for c in cs]))  # a family of two, not of every pair
    with pytest.raises(ReportError, match="--pairs 'big/nobody' matches no pair"):
        compare(rows, shown, chosen=["big/nobody"])


def test_a_baseline_with_other_seeds_or_text_is_one_line(study, tmp_path):
    run(study / "late_s5", "late", 5, 3.0)
    run(study / "late_s6", "late", 6, 3.1)
    rows, shown = rows_of(study)
    unpaired = r"'late' \(seeds \[5, 6\]\) and 'base' \(seeds \[0, 1, 2\]\) share no seed"
    with pytest.raises(ReportError, match="cannot be paired with 'late': " + unpaired):
        compare(rows, shown, baseline="base")
    with pytest.raises(ReportError, match="--baseline 'nobody' names no row"):
        compare(rows, shown, baseline="nobody")
    with pytest.raises(ReportError, match="--pairs 'late/base' cannot be compared: " + unpaired):
        compare(rows, shown, chosen=["late/base"])  # --pairs by whole labels says the same


def test_rows_sharing_too_few_seeds_get_their_estimate_and_no_verdict(tmp_path):
    """Pairable rows (same text) sharing 1 seed: the estimate is shown with why there is no verdict, and the
    comparison stays out of the Holm family; sharing none is a one-line error."""
    for s in SEEDS:
        for steps in (100, 400):
            run(tmp_path / f"base_{steps}_s{s}", "base", s, 2.0, steps=steps)
    for s in (2, 6):
        run(tmp_path / f"late_s{s}", "late", s, 3.0, steps=400)
    rows, shown = rows_of(tmp_path)
    (c,) = compare(rows, shown, ["extrap/ppl_ratio"], chosen=["late/base"])
    assert c.n == 1 and c.ratio == pytest.approx(1.5) and math.isnan(c.p) and math.isnan(c.p_adj)
    assert c.verdict() == "1 paired seed(s): no between-setting verdict below 3" and not c.resolved
    for s in (5, 6):
        run(tmp_path / f"never_s{s}", "never", s, 3.0, steps=100)
    rows, shown = rows_of(tmp_path)
    with pytest.raises(ReportError, match=r"--pairs 'never/base' cannot be compared: 'never trainer.max_steps=100' "
                                          r"\(seeds \[5, 6\]\) and 'base trainer.max_steps=100' \(seeds \[0, 1, 2\]\) "
                                          r"share no seed"):
        compare(rows, shown, chosen=["never/base"])


def test_across_budgets_shows_each_budget_the_sign_in_every_seed_run_and_the_interaction(tmp_path):
    """Pairs at two budgets: a steady gap at both, one reversed between them, one at the short budget only, noise
    at both, one whose long runs have one seed: per budget the estimate and its verdict, how many seed-runs share
    the mean's sign, and the budget interaction (a t over seeds of each seed's last-minus-first contrast). The old
    rule ("depends on budget" wherever a budget did not resolve) is gone: direction and size are read apart."""
    big, noise = DIFFS["big"], DIFFS["noise"]
    gaps = {"same": (big, big), "flip": (big, [-d for d in big]), "short": (big, noise), "noise": (noise, noise)}
    for s, base in zip(SEEDS, BASE):
        for steps in (100, 400):
            run(tmp_path / f"base_{steps}_s{s}", "base", s, base, steps=steps)
        for name, (at100, at400) in gaps.items():
            run(tmp_path / f"{name}_100_s{s}", name, s, base * math.exp(at100[s]), steps=100)
            run(tmp_path / f"{name}_400_s{s}", name, s, base * math.exp(at400[s]), steps=400)
        run(tmp_path / f"once_100_s{s}", "once", s, base * math.exp(big[s]), steps=100)
    run(tmp_path / "once_400_s0", "once", 0, BASE[0] * math.exp(big[0]), steps=400)  # one seed: no verdict
    rep = report.build_report([tmp_path], tmp_path / "out", compare=["extrap/ppl_ratio"],
                              pairs=[f"{n}/base" for n in (*gaps, "once")])
    table = next(t for t in rep.tables if t.title == "Across budgets")
    cell = {r[0]: r[1] for r in table.rows}
    inter = lambda first, last: scipy.stats.ttest_1samp([y - x for x, y in zip(first, last)], 0.0).pvalue
    e = math.exp(1.0)
    assert cell["same / base"].startswith(f"100: {e:.3f} res. · 400: {e:.3f} res.")
    assert cell["same / base"].endswith("sign of the mean in 6/6 seed-runs; interaction: no measurable difference "
                                        "(the same value in both rows in every seed)")
    assert cell["flip / base"].endswith(f"sign of the mean in 3/6 seed-runs; interaction p = "
                                        f"{inter(big, [-d for d in big]):.2g}")
    assert " res. · 400: " in cell["short / base"] and cell["short / base"].split("400: ")[1].startswith(
        f"{math.exp(sum(noise) / 3):.3f} n.r.")
    assert cell["short / base"].endswith(f"in 5/6 seed-runs; interaction p = {inter(big, noise):.2g}")
    assert cell["noise / base"].endswith("in 4/6 seed-runs; interaction: no measurable difference (the same value "
                                         "in both rows in every seed)")
    assert cell["once / base"].endswith(f"400: {math.exp(big[0]):.3f} → sign of the mean in 4/4 seed-runs; "
                                        "interaction: 1 paired seed(s): no between-setting verdict below 3")
    # the declared pair with one seed at 400: its estimate and why no verdict, outside the family
    ratios = next(t for t in rep.tables if t.title == "Paired comparisons: extrap/ppl_ratio")
    said = {r[0]: r[1] for r in ratios.rows}["once trainer.max_steps=400 / base trainer.max_steps=400"]
    assert said == f"{math.exp(big[0]):.3f} (1 paired seed(s): no between-setting verdict below 3)"
    assert "Bonferroni over the 9 comparisons" in ratios.caption  # 5 pairs x 2 budgets, less the one not tested
    # one budget: no such table
    one = report.build_report([tmp_path / "same_100_s0", tmp_path / "same_100_s1", tmp_path / "base_100_s0",
                               tmp_path / "base_100_s1"], tmp_path / "out1", compare=["extrap/ppl_ratio"])
    assert "Across budgets" not in [t.title for t in one.tables]


def test_along_training_section_warns_when_the_order_flips_between_budgets(tmp_path):
    """Two schemes at two budgets: the ratio order at the end of the short runs is reversed at the end of the
    long ones; the mid-schedule points of the long runs are shown but not used for the warning."""
    def point(step, ratio, schedule):
        return {"step": step, "tokens_seen": step * 100, "schedule": schedule,
                "metrics": {"extrap/ppl_ratio@1024": ratio}}

    for s in (0, 1):
        for pe, short, long in (("a", 1.5, 3.0), ("b", 2.0, 2.2)):
            run(tmp_path / f"{pe}_short_s{s}", pe, s, short, steps=100,
                along_training=[point(50, short * 0.9, "mid-schedule"), point(100, short, "end")])
            run(tmp_path / f"{pe}_long_s{s}", pe, s, long, steps=400,
                along_training=[point(100, long * 0.5, "mid-schedule"), point(400, long, "end")])
    built = report.build_report([tmp_path], tmp_path / "out")
    assert "**Warning:** The order of the settings by extrap/ppl_ratio@1024 differs between the last two budgets" \
        in built.markdown
    table = next(t for t in built.tables if t.title == "Along training: extrap/ppl_ratio@1024")
    # the long runs' point at 10k tokens is mid-schedule, beside the end of the short runs at 10k
    assert table.columns == ["setting", "0.005M", "0.01M", "0.01M end", "0.04M end"]
    assert table.rows == [["a", "1.350", "1.500", "1.500", "3.000"], ["b", "1.800", "1.100", "2.000", "2.200"]]
    assert "along_training" in built.figures


def test_context_extension_children_read_as_budgets_with_a_training_free_row(tmp_path):
    """Children of two parents (one per seed) at 0 (extend.eval_before), 50 and 100 fine-tuning steps: the
    parents' identity does not split the rows, the step-0 evaluation is a row of its own (max_steps 0) with the
    unprefixed metrics, and runs without eval.at are points along training at the tokens they trained on."""
    for s in (0, 1):
        for steps in (50, 100):
            cfg = {"pe": {"name": "rope", "scaling": {"type": "yarn"}}, "model": {"name": "recall"}, "seed": s,
                   "data": {"seq_len": 512, "batch_size": 8}, "trainer": {"max_steps": steps},
                   "extend": {"from": f"/runs/parent_s{s}", "eval_before": steps == 100,
                              "parent": {"path": f"/runs/parent_s{s}/last.ckpt", "name": f"rope-s{s}", "step": 900}}}
            metrics = {"extrap/ppl@2048": 6.0 - steps / 100 + s, "extrap/ppl_ratio@2048": 1.5}
            extra = {}
            if steps == 100:
                metrics.update({"extrap/step0/ppl@2048": 9.0 + s, "extrap/step0/ppl_ratio@2048": 2.0})
                extra["evaluation/step0"] = {"extrapolation": {"split": "test", "seed": 0, "blocks": 8},
                                             "seconds": {"extrapolation": 2.0}}
            write_summary(tmp_path / f"yarn_{steps}_s{s}", {
                "status": "ok", "config": cfg, "global_step": steps, "data": {"fingerprint": {"key": "corpus"}},
                "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}}, "metrics": metrics,
                **extra})
    for s in (0, 1):  # the parents, trained from scratch: the same setting at 900 steps
        write_summary(tmp_path / f"parent_s{s}", {
            "status": "ok", "global_step": 900, "data": {"fingerprint": {"key": "corpus"}},
            "config": {"pe": {"name": "rope", "scaling": {"type": "yarn"}}, "model": {"name": "recall"}, "seed": s,
                       "data": {"seq_len": 512, "batch_size": 8}, "trainer": {"max_steps": 900}},
            "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}},
            "metrics": {"extrap/ppl@2048": 7.0, "extrap/ppl_ratio@2048": 1.5}})
    jobs = [j for j in find_jobs([tmp_path]) if not j.folder.name.startswith("parent")]
    free = [j for j in jobs if j.folder.name.endswith("@step0")]
    assert len(jobs) == 6 and sorted(j.folder.name for j in free) == ["yarn_100_s0@step0", "yarn_100_s1@step0"]
    assert {j.metrics["extrap/ppl@2048"] for j in free} == {9.0, 10.0} and all(j.setting("trainer.max_steps") == 0
                                                                              for j in free)
    rows, _ = rows_of(tmp_path)
    assert {r.label: r.seeds for r in rows} == {
        "rope trainer.max_steps=0": [0, 1], "rope trainer.max_steps=50": [0, 1],
        "rope trainer.max_steps=100": [0, 1], "rope trainer.max_steps=900": [0, 1]}
    table = next(t for t in report.build_report([tmp_path], tmp_path / "out").tables
                 if t.title == "Along training: extrap/ppl@2048")
    # 8 x 512 tokens a step; the children count theirs from the parent's weights, so they are not points of the
    # parents' own curve (3.69M from scratch)
    assert table.columns == ["setting", "0M end", "0.205M end", "0.41M end", "3.69M end"]
    assert sorted(table.rows) == [["rope", "—", "—", "—", "7.000"],
                                  ["rope (from step 900)", *(f"{math.sqrt(a * b):.3f}" for a, b in  # geometric
                                                             ((9.0, 10.0), (5.5, 6.5), (5.0, 6.0))), "—"]]


def test_a_pair_of_whole_labels_may_differ_in_several_settings(study):
    for s, base in zip(SEEDS, BASE):  # big at another budget: differs from base in two settings
        run(study / f"big_long_s{s}", "big", s, base * math.exp(DIFFS["big"][s] + 0.5), steps=400)
    rows, shown = rows_of(study)
    assert not [c for c in compare(rows, shown, ["extrap/ppl_ratio"]) if
                {c.a.label, c.b.label} == {"big trainer.max_steps=400", "base trainer.max_steps=100"}]
    cs = compare(rows, shown, ["extrap/ppl_ratio"], chosen=["big trainer.max_steps=400/base trainer.max_steps=100"])
    assert [(c.a.label, c.b.label) for c in cs] == [("big trainer.max_steps=400", "base trainer.max_steps=100")]
    assert cs[0].ratio == pytest.approx(math.exp(1.5))


@pytest.mark.parametrize(("group", "switch", "off", "key", "old", "new"), [
    ("probes", "enabled", False, "samples", 64, 128),  # probes off: their sample count is no setting
    ("data", "recall_mix", 0, "recall_loss", "all", "two_means"),  # no recall rows: their loss is no setting
])
def test_settings_of_a_part_no_job_used_do_not_split_runs(tmp_path, group, switch, off, key, old, new):
    # runs of two commits: model.init differs by design; `key`, a default of a part every job left off, changed
    # after gpt2's first seed
    for s in SEEDS:
        for init in ("gpt2", "kaiming"):
            value = old if (init, s) == ("gpt2", SEEDS[0]) else new
            folder = tmp_path / f"{init}_s{s}"
            run(folder, "rope", s, 2.0)
            data = json.loads((folder / "summary.json").read_text())
            data["config"].update({"model": {"name": "tiny", "init": init}, group: {switch: off, key: value}})
            write_summary(folder, data)
    rows, _shown = rows_of(tmp_path)
    assert [r.label for r in rows] == ["rope model.init=gpt2", "rope model.init=kaiming"]
    assert all(len(r.jobs) == 3 for r in rows)
    # once the jobs use the part, its settings are real settings again: gpt2's first seed is a row of its own
    for folder in tmp_path.iterdir():
        data = json.loads((folder / "summary.json").read_text())
        data["config"][group][switch] = 1
        write_summary(folder, data)
    assert sorted(len(r.jobs) for r in rows_of(tmp_path)[0]) == [1, 2, 3]


def test_a_report_whose_pairs_share_two_seeds_says_no_difference_could_be_tested(tmp_path):
    for s in (0, 1):
        run(tmp_path / f"base_s{s}", "base", s, 2.0 + s)
        run(tmp_path / f"other_s{s}", "other", s, 3.0 + s)
    md = report.build_report([tmp_path], tmp_path / "out", compare=["extrap/ppl_ratio"]).markdown
    assert "No difference could be tested: every pair shares fewer than 3 seeds" in md
    assert "0 of 0" not in md and "Bonferroni over the 0" not in md


def test_runs_recorded_with_a_datamodule_group_share_rows_with_runs_naming_data_target(tmp_path):
    """Runs launched now name their DataModule as data._target_; committed runs named it in a `datamodule` group
    (its data config under `source`, later `data`), or, the oldest, nowhere: the same rows, no data._target_ label
    (pelab.conf_values.with_data_target)."""
    lm = "pelab.data.datamodule.LMDataModule"
    forms = {0: {"data": {"_target_": lm, "seq_len": 128}},
             1: {"data": {"seq_len": 128}, "datamodule": {"_target_": lm, "source": {"seq_len": 128}, "tokenizer": {}}},
             2: {"data": {"seq_len": 128}, "datamodule": {"_target_": lm, "data": {"seq_len": 128}, "tokenizer": {}}},
             3: {"data": {"seq_len": 128}}}
    for pe in ("rope", "alibi"):
        for s, form in forms.items():
            folder = tmp_path / f"{pe}_s{s}"
            run(folder, pe, s, 2.0)
            data = json.loads((folder / "summary.json").read_text())
            data["config"].update(form)
            write_summary(folder, data)
    rows, shown = rows_of(tmp_path)
    assert sorted(r.label for r in rows) == ["alibi", "rope"] and shown == ["pe.name"]
    assert all(len(r.jobs) == 4 for r in rows)
