"""Bad numbers: a NaN loss stops the run naming the step and keeping the last good checkpoint, or is skipped up to
optim.max_skips (per-step check and the fused AdamW's), and in a sweep fails its own job only.

Moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.runs import (
    FAST,
    ONE_THREAD,
    compose,
    load_checkpoint,
    offline_runs,
    run_cli,
    summary_of,
    wandb_summary,
)
from pelab.errors import NonFiniteError
from pelab.tasks.train import train


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
    kept = load_checkpoint(last)  # the NaN step wrote nothing
    assert kept["global_step"] == 10
    assert all(torch.isfinite(t).all() for t in kept["state_dict"].values())
    summary = summary_of(out)
    assert summary["status"] == "failed" and "step 12" in summary["error"]  # (W&B state: the sweep test)


@pytest.mark.slow
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
    state = load_checkpoint(tmp_path / "ok" / "checkpoints" / "last.ckpt")["optimizer_states"][0]["state"]
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
    kept = load_checkpoint(out / "checkpoints" / "last.ckpt")
    assert kept["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in kept["state_dict"].values())


@pytest.mark.slow
def test_nan_and_data_errors_fail_their_sweep_jobs_only(failing_sweep):
    sweep, returncode = failing_sweep
    assert returncode != 0  # the multirun reports that something failed
    jobs = {}
    for path in sweep.glob("*/summary.json"):
        s = json.loads(path.read_text())
        if s["config"]["model"]["n_heads"] == 2:  # (the jobs refused for model.n_heads=3: tests/test_train.py)
            jobs[(s["config"]["debug"]["inject_nan_at_step"], s["config"]["data"]["seq_len"])] = s
    assert len(jobs) == 4
    assert jobs[(None, 32)]["status"] == "ok"
    assert jobs[(3, 32)]["status"] == "failed" and "non-finite loss at step 3" in jobs[(3, 32)]["error"]
    for nan in (None, 3):
        assert jobs[(nan, 100000000)]["status"] == "failed" and "data.seq_len" in jobs[(nan, 100000000)]["error"]
    # W&B: the NaN job's run failed, the good one finished; data.seq_len=1e8 is refused by the checks that need the
    # data, which run before W&B starts (no dashboard run for a refused setting)
    states = sorted(wandb_summary(r)["state"] for r in offline_runs(sweep))
    assert states == ["failed", "finished"]
