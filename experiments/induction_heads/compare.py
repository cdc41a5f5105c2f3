"""Paper vs PELab per cell of Mamba's Table 11 (attention rows), with the agreement rule stated in README.md before
the runs: a cell agrees when the paper's value lies inside the 95 % prediction interval for one new run,
x̄ ± t(n−1) · √(s²(1 + 1/n) + p̂(1 − p̂)/256), x̄ and s² the mean and variance of the n seeds' accuracies, p̂ = x̄ (the
paper's 256 test sequences add their binomial variance; where x̄ is 0 or 1, p̂ = (256 x̄ + 2)/260, Agresti-Coull, so
that the paper's 1/256 grid keeps a width). Cells where both are at chance (≤ 10 %) or both at 100 % (the paper's ✓ or
100 and every seed at 100 %) are reported as such and not counted; the informative cells are 2^9-2^11, counted over
the rows whose every seed reached the plateau criterion (README "Budget and plateau criterion": the in-window check
at 1.000 at its last five checks, and 2^9-2^11 within 0.05 of their value 5,000 steps earlier on the run's curve).
numpy / scipy only; reads the summary.json and csv/metrics.csv of each run folder (python -m pelab.report collect).
    python experiments/induction_heads/compare.py <runs folder> [--out table.md]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from pelab.metric_keys import metric_key

LENGTHS = [1 << k for k in range(6, 15)]
INFORMATIVE = (512, 1024, 2048)
CHANCE_CEILING = 0.10
PAPER_N = 256
# Gu & Dao 2023, Table 11, accuracy (%); ✓ = 100 (written 100.0 here, marked in PAPER_CHECK)
PAPER = {
    "sinusoidal": ("MHA-Abs", [100.0, 99.6, 100.0, 58.6, 26.6, 18.8, 9.8, 10.9, 7.8]),
    "rope": ("MHA-RoPE", [100.0, 100.0, 100.0, 83.6, 31.3, 18.4, 8.6, 9.0, 5.5]),
    "xpos": ("MHA-xPos", [100.0, 100.0, 100.0, 99.6, 67.6, 25.4, 7.0, 9.0, 7.8]),
}
PAPER_STEPS = {"sinusoidal": 204_800, "rope": 409_600, "xpos": 409_600}
MIN_SEEDS = 5  # the rule's n >= 5 (README): fewer seeds show their interval, and no verdict
CHECK_EVERY, CURVE_EVERY, LAST_CHECKS, CURVE_BACK, CURVE_MOVE = 500, 2500, 5, 5000, 0.05


def logged(folder: Path, key: str, every: int) -> dict[int, float]:
    """{step: value} of a metric logged every ``every`` steps (csv/metrics.csv names the step before; a row between
    two points repeats the last value, so each point is read at the multiple of ``every`` nearest its row)."""
    out: dict[int, float] = {}
    with open(folder / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get(key) and abs((int(row["step"]) + 1) / every - round((int(row["step"]) + 1) / every)) < 0.01:
                out[round((int(row["step"]) + 1) / every) * every] = float(row[key])
    return out


def plateau(folder: Path) -> tuple[bool, str]:
    """The plateau criterion at the run's last step B: (in-window 1.000 at the last five checks, 2^9-2^11 within
    0.05 of B - 5,000 on the curve), and a few words on what failed."""
    B = int(json.loads((folder / "summary.json").read_text()).get("global_step") or 0)
    checks = logged(folder, "train/retrieval_acc", CHECK_EVERY)
    last = [checks.get(B - i * CHECK_EVERY) for i in range(LAST_CHECKS)]
    if any(v != 1.0 for v in last):
        return False, f"in-window at the last {LAST_CHECKS} checks: {', '.join('—' if v is None else f'{v:.3f}' for v in last[::-1])}"
    moved = []
    for L in INFORMATIVE:
        curve = logged(folder, metric_key("train/induction_acc", L), CURVE_EVERY)
        a, b = curve.get(B), curve.get(B - CURVE_BACK)
        if a is None or b is None or abs(a - b) > CURVE_MOVE:
            moved.append(f"2^{int(math.log2(L))}: " + ("not measured" if a is None or b is None else f"{b:.3f} -> {a:.3f}"))
    return (not moved), "; ".join(moved)


def run_accuracies(folder: Path) -> tuple[dict[str, dict[int, list[float]]], dict[str, list[tuple[str, bool, str]]]]:
    """({pe: {length: [accuracy of each seed]}}, {pe: [(run, plateau reached, why not)]}) from the finished runs
    (status ok) under ``folder``."""
    out: dict[str, dict[int, list[float]]] = {}
    flat: dict[str, list[tuple[str, bool, str]]] = {}
    for path in sorted(folder.glob("*/summary.json")):
        s = json.loads(path.read_text())
        if s.get("status") != "ok":
            continue
        pe, m = s["config"]["pe"]["name"], s["metrics"]
        flat.setdefault(pe, []).append((path.parent.name, *plateau(path.parent)))
        for L in LENGTHS:
            v = m.get(f"probe/induction_heads/acc@{L}")
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                out.setdefault(pe, {}).setdefault(L, []).append(float(v))
    return out, flat


def prediction_interval(accs: list[float]) -> tuple[float, float, float]:
    """(x̄, lo, hi) of the rule's 95 % prediction interval for one new run, in [0, 1] units."""
    x = np.asarray(accs, dtype=float)
    n, mean = len(x), float(x.mean())
    s2 = float(x.var(ddof=1)) if n > 1 else float("nan")
    p = mean if 0.0 < mean < 1.0 else (PAPER_N * mean + 2) / (PAPER_N + 4)
    half = stats.t.ppf(0.975, n - 1) * math.sqrt(s2 * (1 + 1 / n) + p * (1 - p) / PAPER_N) if n > 1 else math.nan
    return mean, mean - half, mean + half


