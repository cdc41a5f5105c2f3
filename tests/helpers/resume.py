"""The exact-resume check shared by the kill, signal and checkpoint tests: one configuration (RESUME), trained
uninterrupted once per session (conftest's `reference`), against which an interrupted and relaunched run must agree."""

from __future__ import annotations

import math
from pathlib import Path

from helpers.runs import FAST, csv_rows, load_checkpoint, summary_of

# 60 steps, last.ckpt every 10 steps and at each validation (every 20), dropout on: an exact resume must
# restore the optimizer, the LR schedule, the data position and the dropout randomness.
# W&B as well (the default logger): a relaunch continues the same W&B run, which the resume tests read back
RESUME = [*FAST, "logger=wandb", "trainer.max_steps=60", "trainer.val_check_interval=20", "evaluate_after_fit=false",
          "callbacks.checkpoint.every_n_steps=10", "model.dropout=0.1", "callbacks.throughput=false"]
TOL = 1e-6


def history(folder: Path) -> list[tuple]:
    """The CSV log's (step, train/loss, val/loss) rows, as logged."""
    def num(x: str) -> float | None:
        return float(x) if x else None
    return [(int(r["step"]), num(r.get("train/loss")), num(r.get("val/loss"))) for r in csv_rows(folder)]


def close_row(a: tuple, b: tuple) -> bool:
    """One step's row of two runs: the same step and metrics, each value within the resume tolerance (relative, as a
    loss of 3-6 carries the weights' 1e-6). Rows rounded to 6 digits and compared equal failed where a value sat on a
    rounding boundary and the runs differed by 1e-7 (an idle CI, 2026-12-06)."""
    return a[0] == b[0] and all((x is None) == (y is None) and (x is None or math.isclose(x, y, rel_tol=TOL, abs_tol=TOL))
                                for x, y in zip(a[1:], b[1:], strict=True))


def same_rows(a: list[tuple], b: list[tuple]) -> bool:
    """Two histories row by row (``close_row``), of one length."""
    return len(a) == len(b) and all(close_row(x, y) for x, y in zip(a, b))


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_same_run(reference: Path, resumed: Path) -> tuple[float, float, float]:
    """Final weights, optimizer moments, LR schedule and val/loss of two runs agree within TOL."""
    a = load_checkpoint(reference / "checkpoints" / "last.ckpt")
    b = load_checkpoint(resumed / "checkpoints" / "last.ckpt")
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
