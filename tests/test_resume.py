"""Exact resume after a kill: a run SIGKILLed mid-training (a node dying) and relaunched with ckpt_path=auto ends
where the uninterrupted run ends (weights, Adam moments, LR schedule, val/loss, CSV history, one W&B run); a
multirun killed midway resumes where it stopped.

Every run is a real `python train.py` (or `train(cfg)`) on the micro model, CPU, fp32, one thread per process (so
that two processes compute bit-identical numbers). Moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.resume import RESUME, assert_same_run, close_row, history, same_rows
from helpers.runs import (
    FAST,
    ROOT,
    compose,
    finish,
    launch,
    load_checkpoint,
    offline_runs,
    run_cli,
    summary_of,
    wait_until,
    wandb_records,
    wandb_summary,
)
from pelab.tasks.train import train


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(reference, tmp_path):
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.ckpt"
    proc = launch([*RESUME, f"paths.output_dir={out}"], tmp_path)
    wait_until(last.exists, proc)
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: a node dying
    rc, _ = finish(proc)
    assert rc == -signal.SIGKILL
    killed_at = load_checkpoint(last)["global_step"]  # complete file: checkpoints are written atomically
    assert 10 <= killed_at < 60
    logged = history(out)  # what the killed run wrote, rows after its checkpoint too
    # The killed run is visible as such: summary.json says running, with what it had done; the report lists it.
    from pelab.report.discovery import find_jobs
    from pelab.report.tables import failures_table

    killed = summary_of(out)
    assert killed["status"] == "running" and killed["name"] == "rope-micro-L32-s0"
    assert killed["data"]["vocab_size"] > 256 and killed["model"]["params"] > 0
    (job,) = find_jobs([out])
    assert job.status == "running" and failures_table([job]).rows[0][1] == "running"

    # The relaunch (in this process: the same numbers as a subprocess, see `reference`).
    assert train(compose([*RESUME, "ckpt_path=auto"], out))["status"] == "ok"
    summary = summary_of(out)
    assert summary["start_step"] == killed_at and summary["global_step"] == 60
    assert summary["resumed_from"]["step"] == killed_at
    # the thread count the run started with (OMP_NUM_THREADS=1), not this process's: float sums depend on it
    assert killed["threads"] == {"used": 1, "chosen_by": "OMP_NUM_THREADS"}
    assert summary["threads"]["used"] == 1 and summary["threads"]["chosen_by"].startswith("resumed")
    assert_same_run(reference, out)
    # Provenance across the kill: two launches, the killed one still "running" (it never finished), the
    # relaunch ok; the run's wall time is their sum; each records its commit and times.
    first_launch, second_launch = summary["launches"]
    assert first_launch["status"] == "running" and second_launch["status"] == "ok"
    assert first_launch["wall_seconds"] > 0 and second_launch["wall_seconds"] > 0
    assert summary["wall_seconds_total"] == pytest.approx(first_launch["wall_seconds"] + second_launch["wall_seconds"],
                                                          abs=0.02)
    # and its CPU time (what a CPU budget counts): each launch's own process, summed
    assert first_launch["cpu_seconds"] > 0 and second_launch["cpu_seconds"] > 0
    assert summary["cpu_seconds_total"] == pytest.approx(first_launch["cpu_seconds"] + second_launch["cpu_seconds"],
                                                         abs=0.02)
    assert first_launch["commit"] == second_launch["commit"] == summary["provenance"]["code"]["git"]
    assert first_launch["started_at"] < second_launch["started_at"] and summary["earlier_status"] == "running"
    # One CSV history: the rows before the checkpoint's step kept, the later ones replaced by the relaunch's,
    # which are the uninterrupted run's; the kept ones are too (the kill may land in the milliseconds between
    # a checkpoint and the write of its own step's train row: that row alone can be missing).
    ref = history(reference)
    kept = [r for r in logged if r[0] < killed_at]
    assert same_rows(history(out), kept + [r for r in ref if r[0] >= killed_at])
    assert same_rows([r for r in kept if r[0] < killed_at - 1], [r for r in ref if r[0] < killed_at - 1])
    assert all(any(close_row(r, q) for q in ref if q[0] == killed_at - 1) for r in kept if r[0] == killed_at - 1)

    # No W&B credentials -> offline; the relaunch continues the same W&B run id.
    run_id = (out / "wandb_run_id.txt").read_text().strip()
    assert summary["wandb"]["mode"] == "offline" and summary["wandb"]["id"] == run_id
    runs = offline_runs(out)
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
    first, second = (wandb_summary(r) for r in runs)
    assert first["state"] != "finished" and second["state"] == "finished"
    assert any(r.get("type") == "run" and r["run"].get("resume") for r in wandb_records(runs[1]))
    # The documented command to read a run's metrics (README.md or docs/) works on a resumed run (two offline folders).
    (inspect,) = [line.split("#")[0] for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                  for line in page.read_text().splitlines() if line.startswith("wandb leet inspect --summary --json")]
    wandb_bin = Path(sys.executable).parent
    res = subprocess.run(["bash", "-c", inspect.replace("<run folder>", str(out))], capture_output=True, text=True, check=False,
                         env={**os.environ, "PATH": f"{wandb_bin}{os.pathsep}{os.environ['PATH']}"}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["summary"]["val/loss"] == pytest.approx(summary["metrics"]["val/loss"])


SWEEP4 = [*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=40", "trainer.val_check_interval=20",
          "callbacks.checkpoint.every_n_steps=5", "callbacks.throughput=false", "pe=rope,alibi", "seed=0,1"]


def sweep_jobs(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: summary_of(p.parent) for p in sorted(sweep.glob("*/summary.json"))}


@pytest.mark.slow
def test_a_multirun_killed_midway_resumes_where_it_stopped(tmp_path):
    """4 jobs; SIGKILL once the second has a checkpoint. The relaunch into the same sweep folder skips the first
    (finished: its summary untouched), resumes the second from its checkpoint (two launches), runs the rest."""
    sweep = tmp_path / "sweep"
    proc = launch(["-m", *SWEEP4, f"hydra.sweep.dir={sweep}"], tmp_path)
    wait_until(lambda: any(sweep.glob("1_*/checkpoints/last.ckpt")), proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    before = sweep_jobs(sweep)
    assert [s["status"] for s in before.values()] == ["ok", "running"]
    first = next(iter(before))
    res = run_cli(["-m", *SWEEP4, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    after = sweep_jobs(sweep)
    assert len(after) == 4 and all(s["status"] == "ok" and s["global_step"] == 40 for s in after.values())
    assert after[first] == before[first]  # skipped: not rerun, not rewritten
    second = list(after)[1]
    assert len(after[second]["launches"]) == 2 and after[second]["resumed_from"]["step"] >= 5
    assert [len(s["launches"]) for s in after.values()][2:] == [1, 1]
    # a relaunch that would train something else into those folders is refused, job by job, in one line
    other = run_cli(["-m", *SWEEP4, "optim.lr=0.01", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert "holds a run with other settings: optim.lr=0.002 before but 0.01 now" in other.stdout + other.stderr
    assert sweep_jobs(sweep) == after
    # the machine is lost with the sweep folder; the runs collected into the repository are restored into a new one,
    # and its relaunch skips every job (nothing trained again: no checkpoint, the summaries as collected)
    from pelab.report.cli import main as report

    assert report(["collect", str(sweep), str(tmp_path / "runs")]) == 0
    shutil.rmtree(sweep)
    assert report(["restore", str(tmp_path / "runs"), str(sweep)]) == 0
    again = run_cli(["-m", *SWEEP4, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sweep_jobs(sweep) == after and not any(sweep.glob("*/checkpoints"))
