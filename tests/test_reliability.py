"""Reliability with real faults: SIGKILL, SIGTERM/SIGUSR1, Ctrl-C, NaN, a dying W&B service, an unreachable
W&B server, DDP vs one process, failing sweep jobs, and a table of bad inputs.

Every run is a real `python train.py` / `eval.py` (or `train(cfg)`) on the micro model, CPU, fp32, one
thread per process (so that two processes compute bit-identical numbers).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from conftest import FAST, ROOT, compose, offline_runs, run_cli, wandb_records, wandb_summary
from pelab.errors import CheckpointError, NonFiniteError
from pelab.tasks.task import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from pelab.tasks.train import train

# 60 steps, last.ckpt every 10 steps and at each validation (every 20), dropout on: an exact resume must
# restore the optimizer, the LR schedule, the data position and the dropout randomness.
RESUME = [*FAST, "trainer.max_steps=60", "trainer.val_check_interval=20", "evaluate_after_fit=false",
          "callbacks.checkpoint.every_n_steps=10", "model.dropout=0.1", "callbacks.throughput=false"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TOL = 1e-6


# -- helpers ---------------------------------------------------------------------------------------
def launch(args: list[str], cwd: Path) -> subprocess.Popen:
    """`python train.py args` in the background (to be signalled), in its own process group like a job in a
    terminal: `ctrl_c` signals the whole group, as the terminal does (the W&B service too). The tests folder
    is importable (for test callbacks such as `SlowSteps`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def ctrl_c(proc: subprocess.Popen) -> float:
    """Ctrl-C in the job's terminal: SIGINT to its process group. Returns the time it was sent."""
    os.killpg(proc.pid, signal.SIGINT)
    return time.monotonic()


def read_until(proc: subprocess.Popen, text: str, timeout: float = 300.0) -> str:
    """The job's output up to the first line containing `text` (the rest stays in the pipe)."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no {text!r} in the output (rc={proc.poll()}):\n{''.join(seen)[-3000:]}")


class SlowSteps(Callback):
    """Test aid, instantiated from the config like any callback: from step `after` on, each step starts with a
    `seconds` sleep, announced on stdout, so that a signal can be sent while a step is under way."""

    def __init__(self, after: int = 0, seconds: float = 5.0):
        self.after, self.seconds = after, seconds

    def on_train_batch_start(self, trainer, *_) -> None:
        if trainer.global_step >= self.after:
            print(f"slow step {trainer.global_step}", flush=True)
            time.sleep(self.seconds)


def wait_until(condition, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc={proc.returncode}) before the condition held:\n"
                                 f"{proc.stdout.read()[-3000:]}")
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.005)


def finish(proc: subprocess.Popen, timeout: float = 300.0) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def csv_rows(folder: Path) -> list[dict]:
    with open(folder / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def history(folder: Path) -> list[tuple]:
    """The CSV log's (step, train/loss, val/loss) rows, values rounded to 6 digits (the resume tolerance)."""
    def num(x: str) -> float | None:
        return round(float(x), 6) if x else None
    return [(int(r["step"]), num(r.get("train/loss")), num(r.get("val/loss"))) for r in csv_rows(folder)]


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_same_run(reference: Path, resumed: Path) -> tuple[float, float, float]:
    """Final weights, optimizer moments, LR schedule and val/loss of two runs agree within TOL."""
    a, b = load(reference / "checkpoints" / "last.ckpt"), load(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 60
    assert a["state_dict"].keys() == b["state_dict"].keys()
    params = max_diff(a["state_dict"], b["state_dict"])
    sa, sb = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    moments = max(max_diff(sa[i], sb[i]) for i in sa)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    val = abs(summary_of(reference)["metrics"]["val/loss"] - summary_of(resumed)["metrics"]["val/loss"])
    print(f"max |param diff| {params:.3g}, max |Adam moment diff| {moments:.3g}, |val/loss diff| {val:.3g}")
    assert params <= TOL and moments <= TOL and val <= TOL
    return params, moments, val


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of the direct children of `pid`, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[1]) == pid:
            out.append((int(stat.parent.name), name))
    return out


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir) -> Path:
    """The uninterrupted run (in this process; bit-identical to the same command line in a subprocess)."""
    out = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PELAB_CACHE_DIR", str(cache_dir))
        for key in [k for k in os.environ if k.startswith("WANDB_")]:
            mp.delenv(key)
        mp.setenv("WANDB_SILENT", "true")
        summary = train(compose(RESUME, out))
    assert summary["status"] == "ok" and summary["global_step"] == 60
    return out


