"""DDP vs one process: `trainer=ddp_sim` (two gloo ranks on CPU) equals one process that draws both ranks' rows,
and logs once (CSV, summary.json, one W&B run).

Moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import pytest

from helpers.runs import (
    FAST,
    ONE_THREAD,
    compose,
    csv_rows,
    offline_runs,
    run_cli,
    summary_of,
    wandb_records,
    wandb_summary,
)
from pelab.tasks.train import train


@pytest.mark.slow
def test_ddp_sim_equals_one_process_on_the_same_rows(tmp_path):
    run = [*FAST, "evaluate_after_fit=false", "trainer.max_steps=40", "trainer.val_check_interval=20"]
    # As a user runs it (in a subprocess: the spawned ranks attach to this process's W&B service).
    res = run_cli([*run, "trainer=ddp_sim", "logger=wandb", "logger.wandb.mode=offline", f"paths.output_dir={tmp_path / 'ddp'}"],
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
