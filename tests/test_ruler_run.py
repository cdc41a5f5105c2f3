"""A RULER-style kind end to end: real Hydra composition, a real Lightning Trainer on recall rows of niah_single and
cwe, the probes by depth x length, and the effective length in summary.json (metrics and the probes' record), the
result table and the offline W&B run's summary, equal to the rule recomputed here from the run's own probe cells."""

from __future__ import annotations

import math

import pytest

from helpers.runs import FAST, compose, offline_runs, summary_of, wandb_summary
from pelab.result_table import result_table
from pelab.summary import as_float
from pelab.tasks.train import train

KINDS = ["niah_single", "cwe"]


def wilson_lower(k: int, n: int, z: float = 1.959963984540054) -> float:
    """The Wilson score interval's lower end (Wilson 1927), written out."""
    p = k / n
    return (p + z * z / (2 * n) - z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)


def rule_from_rows(rows: list[dict], kind: str, train_length: int, floor: float, fraction: float) -> float:
    """The effective length from summary.json's probe cells: the accuracy at a length is the mean over its depths;
    its lower bound the Wilson bound of that many right (rounded down) of the n instances the depths share; the longest
    length up to which every bound is >= max(floor, fraction x the in-window accuracy); 0 when none is."""
    cells = [r for r in rows if r["kind"] == kind]
    lengths = sorted({r["length"] for r in cells})

    def accuracy(L: int) -> tuple[float, int]:
        at = [r for r in cells if r["length"] == L]
        return sum(as_float(r["acc"]) for r in at) / len(at), min(r["n"] for r in at)

    threshold = max(floor, fraction * accuracy(train_length)[0])
    best = 0.0
    for L in lengths:
        acc, n = accuracy(L)
        if not wilson_lower(math.floor(acc * n + 1e-9), n) >= threshold:
            break
        best = float(L)
    return best


@pytest.mark.slow
def test_the_effective_length_of_a_ruler_run_reaches_summary_json_the_result_table_and_wandb(tmp_path):
    overrides = [*FAST, "logger=wandb", "logger.wandb.mode=offline", "data.recall_mix=1.0", "data.recall_loss=answers",
                 f"data.recall_kinds=[{','.join(KINDS)}]", f"probes.kinds=[{','.join(KINDS)}]", "probes.lengths=[1,2]",
                 "probes.samples=6", "probes.depths=[0,1]", "eval.lengths=[1]", "trainer.max_steps=6",
                 "trainer.val_check_interval=6", "probes.effective_length.floor=0.0",
                 "probes.effective_length.fraction=0.5"]
    summary = train(compose(overrides, tmp_path))
    assert summary["status"] == "ok"
    saved = summary_of(tmp_path)
    m, rows = saved["metrics"], saved["evaluation"]["probes"]["rows"]
    assert saved["config"]["probes"]["ruler"] == saved["config"]["data"]["recall_ruler"]
    table = result_table(saved)
    assert "effective length: the longest probed length" in table and "max(0.00, 0.50 x in-window" in table
    for kind in KINDS:
        want = rule_from_rows(rows, kind, 32, 0.0, 0.5)
        got = as_float(m[f"probe/{kind}/eff_length"])
        assert got == want, (kind, got, want)
        assert math.isfinite(as_float(m[f"probe/{kind}/eff_threshold"]))
        record = saved["evaluation"]["probes"]["eff_length"]["kinds"][kind]
        assert record["threshold"] == m[f"probe/{kind}/eff_threshold"]
        shown = "n/a   (not acquired in-window)" if got == 0 else f"{got:.0f}   (threshold"
        assert any(line.strip().startswith(kind) and shown in line for line in table.splitlines()), table
    (run,) = offline_runs(tmp_path)
    logged = wandb_summary(run)["summary"]
    for kind in KINDS:
        for key in (f"probe/{kind}/eff_length", f"probe/{kind}/eff_threshold"):
            assert logged[key] == pytest.approx(as_float(m[key])), key
