"""`pelab.report` end to end: the shared 2 x 2 multirun (conftest.py: sweep) -> summaries -> report.md + PNGs
(+ a W&B report run), failed / unfinished jobs; and from hand-written summaries: cells, rows, labels
and their order."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.runs import FAST, compose, offline_runs, summaries, wandb_records
from pelab import report
from pelab.summary import as_float, write_summary

LENGTHS = [32, 64, 128]  # helpers.runs.SWEEP_ARGS: eval.lengths=[1,2,4] of data.seq_len=32


def _table(md: str, title: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first markdown table under the line `**title...` or `## title...`."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith((f"**{title}", f"## {title}")))
    i += next(k for k, line in enumerate(lines[i:]) if line.startswith("|")) - 2
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[0], rows[2:]  # skip the |---| line


# ---- from the real multirun ----------------------------------------------------------------------


@pytest.mark.slow
def test_report_has_a_two_row_table_with_the_mean_and_its_interval_over_seeds(sweep, tmp_path):
    out = tmp_path / "report"
    cli = subprocess.run(
        [sys.executable, "-m", "pelab.report", str(sweep), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "4 finished, 0 failed" in cli.stdout
    md = (out / "report.md").read_text()
    header, rows = _table(md, "Perplexity, non-overlapping")
    assert header == ["encoding", "seeds", *map(str, LENGTHS)]
    assert [r[0] for r in rows] == ["rope", "alibi"]  # the sweep's order (pe=rope,alibi); seeds are not rows
    jobs = summaries(sweep)
    for row in rows:
        assert row[1] == "0,1"
        for L, cell in zip(LENGTHS, row[2:]):
            m = re.fullmatch(r"\**([\d.]+) \[([\d.]+), ([\d.]+)\] \(2 seeds\)\**", cell)
            assert m, cell
            vals = [
                as_float(s["metrics"][f"extrap/ppl@{L}"]) for s in jobs if s["config"]["pe"]["name"] == row[0]
            ]
            # exp of the mean log-ppl and its t interval over the 2 seeds: +- t(1) s / sqrt(2), t(1) = 12.71
            logs = [math.log(v) for v in vals]
            half = 12.706 * statistics.stdev(logs) / math.sqrt(2)
            assert float(m.group(1)) == pytest.approx(math.exp(statistics.fmean(logs)), abs=0.006)
            assert math.log(float(m.group(3)) / float(m.group(2))) == pytest.approx(2 * half, abs=0.01)
        # the training length (32), and only it, is marked
        assert row[2].startswith("**") and not any(c.startswith("**") for c in row[3:])
    for title in (
        "ppl@L / ppl@training length",
        "Perplexity, sliding windows",
        "kv: accuracy",
        "passkey: lost-in-the-middle gap",
        "kv: mean log-probability of the gold answer",
    ):
        header, rows = _table(md, title)  # a table with a row per encoding and a cell per length
        assert [r[0] for r in rows] == ["rope", "alibi"], title
        assert all(len(r) == len(header) for r in rows), title
    # kv needs more tokens than 32: its cells there are n/a and the note says why.
    _, kv = _table(md, "kv: accuracy")
    assert {r[2] for r in kv} == {"n/a"} and "kv needs at least" in md
    _, runs = _table(md, "Runs")
    assert sorted(r[1] for r in runs) == ["alibi", "alibi", "rope", "rope"]
    assert "Failed / unfinished" not in md


@pytest.mark.slow
def test_report_figures_are_real_images(sweep, tmp_path):
    import numpy as np
    from PIL import Image

    rep = report.build_report([sweep], tmp_path)
    assert set(rep.figures) == {"ppl_vs_length", "val_curve", "loss_by_position", "probe_heatmaps",
                                "probe_kv_vs_length"}
    md = rep.path.read_text()
    for name, path in rep.figures.items():
        assert path.parent == tmp_path and path.suffix == ".png"
        assert f"]({path.name})" in md  # linked from the report
        assert path.stat().st_size > 5000, name
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=float)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300
        assert pixels.std() > 5.0, name  # not a blank canvas
    # The heatmap grid: one row per encoding, one column per probe kind.
    w, h = Image.open(rep.figures["probe_heatmaps"]).size
    assert w > h * 0.8


@pytest.mark.slow
def test_report_of_unchanged_runs_is_the_same_file_dated_by_the_newest_run(sweep, tmp_path):
    first = report.build_report([sweep], tmp_path / "a").path.read_text()
    second = report.build_report([sweep], tmp_path / "b").path.read_text()
    assert first == second  # regenerating a study rewrites nothing
    # --no-figures: the same tables (a section of figures alone drops out), no figure link, no PNG written
    tables_only = report.build_report([sweep], tmp_path / "c", figures=False).path.read_text()
    assert [x for x in tables_only.splitlines() if x.startswith("|")] == [
        x for x in first.splitlines() if x.startswith("|")]
    assert "![" not in tables_only
    assert "![" in first and not list((tmp_path / "c").glob("*.png"))
    ends = [launch["ended_at"] for s in summaries(sweep) for launch in s["launches"]]
    assert f"the newest run ended {max(ends)[:16].replace('T', ' ')} UTC" in first.splitlines()[2]


@pytest.mark.slow
def test_report_lists_failed_and_unfinished_jobs_and_leaves_them_out(sweep, tmp_path):
    from pelab.errors import ConfigError
    from pelab.tasks.train import train

    extra = tmp_path / "extra"
    failed = extra / "0_failed"
    with pytest.raises(ConfigError):  # model.n_heads=3 cannot divide d_model=32
        train(compose([*FAST, "model.n_heads=3", "logger=csv"], failed))
    unfinished = extra / "1_unfinished"  # a Hydra job folder that never wrote its summary
    shutil.copytree(next(sweep.glob("*/.hydra")), unfinished / ".hydra")

    out = tmp_path / "report"
    assert report.main([str(sweep), str(extra), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    _, rows = _table(md, "Failed / unfinished jobs")
    by_status = {r[1]: r for r in rows}
    assert set(by_status) == {"failed", "unfinished"}
    assert "model.n_heads" in by_status["failed"][2] and "0_failed" in by_status["failed"][0]
    assert "1_unfinished" in by_status["unfinished"][0]
    assert "2 job(s) left out" in md
    _, ppl_rows = _table(md, "Perplexity, non-overlapping")
    assert [r[0] for r in ppl_rows] == ["rope", "alibi"] and all(r[1] == "0,1" for r in ppl_rows)
    _, runs = _table(md, "Runs")  # left out of the runs too
    assert len(runs) == 4 and not any("failed" in r[0] or "unfinished" in r[0] for r in runs)


@pytest.mark.slow
def test_report_uploads_to_wandb_as_a_report_run_in_the_sweep_group(sweep, tmp_path):
    out = tmp_path / "report"
    assert report.main([str(sweep), "--out", str(out), "--wandb", "--wandb-mode", "offline"]) == 0
    runs = offline_runs(out)
    assert len(runs) == 1
    records = wandb_records(runs[0])
    run = next(r["run"] for r in records if r.get("type") == "run")
    assert run["job_type"] == "report"
    assert run["run_group"] == f"sweep-{sweep.parent.name}-{sweep.name}"
    logged = json.dumps([r for r in records if r.get("type") == "history"])
    for key in ("report/ppl_vs_length", "report/probe_heatmaps", "report/tables/runs", "report/markdown"):
        assert key in logged, key


# ---- from hand-written summaries -----------------------------------------------------------------


def test_report_cells_mark_not_applicable_diverged_and_partial():
    nan, inf = float("nan"), float("inf")
    assert report.aggregate([]) == "—"
    assert report.aggregate([nan, nan]) == "n/a"
    assert report.aggregate([inf, inf]) == "inf"
    assert report.aggregate([2.0]) == "2.00"
    assert report.aggregate([1.0, 3.0]) == "2.00 ± 1.41"
    assert report.aggregate([1.0, inf]) == "1.00 (1/2 seeds, 1 inf)"
    assert report.aggregate([1.0, nan]) == "1.00 (1/2 seeds)"
    assert report.aggregate([nan, inf]) == "inf (1/2)"
    assert report.aggregate([12345.0, 12355.0], digits=3) == "1.235e+04 ± 7.071"


def _job(tmp_path: Path, pe: dict, seed: int = 0, **config) -> report.Job:
    cfg = {"pe": pe, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed, **config}
    return report.Job(tmp_path, "ok", {"config": cfg, "metrics": {"val/ppl": 10.0}})


def test_report_convergence_reads_each_runs_csv_log(tmp_path):
    """Validation ppl at 50% / 80% / 100% of the steps and the change over the last fifth, from csv/metrics.csv
    (a run folder) or metrics.csv (a summary copied with its log); a run without a log is not in it."""
    curves = {0: {100: 9.0, 400: 6.0, 500: 5.5, 800: 5.0, 1000: 4.5}, 1: {100: 9.5, 400: 6.2, 500: 6.5, 800: 6.0,
              1000: 5.7}}
    for seed, curve in curves.items():
        folder = tmp_path / f"rope_s{seed}"
        log = folder / ("csv/metrics.csv" if seed == 0 else "metrics.csv")
        log.parent.mkdir(parents=True)
        # training rows (no val/ppl) between the validation rows, as Lightning's CSV logger writes them
        lines = ["epoch,step,train/loss,val/ppl"] + [f"0,{s - 1},2.0," for s in curve]
        lines += [f"0,{s},,{v}" for s, v in curve.items()]
        log.write_text("\n".join(lines) + "\n")
        write_summary(folder, {"status": "ok", "config": {"pe": {"name": "rope"}, "model": {"name": "tiny"},
                                                         "data": {"seq_len": 128}, "seed": seed},
                               "metrics": {"val/ppl": curve[1000], "extrap/ppl@128": curve[1000]}})
    no_log = tmp_path / "alibi_s0"
    write_summary(no_log, {"status": "ok", "config": {"pe": {"name": "alibi"}, "model": {"name": "tiny"},
                                                       "data": {"seq_len": 128}, "seed": 0},
                           "metrics": {"val/ppl": 4.0, "extrap/ppl@128": 4.0}})
    rep = report.build_report([tmp_path], tmp_path / "report")
    header, rows = _table(rep.path.read_text(), "Convergence: validation perplexity")
    assert header[1:5] == ["seeds with a log", "val ppl at 50% of steps", "val ppl at 80% of steps",
                           "val ppl at 100% of steps"]
    assert [r[0] for r in rows] == ["rope"]  # alibi kept no log
    change = [100 * (4.5 / 5.0 - 1), 100 * (5.7 / 6.0 - 1)]
    assert rows[0][1:] == ["0,1", "6.00 ± 0.71", "5.50 ± 0.71", "5.10 ± 0.85",
                           f"{statistics.fmean(change):.1f} ± {statistics.stdev(change):.1f} %"]
    assert "val_curve" in rep.figures


def test_report_convergence_columns_say_the_fraction_of_training_they_show(tmp_path):
    """Issue 49: at 1,500 steps with a validation every 250, "80 %" was step 999 of 1,499 (the last validation at or
    before four fifths: the last third). Each column is the validation step nearest its fraction, labelled with the
    fraction that step is: 1,249, 83 %."""
    folder = tmp_path / "rope_s0"
    (folder / "csv").mkdir(parents=True)
    curve = {s: 10.0 - s / 250 for s in range(249, 1500, 250)}  # Lightning's CSV steps: 249, 499, ..., 1499
    lines = ["epoch,step,val/ppl"] + [f"0,{s},{v}" for s, v in curve.items()]
    (folder / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    write_summary(folder, {"status": "ok", "config": {"pe": {"name": "rope"}, "model": {"name": "tiny"},
                                                     "data": {"seq_len": 128}, "seed": 0},
                           "metrics": {"val/ppl": curve[1499], "extrap/ppl@128": curve[1499]}})
    header, rows = _table(report.build_report([tmp_path], tmp_path / "report").path.read_text(),
                          "Convergence: validation perplexity")
    assert header[2:6] == ["val ppl at 50% of steps", "val ppl at 83% of steps", "val ppl at 100% of steps",
                           "change since 83%"]
    assert rows[0][2:5] == [f"{curve[749]:.2f}", f"{curve[1249]:.2f}", f"{curve[1499]:.2f}"]


def test_report_in_window_retrieval_during_training_reads_the_criterions_csv_log(tmp_path):
    """train/retrieval_acc (the criterion's last check, logged every 5 steps here) at the logged steps nearest 25 / 50 /
    80 / 100 % of 100 steps, mean ± std over the seeds, and the change over the last fifth with a t-interval over
    the seeds: whether in-window retrieval still moved when training stopped. Runs on a fixed budget
    (callbacks.retrieval_criterion.stop=false) only: alibi's run stopped at its criterion and has no row. A seed that
    missed the criterion (seed 1) is in its row all the same; the seeds are listed in order, whatever the folders'."""
    import scipy.stats

    rises = {2: 0.3, 0: 0.5, 1: 0.2}  # seed: accuracy gained over the last fifth (seed 1 never meets 0.95)
    for pe, seed, rise in [*(("rope", s, r) for s, r in rises.items()), ("alibi", 0, 0.6)]:
        folder = tmp_path / f"{pe}_s{seed}"
        (folder / "csv").mkdir(parents=True)
        acc = {s: (s + 1) / 200 for s in range(4, 80, 5)}  # steps 4..79 (CSV steps from 0): 0.025 .. 0.40
        acc |= {s: 0.40 + rise * (s - 79) / 20 for s in range(84, 100, 5)}  # the last fifth
        lines = ["epoch,step,train/loss,train/retrieval_acc"] + [f"0,{s},2.0,{v}" for s, v in acc.items()]
        (folder / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
        stops = pe == "alibi"
        write_summary(folder, {"status": "ok", "config": {
            "pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed,
            "callbacks": {"retrieval_criterion": {"threshold": 0.95, "stop": stops}}},
            "metrics": {"val/ppl": 5.0, "train/retrieval_acc": acc[99],
                        "train/steps_to_criterion": 99 if acc[99] >= 0.95 else math.nan}})
    header, rows = _table(report.build_report([tmp_path], tmp_path / "report").path.read_text(),
                          "Retrieval training: in-window accuracy during training")
    assert header[1:] == ["seeds with a log", "accuracy at 25% of steps", "accuracy at 50% of steps",
                          "accuracy at 80% of steps", "accuracy at 100% of steps",
                          "change since 80% [95 % t over seeds]"]
    assert [r[0] for r in rows] == ["rope"]
    ends = [0.40 + rise for rise in rises.values()]
    half = scipy.stats.t.ppf(0.975, 2) * statistics.stdev(rises.values()) / math.sqrt(3)
    mean = statistics.fmean(rises.values())
    assert rows[0][1:] == ["0,1,2", "0.125 ± 0.000", "0.250 ± 0.000", "0.400 ± 0.000",
                           f"{statistics.fmean(ends):.3f} ± {statistics.stdev(ends):.3f}",
                           f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"]

def test_report_retrieval_along_training_is_a_table_per_probe_kind_at_its_longest_length(tmp_path):
    """eval.at_probes points (summary.json along_training with probe metrics): each kind's accuracy at its longest
    probe length by training tokens, the arithmetic mean over the seeds, the end point last, and its figure."""
    acc = {("rope", 0): [0.2, 0.5, 0.6], ("rope", 1): [0.4, 0.7, 0.6], ("alibi", 0): [0.9, 1.0, 1.0]}
    tokens = [1000, 2000, 3000]
    for (pe, seed), accs in acc.items():
        points = [{"tokens_seen": t, "schedule": "end" if t == tokens[-1] else "mid-schedule",
                   "metrics": {"extrap/ppl@128": 5.0, "probe/mqar/acc@128": 1.0, "probe/mqar/acc@1024": a}}
                  for t, a in zip(tokens, accs)]
        write_summary(tmp_path / f"{pe}_s{seed}", {"status": "ok", "config": {
            "pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed},
            "global_step": 3, "metrics": {"extrap/ppl@128": 5.0, "probe/mqar/acc@128": 1.0,
                                          "probe/mqar/acc@1024": accs[-1]}, "along_training": points,
            "evaluation": {"probes": {"kinds": ["mqar"]}}})
    rep = report.build_report([tmp_path], tmp_path / "report")
    md = rep.path.read_text()
    assert "along_training_mqar" in rep.figures  # the same curves drawn (a linear axis: an accuracy)
    header, rows = _table(md, "Along training: probe/mqar/acc@1024")
    assert header == ["setting", "0.001M", "0.002M", "0.003M end"]
    assert {r[0]: r[1:] for r in rows} == {"rope": ["0.300", "0.600", "0.600"], "alibi": ["0.900", "1.000", "1.000"]}
    assert "Along training: probe/mqar/acc@128" not in md  # the longest length only

def test_report_criterion_table_lists_each_seeds_steps_in_the_order_of_its_seeds_column(tmp_path):
    """A study's folders are found in folder order (a Hydra job number first: seed 1 before seed 0 here); the steps
    and accuracies follow the seeds column, so "not acquired" sits under the seed that missed (it sat under another
    seed's number in the retrieval study v4's reports before)."""
    for folder, seed, step, acc in [("0_rope_s1", 1, 300, 1.0), ("1_rope_s0", 0, math.nan, 0.5)]:
        write_summary(tmp_path / folder, {"status": "ok", "config": {
            "pe": {"name": "rope"}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed,
            "trainer": {"max_steps": 1000}, "callbacks": {"retrieval_criterion": {"stop": False}}},
            "metrics": {"val/ppl": 5.0, "train/retrieval_acc": acc, "train/steps_to_criterion": step}})
    _, rows = _table(report.build_report([tmp_path], tmp_path / "report", figures=False).path.read_text(),
                     "Retrieval training: the in-window criterion")
    assert rows == [["rope", "0,1", "not acquired (by step 1000), 300", "0.500, 1.000"]]

def test_report_rows_split_on_swept_settings_but_not_on_seeds(tmp_path):
    jobs = [
        _job(
            tmp_path,
            {"name": pe},
            s,
            optim={"lr": lr},
            name=f"{pe}-{s}",
            paths={"output_dir": f"/x/{pe}{lr}{s}"},
            **({"matmul_precision": "high", "compile": True,  # seed 0 predates the keys
                "model": {"name": "tiny", "attn_backend": "auto"}} if s else {}),
        )
        for pe in ("alibi", "rope")
        for lr in (1e-3, 3e-3)
        for s in (0, 1)
    ]
    grouping = report.group_rows(jobs)
    assert grouping.shown == ["pe.name", "optim.lr"]  # seed, name, paths and speed keys never define a row
    assert [r.label for r in grouping.rows] == [
        "alibi optim.lr=0.001",
        "alibi optim.lr=0.003",
        "rope optim.lr=0.001",
        "rope optim.lr=0.003",
    ]
    assert all(r.seeds == [0, 1] for r in grouping.rows)


def test_report_fills_the_optimizer_older_runs_lack_and_splits_another(tmp_path):
    """A run recorded before optim had a `_target_` ran conf/optim's optimizer: it joins the rows of new runs that
    name it; a run with another optimizer is its own row."""
    from pelab.training.config import OPTIMIZER

    old = [_job(tmp_path, {"name": "rope"}, s, optim={"lr": 1e-3}) for s in (0, 1)]
    new = [_job(tmp_path, {"name": "rope"}, s, optim={"_target_": OPTIMIZER, "lr": 1e-3}) for s in (2, 3)]
    grouping = report.group_rows([*old, *new])
    assert [(r.label, r.seeds) for r in grouping.rows] == [("rope", [0, 1, 2, 3])]
    other = _job(tmp_path, {"name": "rope"}, 4, optim={"_target_": "my_optimizers.lion", "lr": 1e-3})
    grouping = report.group_rows([*old, *new, other])
    assert grouping.shown == ["pe.name", "optim._target_"]
    assert sorted(r.seeds for r in grouping.rows) == [[0, 1, 2, 3], [4]]


def test_report_labels_rows_by_the_shortest_of_keys_that_vary_together(tmp_path):
    """Two keys telling the same rows apart: the label names the one that prints shortest (the mix ratio,
    not the curriculum list that came with it)."""
    cur = [[0, 32, 0.5], [200, 64, 0.5], [400, 128, 0.1]]
    jobs = [_job(tmp_path, {"name": "rope"}, data={"seq_len": 128, "recall_mix": 0.25, "recall_curriculum": cur}),
            _job(tmp_path, {"name": "rope"}, data={"seq_len": 128, "recall_mix": 0, "recall_curriculum": cur[:2]})]
    grouping = report.group_rows(jobs)
    assert [r.label for r in grouping.rows] == ["rope data.recall_mix=0.25", "rope data.recall_mix=0"]
    assert grouping.also == ["data.recall_curriculum"]  # still recorded as varying with the rows


def test_report_labels_two_corpora_by_their_source_not_by_a_knob_that_came_with_them(tmp_path):
    """Runs of two corpora differ in data.source and in the corpora's own knobs (data.test_fraction, shorter to
    print): the label names the choice, data.source."""
    jobs = [_job(tmp_path, {"name": "rope"}, data={"seq_len": 128, "source": "stdlib", "test_fraction": 0.02}),
            _job(tmp_path, {"name": "rope"}, data={"seq_len": 128, "source": "django_docs", "test_fraction": 0.3})]
    grouping = report.group_rows(jobs)
    assert [r.label for r in grouping.rows] == ["rope data.source=django_docs", "rope data.source=stdlib"]
    assert grouping.also == ["data.test_fraction"]


def test_setup_names_one_fingerprint_per_corpus_and_warns_only_when_a_corpus_has_two(tmp_path):
    """A study across corpora (data.source) has one corpus fingerprint per corpus by design: the Setup list names
    each; two fingerprints within one corpus (another tokenizer or corpus version mixed in) stay a warning."""
    from pelab.report.tables import common_settings

    def job(source: str, key: str) -> report.Job:
        cfg = {"pe": {"name": "rope"}, "model": {"name": "tiny"}, "data": {"seq_len": 128, "source": source}}
        return report.Job(tmp_path, "ok", {"config": cfg, "data": {"fingerprint": {"key": key}}})

    two = [job("stdlib", "a8dd7179ff"), job("stdlib", "a8dd7179ff"), job("django_docs", "5e1fc0aa11")]
    assert "corpus + tokenizer fingerprint: one per corpus, django_docs `5e1fc0aa`, stdlib `a8dd7179`" in (
        common_settings(two))
    mixed = [*two, job("stdlib", "0000ffff00")]
    assert any(line.startswith("**warning: the jobs used different corpora") for line in common_settings(mixed))
    assert "corpus + tokenizer fingerprint: `a8dd7179`" in common_settings(two[:2])


def test_report_labels_variants_and_fills_knobs_older_runs_lack(tmp_path):
    rope = {"name": "rope", "base": 10000.0}
    old_rope = _job(tmp_path, rope)  # written before frequency_fraction / randomized existed
    new_rope = _job(
        tmp_path, {**rope, "frequency_fraction": 1.0, "randomized": {"max_position": None}}, seed=1
    )
    jobs = [
        _job(tmp_path, {**rope, "frequency_fraction": 0.75, "randomized": {"max_position": None}}),
        _job(tmp_path, {**rope, "frequency_fraction": 1.0, "randomized": {"max_position": 2048}}),
        new_rope,
        old_rope,
        _job(tmp_path, {"name": "kerple", "variant": "power"}),
        _job(tmp_path, {"name": "kerple", "variant": "log"}),
        _job(tmp_path, {"name": "alibi"}),
    ]
    rows = report.group_rows(jobs).rows
    # encodings in the order they first appear, each plain scheme (its default knobs) before its variants
    assert [r.label for r in rows] == [
        "rope",  # the old and the new plain runs are one row: two seeds
        "rope pe.frequency_fraction=0.75",
        "rope pe.randomized.max_position=2048",
        "kerple",
        "kerple pe.variant=power",
        "alibi",
    ]
    assert rows[0].seeds == [0, 1]
    # with two training lengths the labels name L, and the plain scheme still comes before its variants
    rows = report.group_rows(
        [
            _job(tmp_path, {**rope, "frequency_fraction": 0.75}),
            _job(tmp_path, rope),
            _job(tmp_path, rope, data={"seq_len": 256}),
        ]
    ).rows
    assert [r.label for r in rows] == ["rope L=128", "rope L=128 pe.frequency_fraction=0.75", "rope L=256"]
    # the defaults are the encoding's config (conf/pe/xpos.yaml), not a list in the report
    assert report.pe_defaults("xpos")["pe.frequency_fraction"] == 1.0
    assert report.pe_defaults("xpos")["pe.scale_base"] == 512.0
    assert report.pe_defaults("no_such_encoding") == {}


def test_report_rows_follow_the_order_the_jobs_ran(tmp_path):
    """Folders in the order given, job folders in numeric order (Hydra's 2 before 10): the report's
    rows, their cells (the mean and its t interval over seeds, n/a, inf, not evaluated) and the bold training
    length."""

    def job(folder: Path, pe: dict, seed: int, ppl: dict) -> None:
        cfg = {"pe": pe, "model": {"name": "micro"}, "data": {"seq_len": 32}, "seed": seed}
        write_summary(
            folder, {"status": "ok", "config": cfg, "metrics": {f"extrap/ppl@{L}": v for L, v in ppl.items()}}
        )

    sweep, more = tmp_path / "sweep", tmp_path / "more"
    job(sweep / "1", {"name": "nope"}, 0, {32: 10.0, 64: 20.0})
    job(sweep / "2", {"name": "rope"}, 0, {32: 5.0, 64: float("nan")})  # n/a at 64
    job(sweep / "10", {"name": "alibi"}, 0, {32: 4.0, 64: float("inf")})  # diverged at 64
    job(sweep / "11", {"name": "rope"}, 1, {32: 7.0, 64: float("nan")})
    job(more / "0", {"name": "rope", "frequency_fraction": 0.5}, 0, {32: 6.0})  # not evaluated at 64
    out = tmp_path / "report"
    assert report.main([str(sweep), str(more), "--out", str(out)]) == 0
    header, rows = _table((out / "report.md").read_text(), "Perplexity, non-overlapping")
    assert header == ["encoding", "seeds", "32", "64"]
    assert rows == [
        ["nope", "0", "**10.00**", "20.00"],
        ["rope", "0,1", "**5.92 [0.70, 50.16] (2 seeds)**", "n/a"],  # exp(mean log 5, log 7 +- 12.71 s / sqrt 2)
        ["rope pe.frequency_fraction=0.5", "0", "**6.00**", "—"],
        ["alibi", "0", "**4.00**", "inf"],
    ]


def test_report_without_summaries_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
    missing = tmp_path / "no_such_sweep"
    assert report.main([str(missing)]) == 2
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert not missing.exists()  # no empty <folder>/report left behind
