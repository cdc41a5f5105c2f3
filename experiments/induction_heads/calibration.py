"""The calibration behind the recipe's open choices and the budget (README "Calibration"): for each run folder, its
settings (task length, init, targets, encoding), its in-window check along training (train/retrieval_acc on 256 fixed
instances at the training length: the first check above 0.5, the first at 1.0, the last), and, for a run extended in
segments by curve.sh, the accuracy at 2^6 ... 2^11 after each segment (its curve/summary-<step>.json). Markdown on
stdout, read from the folders' csv/metrics.csv and summary.json only.
    python experiments/induction_heads/calibration.py <run folder> ...
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def checks(folder: Path) -> list[tuple[int, float]]:
    """(step, in-window accuracy) at each check (the CSV repeats a value on the rows between checks)."""
    out: list[tuple[int, float]] = []
    with open(folder / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            v = row.get("train/retrieval_acc")
            fresh = not out or out[-1][1] != float(v or 0) or int(row["step"]) - out[-1][0] >= 500
            if v and fresh and (not out or int(row["step"]) != out[-1][0]):
                out.append((int(row["step"]) + 1, float(v)))
    return out


def settings(folder: Path) -> str:
    c = json.loads((folder / "summary.json").read_text())["config"]
    pe = c["pe"]["name"] + (f" (scale {c['pe']['scale']})" if c["pe"]["name"] == "sinusoidal" else "")
    return f"L = {c['data']['seq_len']}, {c['model']['init']}, targets {c['data'].get('targets', 'all')}, {pe}"


def first(points: list[tuple[int, float]], at_least: float) -> str:
    return next((f"{s:,}" for s, a in points if a >= at_least), "—")


def main(folders: list[Path]) -> None:
    print("| run | settings | steps trained | in-window > 0.5 from | at 1.0 from | last check |")
    print("|---|---|---:|---:|---:|---|")
    curves = []
    for f in folders:
        pts = checks(f)
        last = f"{pts[-1][1]:.3f} at {pts[-1][0]:,}" if pts else "—"
        steps = json.loads((f / "summary.json").read_text()).get("global_step") or (pts[-1][0] if pts else 0)
        print(f"| {f.name} | {settings(f)} | {steps:,} | {first(pts, 0.5)} | {first(pts, 1.0)} | {last} |")
        if (f / "curve").is_dir():
            curves.append(f)
    for f in curves:
        print(f"\n**{f.name}** ({settings(f)}): accuracy after each segment (final evaluation, 256 instances per length)\n")
        lengths = [64, 128, 256, 512, 1024, 2048]
        print("| step | " + " | ".join(f"2^{n.bit_length() - 1}" for n in lengths) + " |")
        print("|---:|" + "---:|" * len(lengths))
        for p in sorted(f.glob("curve/summary-*.json"), key=lambda p: int(p.stem.split("-")[1])):
            m = json.loads(p.read_text())["metrics"]
            accs = [m.get(f"probe/induction_heads/acc@{n}") for n in lengths]
            print(f"| {int(p.stem.split('-')[1]):,} | " + " | ".join("—" if a is None else f"{a:.3f}" for a in accs) + " |")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