def verdict(paper: float, accs: list[float]) -> tuple[str, tuple[float, float, float]]:
    """'both at chance' / 'both at 100 %' (not counted), else 'agrees' / 'disagrees' by the rule, which needs
    MIN_SEEDS seeds (fewer: the interval is shown, no verdict)."""
    mean, lo, hi = prediction_interval(accs)
    if paper / 100 <= CHANCE_CEILING and mean <= CHANCE_CEILING:
        return "both at chance", (mean, lo, hi)
    if paper == 100.0 and all(a == 1.0 for a in accs):
        return "both at 100 %", (mean, lo, hi)
    if len(accs) < 2:
        return "one seed: no interval", (mean, lo, hi)
    if len(accs) < MIN_SEEDS:
        return f"{len(accs)} seeds < {MIN_SEEDS}: no verdict", (mean, lo, hi)
    return ("agrees" if lo <= paper / 100 <= hi else "disagrees"), (mean, lo, hi)


def table(runs: dict[str, dict[int, list[float]]], plateaus: dict[str, list[tuple[str, bool, str]]]) -> str:
    lines = ["| row | length | paper (%) | PELab mean (%) | seeds | 95 % prediction interval (%) | verdict |",
             "|---|---:|---:|---:|---:|---|---|"]
    counted = {"agrees": 0, "disagrees": 0}
    shown = {"agrees": 0, "disagrees": 0, "no verdict": 0}  # every informative cell, comparable or not
    comparable = {pe: bool(p) and all(ok for _, ok, _ in p) for pe, p in plateaus.items()}
    for pe, (label, values) in PAPER.items():
        for L, paper in zip(LENGTHS, values, strict=True):
            accs = runs.get(pe, {}).get(L, [])
            if not accs:
                lines.append(f"| {label} | 2^{int(math.log2(L))} | {paper:.1f} | — | 0 | — | not run |")
                continue
            v, (mean, lo, hi) = verdict(paper, accs)
            note = ""
            if L in INFORMATIVE:
                note = " (informative)" if comparable.get(pe) else " (informative; row not at plateau: not counted)"
                if comparable.get(pe) and v in counted:
                    counted[v] += 1
                shown[v if v in shown else "no verdict"] += 1
            span = f"[{100 * lo:.1f}, {100 * hi:.1f}]" if math.isfinite(lo) else "—"
            lines.append(f"| {label} | 2^{int(math.log2(L))} | {paper:.1f} | {100 * mean:.1f} | {len(accs)} | {span} | "
                         f"{v}{note} |")
    lines += ["", (f"Informative cells (2^9-2^11) of the rows at plateau: {counted['agrees']} agree, "
                   f"{counted['disagrees']} disagree."),
              "", (f"Every informative cell, shown whether or not its row is at plateau (not a count of the rule's): "
                   f"{shown['agrees']} agree, {shown['disagrees']} disagree, {shown['no verdict']} without a verdict."),
              "", "Plateau criterion per run (README):", ""]
    for pe, (label, _) in PAPER.items():
        for name, ok, why in plateaus.get(pe, []):
            lines.append(f"- {label}, {name}: {'reached' if ok else 'not reached (' + why + ')'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = table(*run_accuracies(args.runs))
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
