"""`pelab.report` end to end: the shared 2 x 2 multirun (conftest.sweep) -> summaries -> report.md + PNGs
(+ a W&B report run), failed / unfinished jobs."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys

import pytest

from conftest import FAST, compose, offline_runs, summaries, wandb_records
from pelab import report
from pelab.summary import as_float

LENGTHS = [32, 64, 128]  # conftest.SWEEP_ARGS: eval.lengths=[1,2,4] of data.seq_len=32


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


# ---- the multirun and the report ---------------------------------------------------------------


@pytest.mark.slow
def test_report_has_a_two_row_table_with_mean_and_std_over_seeds(sweep, tmp_path):
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
    assert [r[0] for r in rows] == ["rope", "alibi"]  # display order; seeds aggregated, not rows
    jobs = summaries(sweep)
    for row in rows:
        assert row[1] == "0,1"
        for L, cell in zip(LENGTHS, row[2:]):
            m = re.fullmatch(r"\**([\d.]+) ± ([\d.]+)\**", cell)
            assert m, cell
            vals = [
                as_float(s["metrics"][f"extrap/ppl@{L}"])
                for s in jobs
                if s["config"]["pe"]["name"] == row[0]
            ]
            assert float(m.group(1)) == pytest.approx(statistics.fmean(vals), abs=0.006)
            assert float(m.group(2)) == pytest.approx(statistics.stdev(vals), abs=0.006)
        assert row[2].startswith("**")  # the training length (32) is marked
    for title in (
        "ppl@L / ppl@training length",
        "Perplexity, sliding windows",
        "kv: accuracy",
        "passkey: lost-in-the-middle gap",
        "kv: mean log-probability of the gold answer",
        "Runs",
    ):
        assert f"**{title}" in md or f"## {title}" in md, title
    # kv needs more tokens than 32: the n/a cell says why.
    assert "kv needs at least" in md
    assert "Failed / unfinished" not in md


@pytest.mark.slow
def test_report_figures_are_real_images(sweep, tmp_path):
    import numpy as np
    from PIL import Image

    rep = report.build_report([sweep], tmp_path)
    assert set(rep.figures) == {"ppl_vs_length", "loss_by_position", "probe_heatmaps"}
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
def test_report_lists_failed_and_unfinished_jobs_and_leaves_them_out(sweep, tmp_path):
    from pelab.train import ConfigError, train

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


def test_report_cells_mark_not_applicable_diverged_and_partial():
    assert report.aggregate([]) == "—"
    assert report.aggregate([float("nan"), float("nan")]) == "n/a"
    assert report.aggregate([float("inf"), float("inf")]) == "inf"
    assert report.aggregate([2.0]) == "2.00"
    assert report.aggregate([1.0, 3.0]) == "2.00 ± 1.41"
    assert report.aggregate([1.0, float("inf")]) == "1.00 (1/2 seeds, 1 inf)"


def test_report_rows_split_on_swept_settings_but_not_on_seeds(tmp_path):
    def job(pe, lr, seed):
        cfg = {
            "pe": {"name": pe},
            "model": {"name": "micro"},
            "data": {"seq_len": 32},
            "optim": {"lr": lr},
            "seed": seed,
            "name": f"{pe}-{seed}",
            "paths": {"output_dir": f"/x/{pe}{lr}{seed}"},
        }
        return report.Job(tmp_path, "ok", {"config": cfg, "metrics": {"val/ppl": 10.0}})

    jobs = [job(pe, lr, s) for pe in ("alibi", "rope") for lr in (1e-3, 3e-3) for s in (0, 1)]
    rows, shown = report.group_rows(jobs)
    assert shown == ["pe.name", "optim.lr"]  # seed, name and paths never define a row
    assert [r.label for r in rows] == [
        "rope optim.lr=0.001",
        "rope optim.lr=0.003",
        "alibi optim.lr=0.001",
        "alibi optim.lr=0.003",
    ]
    assert all(r.seeds == [0, 1] for r in rows)


def test_report_labels_variants_and_fills_knobs_older_runs_lack(tmp_path):
    def job(pe: dict, seed: int = 0):
        cfg = {"pe": pe, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed}
        return report.Job(tmp_path, "ok", {"config": cfg, "metrics": {"val/ppl": 10.0}})

    old_rope = job({"name": "rope", "base": 10000.0})  # written before frequency_fraction / randomized existed
    new_rope = job({"name": "rope", "base": 10000.0, "frequency_fraction": 1.0, "randomized": {"max_position": None}},
                   seed=1)
    jobs = [
        job({"name": "rope", "base": 10000.0, "frequency_fraction": 0.75, "randomized": {"max_position": None}}),
        job({"name": "rope", "base": 10000.0, "frequency_fraction": 1.0, "randomized": {"max_position": 2048}}),
        new_rope,
        old_rope,
        job({"name": "kerple", "variant": "power"}),
        job({"name": "kerple", "variant": "log"}),
        job({"name": "alibi"}),
    ]
    rows, _ = report.group_rows(jobs)
    assert [r.label for r in rows] == [
        "rope",  # the old and the new plain runs are one row: two seeds
        "rope pe.frequency_fraction=0.75",
        "rope pe.randomized.max_position=2048",
        "alibi",
        "kerple",
        "kerple pe.variant=power",
    ]
    assert rows[0].seeds == [0, 1]
    assert report.pe_defaults("xpos")["pe.frequency_fraction"] == 1.0  # inherited from RoPE
    assert report.pe_defaults("xpos")["pe.scale_base"] == 512.0


def test_report_without_summaries_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


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
    for key in ("report/ppl_vs_length", "report/probe_heatmaps", "report/tables/"):
        assert key in logged, key