# -- 1. exact resume after SIGKILL -----------------------------------------------------------------
@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(reference, tmp_path):
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.ckpt"
    proc = launch([*RESUME, f"paths.output_dir={out}"], tmp_path)
    wait_until(last.exists, proc)
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: a node dying
    rc, _ = finish(proc)
    assert rc == -signal.SIGKILL
    killed_at = load(last)["global_step"]  # complete file: checkpoints are written atomically
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
    assert first_launch["commit"] == second_launch["commit"] == summary["provenance"]["code"]["git"]
    assert first_launch["started_at"] < second_launch["started_at"] and summary["earlier_status"] == "running"
    # One CSV history: the rows before the checkpoint's step kept, the later ones replaced by the relaunch's,
    # which are the uninterrupted run's; the kept ones are too (the kill may land in the milliseconds between
    # a checkpoint and the write of its own step's train row: that row alone can be missing).
    ref = history(reference)
    kept = [r for r in logged if r[0] < killed_at]
    assert history(out) == kept + [r for r in ref if r[0] >= killed_at]
    assert [r for r in kept if r[0] < killed_at - 1] == [r for r in ref if r[0] < killed_at - 1]
    assert {r for r in kept if r[0] == killed_at - 1} <= {r for r in ref if r[0] == killed_at - 1}

    # No W&B credentials -> offline; the relaunch continues the same W&B run id.
    run_id = (out / "wandb_run_id.txt").read_text().strip()
    assert summary["wandb"]["mode"] == "offline" and summary["wandb"]["id"] == run_id
    runs = offline_runs(out)
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
    first, second = (wandb_summary(r) for r in runs)
    assert first["state"] != "finished" and second["state"] == "finished"
    assert any(r.get("type") == "run" and r["run"].get("resume") for r in wandb_records(runs[1]))
    # README's command to read a run's metrics works on a resumed run (two offline folders).
    (inspect,) = [line.split("#")[0] for line in (ROOT / "README.md").read_text().splitlines()
                  if line.startswith("wandb leet inspect --summary --json")]
    wandb_bin = Path(sys.executable).parent
    res = subprocess.run(["bash", "-c", inspect.replace("<run folder>", str(out))], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{wandb_bin}{os.pathsep}{os.environ['PATH']}"}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["summary"]["val/loss"] == pytest.approx(summary["metrics"]["val/loss"])


# -- 2. preemption and Ctrl-C -----------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_and_ctrl_c_save_stop_and_a_relaunch_continues_exactly(reference, tmp_path):
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.ckpt"
    args = [*RESUME, f"paths.output_dir={out}", "ckpt_path=auto"]  # the same command every time

    proc = launch(args, tmp_path)
    wait_until(last.exists, proc)
    proc.send_signal(signal.SIGTERM)
    rc, log1 = finish(proc)
    assert rc == PREEMPTED_EXIT_CODE, log1[-3000:]
    s1 = summary_of(out)
    assert s1["status"] == "preempted" and s1["preempted"]["signal"] == signal.SIGTERM
    assert s1["preempted"]["step"] == load(last)["global_step"] >= 10

    # Ctrl-C: the same clean stop at the end of the step, status interrupted, exit code 130, the resume hint.
    inode = last.stat().st_ino
    proc = launch(args, tmp_path)
    wait_until(lambda: last.stat().st_ino != inode, proc)  # the relaunch trains and checkpoints again
    sent = ctrl_c(proc)
    rc, log2 = finish(proc)
    print(f"Ctrl-C to exit (step finished, checkpoint saved, W&B finished): {time.monotonic() - sent:.2f} s")
    assert rc == INTERRUPTED_EXIT_CODE, log2[-3000:]
    s2 = summary_of(out)
    assert s2["status"] == "interrupted" and s2["interrupted"]["signal"] == signal.SIGINT
    assert s2["resumed_from"]["step"] == s1["preempted"]["step"] < s2["interrupted"]["step"] < 60
    assert s2["interrupted"]["step"] == load(last)["global_step"] == s2["global_step"]  # the step fields agree
    assert "ckpt_path=auto" in log2 and "Traceback" not in log2 and "KeyboardInterrupt" not in log2

    assert train(compose([*RESUME, "ckpt_path=auto"], out))["status"] == "ok"  # the last relaunch, in-process
    s3 = summary_of(out)
    assert s3["status"] == "ok" and s3["start_step"] == s2["interrupted"]["step"]
    assert_same_run(reference, out)
    assert history(out) == history(reference)  # no hole at the steps the signals stopped

    runs = offline_runs(out)
    assert len(runs) == 3 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1  # one W&B run id
    records = wandb_records(runs[0])
    assert any(r.get("type") == "preempting" for r in records)
    assert wandb_summary(runs[0])["exit_code"] == PREEMPTED_EXIT_CODE
    assert wandb_summary(runs[1])["exit_code"] == INTERRUPTED_EXIT_CODE
    assert wandb_summary(runs[2])["state"] == "finished"


@pytest.mark.slow
def test_a_second_ctrl_c_quits_at_once(tmp_path):
    out = tmp_path / "run"
    proc = launch([*FAST, "logger=csv", "evaluate_after_fit=false", f"paths.output_dir={out}",
                   "+callbacks.slow._target_=test_reliability.SlowSteps", "+callbacks.slow.after=3"], tmp_path)
    read_until(proc, "slow step 3")  # step 3 is under way (asleep for 5 s)
    ctrl_c(proc)
    read_until(proc, "Ctrl-C again to quit at once")
    sent = ctrl_c(proc)
    rc, log = finish(proc, timeout=60)
    elapsed = time.monotonic() - sent
    print(f"second Ctrl-C to exit: {elapsed:.2f} s")
    assert rc == INTERRUPTED_EXIT_CODE and elapsed < 4, log[-3000:]  # not the rest of the 5 s step
    summary = summary_of(out)
    assert summary["status"] == "interrupted" and "Ctrl-C twice" in summary["error"]
    assert not (out / "checkpoints" / "last.ckpt").exists()  # quit without saving


@pytest.mark.slow
def test_preempted_during_evaluation_the_relaunch_reports_the_training_metrics(tmp_path):
    """SIGUSR1 during the end-of-training evaluation; the relaunch has no step left: it reruns the evaluation
    and reports the training metrics saved in the checkpoint (and prints the result table)."""
    out = tmp_path / "run"
    args = [*FAST, "logger=csv", f"paths.output_dir={out}", "ckpt_path=auto"]
    proc = launch(args, tmp_path)
    read_until(proc, "extrapolation:")
    proc.send_signal(signal.SIGUSR1)
    rc, log = finish(proc)
    assert rc == PREEMPTED_EXIT_CODE, log[-3000:]
    s1 = summary_of(out)
    # The training metrics were in summary.json before the evaluation started.
    assert s1["status"] == "preempted" and s1["global_step"] == 30
    assert s1["metrics"]["val/ppl"] > 1 and "train/loss" in s1["metrics"]
    assert not any(k.startswith("probe/") for k in s1["metrics"])

    res = run_cli(args, cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode == 0, res.stderr[-3000:]
    s2 = summary_of(out)
    assert s2["status"] == "ok" and s2["start_step"] == s2["global_step"] == 30
    m = s2["metrics"]
    assert m["val/ppl"] == s1["metrics"]["val/ppl"] and m["train/loss"] == s1["metrics"]["train/loss"]
    assert m["extrap/ppl@64"] > 1 and "probe/kv/acc@32" in m
    # The result table closes the output; third-party notices that ask nothing of the user are gone.
    table = res.stdout[res.stdout.index("Result of rope-micro-L32-s0 (ok, step 30"):]
    assert f"val/ppl {m['val/ppl']:.2f}" in table and f"run folder: {out}" in table
    assert re.search(rf"\n +64 +{m['extrap/ppl@64']:.2f} +\[[^]]+\] +{m['extrap/ppl_ratio@64']:.2f} ", table), table
    assert re.search(r"\n  kv +32 ", table) and re.search(r"\n  passkey +32 ", table), table
    assert "LeafSpec" not in res.stderr + res.stdout and "litlogger" not in res.stderr + res.stdout


def test_an_evaluation_failure_keeps_the_training_metrics(tmp_path, monkeypatch):
    # Bad settings are refused before the first step now, so the failure is injected into the evaluation itself
    # (what a crash there, e.g. a lost file system, looks like to the task).
    from pelab.evaluation import suite

    def broken(*args, **kwargs):
        raise ValueError("evaluation broke")

    monkeypatch.setattr(suite, "run_evaluation", broken)
    cfg = compose([*FAST, "logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=4"], tmp_path)
    with pytest.raises(ValueError, match="evaluation broke"):
        train(cfg)
    summary = summary_of(tmp_path)
    assert summary["status"] == "failed" and summary["global_step"] == 4
    assert summary["metrics"]["val/ppl"] > 1 and "train/loss" in summary["metrics"]


# -- 3. bad numbers --------------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.ckpt"
    res = run_cli([*FAST, "evaluate_after_fit=false", "callbacks.checkpoint.every_n_steps=5",
                   "debug.inject_nan_at_step=12", "logger=csv", f"paths.output_dir={out}"],
                  cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "non-finite loss at step 12" in errors[0] and "optim.nonfinite" in errors[0]
    assert f"{last} (step 10)" in errors[0]
    kept = load(last)  # the NaN step wrote nothing
    assert kept["global_step"] == 10
    assert all(torch.isfinite(t).all() for t in kept["state_dict"].values())
    summary = summary_of(out)
    assert summary["status"] == "failed" and "step 12" in summary["error"]  # (W&B state: the sweep test)


@pytest.mark.parametrize("fused", ["null", "true"], ids=["checked-each-step", "fused-no-sync"])
def test_nan_skip_mode_skips_the_update_up_to_max_skips(fused, tmp_path):
    """Both checks: each step's flag read at once (CPU default), and the fused AdamW's (CUDA default), whose
    kernel skips a flagged update itself and whose flags are read every log_every_n_steps (5) steps."""
    base = [*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=12", "trainer.val_check_interval=12",
            "optim.nonfinite=skip", "debug.inject_nan_at_step=[3,7]", f"optim.fused={fused}"]
    summary = train(compose([*base, "optim.max_skips=2"], tmp_path / "ok"))
    assert summary["status"] == "ok" and summary["nonfinite_skips"] == 2
    assert math.isfinite(summary["metrics"]["val/loss"])
    # AdamW stepped 10 times, not 12: the two NaN steps changed neither the weights nor the moments.
    state = load(tmp_path / "ok" / "checkpoints" / "last.ckpt")["optimizer_states"][0]["state"]
    assert {float(s["step"]) for s in state.values()} == {10.0}

    with pytest.raises(NonFiniteError, match=r"step 7 .*already skipped 1 steps \(optim\.max_skips=1\)"):
        train(compose([*base, "optim.max_skips=1"], tmp_path / "too-many"))


def test_nan_stop_with_the_fused_optimizer_stops_before_any_later_checkpoint(tmp_path):
    """optim.fused=true (no host sync per step): a NaN at step 7 is found when the queued flags are read
    (log_every_n_steps=5: after step 9) and stops the run naming step 7; the update was never applied, and
    no checkpoint was written after it (the last one is step 5's, finite)."""
    out = tmp_path / "run"
    cfg = compose([*FAST, "logger=csv", "evaluate_after_fit=false", "optim.fused=true", "trainer.max_steps=12",
                   "trainer.val_check_interval=12", "callbacks.checkpoint.every_n_steps=5",
                   "debug.inject_nan_at_step=7"], out)
    with pytest.raises(NonFiniteError, match=r"non-finite loss at step 7 .*optim\.nonfinite=stop.*\(step 5\)"):
        train(cfg)
    kept = load(out / "checkpoints" / "last.ckpt")
    assert kept["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in kept["state_dict"].values())


# -- 4. DDP vs one process -------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_sim_equals_one_process_on_the_same_rows(tmp_path):
    run = [*FAST, "evaluate_after_fit=false", "trainer.max_steps=40", "trainer.val_check_interval=20"]
    # As a user runs it (in a subprocess: the spawned ranks attach to this process's W&B service).
    res = run_cli([*run, "trainer=ddp_sim", "logger.wandb.mode=offline", f"paths.output_dir={tmp_path / 'ddp'}"],
                  cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode == 0, res.stderr[-3000:]
    ddp = summary_of(tmp_path / "ddp")
    assert ddp["status"] == "ok" and ddp["global_step"] == 40
    # One process, batch 8 = the 4 rows rank 0 draws + the 4 rows rank 1 draws at each step.
    one = train(compose([*run, "trainer=cpu", "debug.emulate_world_size=2", "logger=csv"], tmp_path / "one"))
    a, b = ddp["metrics"]["val/ppl"], one["metrics"]["val/ppl"]
    rel = abs(a - b) / b
    print(f"val/ppl ddp_sim {a:.6f} vs 1 process {b:.6f}: relative difference {rel:.2e}")
    assert rel < 0.01  # the requirement
    assert rel < 1e-4  # and in fact equal up to float reduction order: the same data, the same gradients
    # Logged once: one row per validation and per logged train step, one summary, one W&B run.
    rows = csv_rows(tmp_path / "ddp")
    assert [r["step"] for r in rows if r.get("val/ppl")] == ["19", "39"]
    train_steps = [r["step"] for r in rows if r.get("train/loss")]
    assert len(train_steps) == len(set(train_steps)) == 8
    (wandb_run,) = offline_runs(tmp_path / "ddp")
    history = [r for r in wandb_records(wandb_run) if r.get("type") == "history"]
    assert sum("val/ppl" in r["history"]["item"] for r in history) == 2
    assert wandb_summary(wandb_run)["summary"]["val/ppl"] == pytest.approx(a, rel=1e-6)
    assert sorted(p.name for p in (tmp_path / "ddp").rglob("summary.json")) == ["summary.json"]


# -- 5. sweep isolation ----------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_and_data_errors_fail_their_sweep_jobs_only(tmp_path):
    sweep = tmp_path / "sweep"
    res = run_cli(["-m", *FAST, "evaluate_after_fit=false", "trainer.max_steps=8", "trainer.val_check_interval=8",
                   "debug.inject_nan_at_step=null,3", "data.seq_len=32,100000000", f"hydra.sweep.dir={sweep}",
                   "logger.wandb.mode=offline"], cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode != 0  # the multirun reports that something failed
    jobs = {}
    for path in sweep.glob("*/summary.json"):
        s = json.loads(path.read_text())
        jobs[(s["config"]["debug"]["inject_nan_at_step"], s["config"]["data"]["seq_len"])] = s
    assert len(jobs) == 4
    assert jobs[(None, 32)]["status"] == "ok"
    assert jobs[(3, 32)]["status"] == "failed" and "non-finite loss at step 3" in jobs[(3, 32)]["error"]
    for nan in (None, 3):
        assert jobs[(nan, 100000000)]["status"] == "failed" and "data.seq_len" in jobs[(nan, 100000000)]["error"]
    states = sorted(wandb_summary(r)["state"] for r in offline_runs(sweep))
    assert states == ["failed", "failed", "failed", "finished"]


# -- 7. W&B failure modes --------------------------------------------------------------------------
@pytest.mark.slow
def test_wandb_server_unreachable_falls_back_to_offline_in_bounded_time(tmp_path):
    out = tmp_path / "run"
    env = {**ONE_THREAD, "WANDB_API_KEY": "0123456789abcdef" * 2 + "01234567",
           "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}
    res = run_cli([*FAST, "evaluate_after_fit=false", "trainer.max_steps=5", "trainer.val_check_interval=5",
                   "logger.wandb.init_timeout=5", f"paths.output_dir={out}"], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "continuing offline" in res.stdout
    info = summary_of(out)["wandb"]
    print(f"W&B init with an unreachable server: {info['init_seconds']} s")
    assert info["mode"] == "offline" and info["init_fallback"] and info["init_seconds"] <= 30
    (run,) = offline_runs(out)
    assert wandb_summary(run)["state"] == "finished"


@pytest.mark.slow
def test_wandb_service_dying_mid_run_does_not_stop_training(tmp_path):
    out = tmp_path / "run"
    proc = launch([*RESUME, "logger.wandb.mode=offline", f"paths.output_dir={out}"], tmp_path)
    wait_until((out / "checkpoints" / "last.ckpt").exists, proc)  # training is under way
    services = [pid for pid, name in children(proc.pid) if name.startswith("wandb")]
    assert services, children(proc.pid)
    for pid in services:
        os.kill(pid, signal.SIGKILL)
    rc, log = finish(proc)
    assert rc == 0, log[-3000:]
    assert "W&B stopped working" in log
    summary = summary_of(out)
    assert summary["status"] == "ok" and summary["global_step"] == 60
    rows = csv_rows(out)
    assert max(int(r["step"]) for r in rows if r.get("train/loss")) >= 55
    assert [r["step"] for r in rows if r.get("val/loss")] == ["19", "39", "59"]


def test_wandb_disabled_runs_without_wandb(tmp_path):
    summary = train(compose([*FAST, "logger=wandb", "logger.wandb.mode=disabled", "evaluate_after_fit=false",
                             "trainer.max_steps=4", "trainer.val_check_interval=4"], tmp_path))
    assert summary["status"] == "ok" and summary.get("wandb") is None
    assert not (tmp_path / "wandb").exists() and (tmp_path / "csv" / "metrics.csv").exists()


# -- 8. bad checkpoints (the other bad inputs: tests/test_bad_inputs.py) ------------------------------------
@pytest.mark.parametrize("overrides, setting", [
    (["model.d_model=64"], "model.d_model=32 in the checkpoint but 64 now"),
    (["tokenizer=bpe"], "tokenizer.kind='byte' in the checkpoint but 'bpe' now"),
    (["pe=alibi"], "pe.name='rope' in the checkpoint but 'alibi' now"),
])
def test_resuming_another_runs_checkpoint_is_refused_before_any_work(reference, overrides, setting, tmp_path):
    ckpt = reference / "checkpoints" / "last.ckpt"
    cfg = compose([*RESUME, "logger=csv", f"ckpt_path={ckpt}", *overrides], tmp_path)
    with pytest.raises(CheckpointError, match=f"ckpt_path={ckpt} belongs to another run: .*{setting}"):
        train(cfg)
    assert "data" not in summary_of(tmp_path)  # refused before the data was built


def test_truncated_checkpoint_is_a_clear_error(reference, tmp_path):
    data = (reference / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"ckpt_path={bad} is not a readable checkpoint"):
        train(compose([*RESUME, "logger=csv", f"ckpt_path={bad}"], tmp_path / "run"))


@pytest.mark.slow
def test_eval_py_prints_one_line_for_a_corrupted_checkpoint(reference, tmp_path):
    data = (reference / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    res = run_cli([f"ckpt_path={bad}", f"paths.output_dir={tmp_path / 'eval'}", "logger=csv"], cwd=tmp_path,
                  script="eval.py", env=ONE_THREAD, timeout=180)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"Error: ckpt_path={bad} is not a readable checkpoint")
    assert summary_of(tmp_path / "eval")["status"] == "failed"


def test_eval_of_a_checkpoint_with_another_encoding_or_vocabulary_is_refused(reference, tmp_path):
    from pelab.errors import ConfigError
    from pelab.tasks.evaluate import evaluate, merged_config

    ckpt = load(reference / "checkpoints" / "last.ckpt")
    eval_cfg = compose(["pe=alibi"], config_name="eval", output_dir=tmp_path)
    with pytest.raises(ConfigError, match="pe=alibi does not fit this checkpoint, trained with pe=rope"):
        merged_config(ckpt["hyper_parameters"]["cfg"], eval_cfg, ["pe"])

    # The tokenizer changed since training: the vocabulary no longer matches the weights.
    ckpt["hyper_parameters"]["vocab_size"] = 300
    other = tmp_path / "other-vocab.ckpt"
    torch.save(ckpt, other)
    cfg = compose([f"ckpt_path={other}", "logger=csv"], config_name="eval", output_dir=tmp_path / "eval")
    with pytest.raises(ConfigError, match="vocabulary has 300 ids but its tokenizer now gives 385"):
        evaluate(cfg)


def test_probe_lengths_too_short_are_not_applicable(tmp_path):
    summary = train(compose([*FAST, "logger=csv", "data.seq_len=8", "trainer.max_steps=2", "trainer.val_check_interval=2",
                             "eval.lengths=[1]", "probes.lengths=[1]"], tmp_path))
    assert summary["status"] == "ok"
    assert math.isnan(summary["metrics"]["probe/kv/acc@8"]) and math.isnan(summary["metrics"]["probe/passkey/acc@8"])
    rows = summary_of(tmp_path)["evaluation"]["probes"]["rows"]
    assert all(r["note"].startswith("n/a") and "needs at least" in r["note"] for r in rows)


# -- provenance ------------------------------------------------------------------------------------------
def test_summary_carries_the_commit_in_a_git_checkout_and_says_so_outside_one(tmp_path, monkeypatch):
    import pelab
    from pelab import provenance

    provenance.code_version.cache_clear()
    here = provenance.code_version()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert here["git"] == head and isinstance(here["dirty"], bool)
    fake = tmp_path / "site-packages" / "pelab"  # an installed copy: no git around it
    fake.mkdir(parents=True)
    monkeypatch.setattr(pelab, "__file__", str(fake / "__init__.py"))
    provenance.code_version.cache_clear()
    try:
        assert provenance.code_version()["git"] == "not a git checkout"
    finally:
        provenance.code_version.cache_clear()
    m = provenance.machine()
    assert m["cpu_count"] >= 1 and m["torch_threads"] >= 1 and m["gpu_count"] == torch.cuda.device_count()


# -- one run per folder; a sweep that resumes where it stopped ---------------------------------------------
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


def test_a_second_launch_into_a_held_folder_is_refused_naming_the_holder(tmp_path):
    from pelab.errors import ConfigError
    from pelab.harness.run_folder import LOCK, claim

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(f"{sleeper.pid}\n")  # a live job holds it
        with pytest.raises(ConfigError, match=rf"in use by a running job \(pid {sleeper.pid}\)"):
            train(compose([*FAST, "logger=csv"], tmp_path))
        assert not (tmp_path / "summary.json").exists()  # refused before anything was written
    finally:
        sleeper.kill()
        sleeper.wait()
    # a dead holder's lock does not keep the folder; the killed writes it left are removed
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".last.ckpt.tmp-{sleeper.pid}"
    stale.write_bytes(b"half a checkpoint")
    with claim(tmp_path):
        assert (tmp_path / LOCK).read_text().split()[0] == str(os.getpid()) and not stale.exists()
    assert not (tmp_path / LOCK).exists()


def test_a_fresh_launch_over_a_run_is_refused_and_keeps_it(tmp_path):
    from pelab.errors import ConfigError

    args = [*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=10", "trainer.val_check_interval=10"]
    first = train(compose(args, tmp_path))
    with pytest.raises(ConfigError, match="holds a run .* relaunch with ckpt_path=auto"):
        train(compose(args, tmp_path))
    with pytest.raises(ConfigError, match="other settings: data.seq_len=32 before but 16 now"):
        train(compose([*args, "data.seq_len=16", "ckpt_path=auto"], tmp_path))
    assert summary_of(tmp_path)["metrics"] == first["metrics"]  # nothing overwritten
    # a relaunch that fails keeps what the run had measured, its failure recorded beside it
    with pytest.raises(ConfigError, match="eval.lengths"):
        train(compose([*args, "ckpt_path=auto", "eval.lengths=[0]"], tmp_path))
    failed = summary_of(tmp_path)
    assert failed["status"] == "failed" and "eval.lengths" in failed["error"] and failed["earlier_status"] == "ok"
    assert failed["metrics"] == first["metrics"] and failed["global_step"] == 10
    assert [x["status"] for x in failed["launches"]] == ["ok", "failed"]


@pytest.mark.slow
def test_eval_at_logs_along_training_and_a_kill_between_points_keeps_the_first(tmp_path):
    """eval.at=[0.5, 1.0] on 60 steps (validation every 20): a point at step 40 (mid-schedule) and the end at 60.
    SIGKILL after the first point's checkpoint; the resumed run keeps it and adds the end."""
    out = tmp_path / "run"
    args = [*FAST, "logger=csv", "trainer.max_steps=60", "trainer.val_check_interval=20",
            "callbacks.checkpoint.every_n_steps=10", "callbacks.throughput=false", "probes.enabled=false",
            "eval.lengths=[1,2]", "eval.tokens=512", "eval.at=[0.5,1.0]", "eval.at_tokens=256", f"paths.output_dir={out}"]
    proc = launch(args, tmp_path)
    wait_until(lambda: (out / "checkpoints" / "last.ckpt").exists() and load(out / "checkpoints" / "last.ckpt")[
        "global_step"] >= 50, proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    killed = summary_of(out)
    assert [p["step"] for p in killed["along_training"]] == [40]
    first = killed["along_training"][0]
    # asked for half of 60 steps; run at the nearest validation step, 40 (validation every 20)
    assert first["schedule"] == "mid-schedule" and first["asked"] == 0.5 and first["fraction"] == pytest.approx(2 / 3)
    assert first["blocks"] == 4
    res = run_cli([*args, "ckpt_path=auto"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary_of(out)
    assert [(p["step"], p["schedule"]) for p in s["along_training"]] == [(40, "mid-schedule"), (60, "end")]
    assert s["along_training"][0] == first  # kept as measured before the kill
    assert s["along_training"][1]["metrics"]["extrap/ppl@64"] == s["metrics"]["extrap/ppl@64"]
    assert s["along_training"][1]["tokens_seen"] == 60 * 8 * 32
    logged = [int(r["step"]) for r in csv_rows(out) if r.get("extrap/ppl@64")]
    validations = sorted({int(r["step"]) for r in csv_rows(out) if r.get("val/ppl")})
    assert logged == [validations[1]]  # the mid-schedule point, logged with the validation at step 40


class WorsenAfter(Callback):
    """A test aid: from step `step` on, noise on the token embeddings before every validation, so that the later
    validations are worse than the one before."""

    def __init__(self, step: int):
        self.step = step

    def on_validation_start(self, trainer, pl_module):
        if trainer.global_step >= self.step:
            with torch.no_grad():
                pl_module.model.tok_emb.weight.add_(torch.randn_like(pl_module.model.tok_emb.weight))


def test_last_ckpt_is_the_last_validation_even_when_validation_got_worse(tmp_path):
    """Validations after step 20 are made worse: best.ckpt stays at 20 while last.ckpt follows every validation
    to the end (Lightning alone left it at the last improvement, so eval.py and extend.from read old weights)."""
    out = tmp_path / "run"
    s = train(compose([*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=40",
                       "trainer.val_check_interval=10", "+callbacks.worse._target_=test_reliability.WorsenAfter",
                       "+callbacks.worse.step=30"], out))
    vals = [float(r["val/ppl"]) for r in csv_rows(out) if r.get("val/ppl")]
    assert len(vals) == 4 and min(vals) == vals[1] < vals[2] and vals[1] < vals[3]  # best at 20, worse after
    assert load(out / "checkpoints" / "last.ckpt")["global_step"] == s["global_step"] == 40
    assert load(out / "checkpoints" / "best.ckpt")["global_step"] == 20


def test_threads_auto_takes_the_free_cores_and_a_number_wins(monkeypatch):
    import os

    import torch

    from pelab.harness import build

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(build, "busy_cores", lambda: (2.6, "2.6 cores busy"))
    try:
        assert build.set_threads("auto", None, 1)["used"] == 5 == torch.get_num_threads()  # 8 cores, ~3 busy
        assert build.set_threads("auto", None, 2)["used"] == 2  # shared by two processes
        monkeypatch.setattr(build, "busy_cores", lambda: (11.0, "11 cores busy"))
        assert build.set_threads("auto", None, 1)["used"] == 1  # never 0
        assert build.set_threads(3, None, 1) == {"used": 3, "chosen_by": "threads=3"}
        assert build.set_threads(3, {"used": 2, "chosen_by": "threads=2"}, 1)["used"] == 2  # a resumed run keeps its own
        monkeypatch.setenv("OMP_NUM_THREADS", "4")
        assert build.set_threads("auto", None, 1) == {"used": 4, "chosen_by": "OMP_NUM_THREADS"}
    finally:
        torch.set_num_threads(before)


def test_busy_cores_sees_a_busy_process():
    """A real process spinning on one core is seen (whatever else the machine runs, at least that core is busy)."""
    import os
    import subprocess
    import sys
    import time

    from pelab.harness.build import busy_cores

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy, how = busy_cores(1.0)
    finally:
        spin.kill()
    assert 0.6 <= busy <= os.cpu_count() + 0.01 and "cores busy" in how, busy
