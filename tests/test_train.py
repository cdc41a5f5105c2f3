"""The harness end to end: real Hydra, a real Lightning Trainer, real W&B offline runs, real DDP (gloo)."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from helpers.runs import FAST, compose, offline_runs, run_cli, summary_of, wandb_records, wandb_summary
from pelab.encodings import available_encodings
from pelab.tasks.train import train
from pelab.training.callbacks.progress_bar import SparseRichProgressBar

# the extension schemes through the harness: the new hooks (content bias, position remap) under Lightning;
# their formulas are in tests/test_encodings_*.py, a plain-loop training check of each in tests/test_model.py
EXTENDED = [["pe=xpos"], ["pe=kerple"], ["pe=sandwich"], ["pe=fire"], ["pe=cope"],
            ["pe=learned", "pe.randomized.max_position=256"]]
# every other encoding of conf/pe/ (a new one is trained here without editing this list)
ENCODINGS = [name for name in available_encodings() if [f"pe={name}"] not in EXTENDED]


class TickingClock(Callback):
    """Test probe, instantiated from the config like any callback: the clock the throughput callback reads (the
    test puts `TickingClock` in place of its `time` module), advanced by exactly 1 s per training step and by
    1000 s per validation batch, so that the rate it logs is known exactly and validation time, were it counted,
    would show."""

    now: ClassVar[float] = 0.0

    @staticmethod
    def perf_counter() -> float:
        return TickingClock.now

    def __getattr__(self, name: str):  # the rest of the time module, unchanged
        return getattr(time, name)

    def on_train_batch_start(self, *_) -> None:
        TickingClock.now += 1.0

    def on_validation_batch_start(self, *_) -> None:
        TickingClock.now += 1000.0


class CountingRichBar(SparseRichProgressBar):
    """Test probe: the global steps at which the bar read its metrics (train/loss ...) while training."""

    reads: ClassVar[list[int]] = []

    def get_metrics(self, trainer, pl_module):
        if trainer.training:
            CountingRichBar.reads.append(trainer.global_step)
        return super().get_metrics(trainer, pl_module)


def _train_losses(output_dir: Path) -> list[float]:
    with open(output_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [[f"pe={pe}"] for pe in ENCODINGS] + EXTENDED, ids=" ".join)
def test_every_encoding_trains_and_lowers_the_loss(overrides, tmp_path):
    pe = overrides[0].removeprefix("pe=")
    cfg = compose([*FAST, *overrides, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=40",
                   "optim.lr=3e-3"], tmp_path)
    summary = train(cfg)
    assert summary["status"] == "ok"
    losses = _train_losses(tmp_path)
    assert len(losses) >= 4
    # Mean of the last logged losses clearly below the first ones (byte-level loss starts near ln 257 = 5.55).
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, losses
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["status"] == "ok" and saved["metrics"]["val/ppl"] > 1.0
    assert saved["config"]["pe"]["name"] == pe
    # the attention path(s) this job's scheme took, and no other scheme's (summary.json "attention")
    paths = saved["attention"]["paths"]
    assert list(paths) == [pe] and saved["attention"]["flex_error"] is None
    assert set(paths[pe]) <= {"sdpa_causal", "sdpa_mask", "explicit"} and paths[pe], paths


def test_unknown_encoding_lists_the_available_ones(tmp_path):
    out = run_cli([*FAST, "pe=bogus"], cwd=tmp_path, timeout=120)
    assert out.returncode != 0
    text = out.stderr + out.stdout
    assert "bogus" in text
    for name in ("alibi", "rope", "t5_bias"):
        assert name in text


@pytest.mark.slow
def test_multirun_makes_one_wandb_run_per_job_in_one_group(sweep):
    """The shared 2 x 2 multirun (conftest's `sweep`, W&B offline): one finished W&B run per job, named like the
    job, all in the sweep's group."""
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 4
    runs = offline_runs(sweep)
    assert len(runs) == 4, runs
    groups, names = set(), set()
    for run in runs:
        s = wandb_summary(run)
        assert s["state"] == "finished"
        assert s["summary"]["val/ppl"] > 1.0
        assert "extrap/ppl@32" in s["summary"]
        names.add(s["name"])
        groups |= {r["run"]["run_group"] for r in wandb_records(run) if r.get("type") == "run"}
    assert names == {f"{pe}-micro-L32-s{seed}" for pe in ("rope", "alibi") for seed in (0, 1)}
    assert groups == {f"sweep-{sweep.parent.name}-{sweep.name}"}  # the group a report of the sweep joins


@pytest.mark.slow
def test_failing_job_is_recorded_and_the_sweep_goes_on(failing_sweep):
    sweep_dir, returncode = failing_sweep
    assert returncode != 0  # the multirun says something failed
    status = {p.parent.name: json.loads(p.read_text())["status"] for p in sweep_dir.glob("*/summary.json")}
    # model.n_heads=3 cannot divide d_model=32: the first jobs fail, the ones after them must still run (the NaN
    # and data.seq_len failures of the other jobs: tests/test_nonfinite.py). Each job is named by the swept keys
    # its name does not show already (data.seq_len is the name's L).
    name = "{}_rope-micro-L{}-s0-model.n_heads={}-debug.inject_nan_at_step={}".format
    jobs = [(L, heads, nan) for L in (32, 100000000) for heads in (3, 2) for nan in ("null", 3)]
    assert status == {name(i, L, heads, nan): "ok" if (L, heads, nan) == (32, 2, "null") else "failed"
                      for i, (L, heads, nan) in enumerate(jobs)}
    # The refused jobs (n_heads=3; data.seq_len=1e8, by the checks that need the data) are refused before W&B starts
    # (no dashboard run for a bad setting); the others have theirs.
    runs = {wandb_summary(r)["name"]: wandb_summary(r)["state"] for r in offline_runs(sweep_dir)}
    assert runs == {name(i, L, 2, nan).partition("_")[2]: "finished" if nan == "null" else "failed"
                    for i, (L, heads, nan) in enumerate(jobs) if heads == 2 and L == 32}


@pytest.mark.slow
def test_resume_from_last_checkpoint_continues_at_the_saved_step(tmp_path):
    cfg = compose([*FAST, "pe=rope", "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=15"], tmp_path)
    assert train(cfg)["global_step"] == 15
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 15
    cfg2 = compose([*FAST, "pe=rope", "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=30",
                    "ckpt_path=auto"], tmp_path)
    summary = train(cfg2)
    assert summary["start_step"] == 15 and summary["global_step"] == 30


def test_pe_diagnostics_figures_reach_disk_and_wandb(tmp_path):
    """The start-of-run diagnostics: parameter count and the encoding's figures, on disk and in the W&B run."""
    import wandb

    from pelab.model import build_model
    from pelab.runs.loggers import log_pe_diagnostics

    model = build_model({"n_layers": 1, "n_heads": 2, "d_model": 16}, {"name": "fire"}, vocab_size=8, train_length=32)
    run = wandb.init(mode="offline", dir=str(tmp_path), project="pelab-test", settings=wandb.Settings(silent=True))
    log_pe_diagnostics(run, model, train_length=32, output_dir=tmp_path)
    run.finish()
    assert (tmp_path / "plots" / "pe_bias_by_distance.png").stat().st_size > 5000
    (path,) = offline_runs(tmp_path)
    s = wandb_summary(path)["summary"]
    assert s["pe/num_learnable_params"] == (32 + 32) + (32 * 2 + 2) + 2
    history = [r for r in wandb_records(path) if r.get("type") == "history"]
    assert any("pe/bias_by_distance" in json.dumps(h) for h in history)


@pytest.mark.slow
def test_terminal_progress_bar_reads_metrics_only_every_refresh_rate_steps(tmp_path):
    """The Rich bar (a terminal) reads the logged metrics (a host sync on CUDA) every `refresh_rate` steps, not
    after every step as Lightning's RichProgressBar does; it still shows them."""
    CountingRichBar.reads.clear()
    fast = [o for o in FAST if not o.startswith("callbacks.progress_bar")]
    cfg = compose([*fast, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=30",
                   "callbacks.progress_bar._target_=test_train.CountingRichBar",
                   "callbacks.progress_bar.refresh_rate=10", "~callbacks.progress_bar.log_refresh_rate"], tmp_path)
    assert train(cfg)["global_step"] == 30
    steps = [s for s in CountingRichBar.reads if 0 < s < 30]  # training steps (not the epoch end)
    assert steps and all(s % 10 == 0 for s in steps), CountingRichBar.reads


@pytest.mark.slow
def test_tokens_per_sec_is_tokens_over_training_time_and_mfu_follows_from_flops_per_token(tmp_path, monkeypatch):
    """train/tokens_per_sec = the tokens of the last log_every_n_steps steps over the training time they took
    (validation excluded); train/mfu = FLOPs/token x tokens/s / the peak (set here: Lightning knows no CPU peak).
    The clock the callback reads is a TickingClock: 1 s per step, 1000 s per validation batch, so the rate is
    exact (a wall-clock comparison was within 5 % only on an idle machine)."""
    import lightning.pytorch.callbacks.throughput_monitor as lightning_throughput

    from pelab.training.callbacks import throughput

    TickingClock.now = 0.0
    clock = TickingClock()
    monkeypatch.setattr(throughput, "time", clock)  # TokenThroughput's readings
    monkeypatch.setattr(lightning_throughput, "time", clock)  # ThroughputMonitor's start of training
    cfg = compose([*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=40",
                   "trainer.log_every_n_steps=10", "trainer.val_check_interval=20",
                   "+callbacks.clock._target_=test_train.TickingClock", "callbacks.throughput.available_flops=1e9"],
                  tmp_path)
    summary = train(cfg)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/tokens_per_sec")]
    assert [int(r["step"]) for r in rows] == [19, 29, 39]  # every 10 steps, from the second reading on
    assert TickingClock.now > 1000  # the validations did tick (20-30 holds one)
    tokens = 10 * 8 * 32  # steps x data.batch_size x data.seq_len, in 10 ticked seconds
    for r in rows:
        assert float(r["train/tokens_per_sec"]) == pytest.approx(tokens / 10.0, rel=1e-9), r
        mfu = summary["model"]["flops_per_token"] * float(r["train/tokens_per_sec"]) / 1e9
        assert float(r["train/mfu"]) == pytest.approx(mfu, rel=1e-5), r


def test_the_schedule_is_linear_warmup_then_cosine_to_its_floor():
    """The learning-rate curve every budget uses (a cosine per run: a budget comparison is separate runs, each
    decaying to the floor at its own last step)."""
    from pelab.training.optimizer import lr_lambda

    warmup, total, floor = 10, 110, 0.1
    assert [lr_lambda(s, warmup, total, floor) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_lambda(10, warmup, total, floor) == pytest.approx(1.0)  # the peak, then cosine
    assert lr_lambda(60, warmup, total, floor) == pytest.approx(floor + (1 - floor) / 2)  # halfway: the midpoint
    assert lr_lambda(35, warmup, total, floor) == pytest.approx(floor + (1 - floor) * (1 + math.cos(math.pi / 4)) / 2)
    assert lr_lambda(110, warmup, total, floor) == pytest.approx(floor) == lr_lambda(500, warmup, total, floor)
    # a quarter of a 6,000-step run is not the end of a 1,500-step run: the rate there is still 86% of the peak
    assert lr_lambda(1500, 75, 6000, floor) > 0.85 > lr_lambda(1500, 75, 1500, floor)


# -- failures after training (moved from tests/test_reliability.py) --------------------------------------------
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

@pytest.mark.slow
def test_probe_lengths_too_short_are_not_applicable(tmp_path):
    summary = train(compose([*FAST, "logger=csv", "data.seq_len=8", "trainer.max_steps=2", "trainer.val_check_interval=2",
                             "eval.lengths=[1]", "probes.lengths=[1]"], tmp_path))
    assert summary["status"] == "ok"
    assert math.isnan(summary["metrics"]["probe/kv/acc@8"]) and math.isnan(summary["metrics"]["probe/passkey/acc@8"])
    rows = summary_of(tmp_path)["evaluation"]["probes"]["rows"]
    assert all(r["note"].startswith("n/a") and "needs at least" in r["note"] for r in rows)


def test_objective_is_the_metric_or_inf_for_a_sweeper():
    """What a Hydra sweeper (Optuna) minimises: the metric, or +inf when the run failed, diverged or lacks it."""
    from pelab.tasks.train import objective

    assert objective({"metrics": {"val/ppl": 3.5, "val/loss": 1.25}}, "val/ppl") == 3.5
    assert objective({"metrics": {"val/ppl": 3}}, "val/ppl") == 3.0
    assert objective({"metrics": {"val/ppl": "3.5"}}, "val/ppl") == 3.5  # as summary.json may hold it
    for summary in ({}, {"metrics": None}, {"metrics": {"val/loss": 1.0}}, {"metrics": {"val/ppl": None}},
                    {"metrics": {"val/ppl": float("nan")}}, {"metrics": {"val/ppl": "nan"}},
                    {"metrics": {"val/ppl": float("inf")}}, {"status": "failed", "metrics": {}}):
        assert objective(summary, "val/ppl") == float("inf"), summary
