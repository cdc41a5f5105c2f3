"""The exact-resume check shared by the kill, signal and checkpoint tests: one configuration (RESUME), trained
uninterrupted once per session (conftest's `reference`), against which an interrupted and relaunched run must agree."""

from __future__ import annotations

from pathlib import Path

from helpers.runs import FAST, csv_rows, load_checkpoint, summary_of

# 60 steps, last.ckpt every 10 steps and at each validation (every 20), dropout on: an exact resume must
# restore the optimizer, the LR schedule, the data position and the dropout randomness.
RESUME = [*FAST, "trainer.max_steps=60", "trainer.val_check_interval=20", "evaluate_after_fit=false",
          "callbacks.checkpoint.every_n_steps=10", "model.dropout=0.1", "callbacks.throughput=false"]
TOL = 1e-6


def history(folder: Path) -> list[tuple]:
    """The CSV log's (step, train/loss, val/loss) rows, values rounded to 6 digits (the resume tolerance)."""
    def num(x: str) -> float | None:
        return round(float(x), 6) if x else None
    return [(int(r["step"]), num(r.get("train/loss")), num(r.get("val/loss"))) for r in csv_rows(folder)]


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
