"""The learning rate of each scheme from the pilot (README.md "Learning rate", rule stated before the runs): of the
paper's two rates {2e-4, 1e-3}, the one with the higher mean in-window accuracy over the run's last five in-window
checks (train/retrieval_acc every 500 steps on 256 fixed instances at 2^8: steps 8,000-10,000 of the 10,000-step
pilot); a difference under one instance in 256 keeps 2e-4, the paper's rate. Extrapolation never enters.
Reads summary.json and csv/metrics.csv of the pilot's run folders (finished ones only).
    python experiments/induction_schemes/choose_lr.py <pilot folder> [--json lr.json] [--out choice.md]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

PAPER_LR = 2e-4
CHECK_EVERY, LAST_CHECKS, TIE = 500, 5, 1 / 256


def last_checks(folder: Path, step: int) -> list[float]:
    """The in-window accuracy at the last LAST_CHECKS checks up to ``step`` (csv rows name the step before)."""
    seen: dict[int, float] = {}
    with open(folder / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/retrieval_acc") and (int(row["step"]) + 1) % CHECK_EVERY == 0:
                seen[int(row["step"]) + 1] = float(row["train/retrieval_acc"])
    want = [step - i * CHECK_EVERY for i in range(LAST_CHECKS)]
    if missing := [s for s in want if s not in seen]:
        raise ValueError(f"{folder}: no in-window check at step(s) {missing}")
    return [seen[s] for s in want]


def pilot_runs(folder: Path) -> dict[str, dict[float, float]]:
    """{scheme: {lr: mean of its last five in-window checks}} of the finished runs under ``folder``."""
    out: dict[str, dict[float, float]] = {}
    for path in sorted(folder.glob("**/summary.json")):
        s = json.loads(path.read_text())
        if s.get("status") != "ok":
            continue
        cfg = s["config"]
        lr, step = float(cfg["optim"]["lr"]), int(s["global_step"])
        if step != int(cfg["trainer"]["max_steps"]):
            raise ValueError(f"{path.parent}: step {step} of {cfg['trainer']['max_steps']}: not complete")
        accs = last_checks(path.parent, step)
        scheme = out.setdefault(cfg["pe"]["name"], {})
        if lr in scheme:
            raise ValueError(f"{path.parent}: a second pilot run of {cfg['pe']['name']} at lr {lr}")
        scheme[lr] = sum(accs) / len(accs)
    return out


def choose(runs: dict[str, dict[float, float]]) -> dict[str, dict]:
    """{scheme: {"lr": chosen, "pilot": {lr: mean in-window}}}: the higher mean; a tie (< TIE) keeps PAPER_LR."""
    out = {}
    for scheme, by_lr in runs.items():
        if PAPER_LR not in by_lr or len(by_lr) != 2:
            raise ValueError(f"{scheme}: the pilot needs 2e-4 and 1e-3, has {sorted(by_lr)}")
        other = next(lr for lr in by_lr if lr != PAPER_LR)
        lr = other if by_lr[other] - by_lr[PAPER_LR] >= TIE else PAPER_LR
        out[scheme] = {"lr": lr, "pilot": {str(k): v for k, v in sorted(by_lr.items())}}
    return out


def table(choice: dict[str, dict]) -> str:
    lines = ["| scheme | in-window, mean of the last five checks at 2e-4 | at 1e-3 | chosen |", "|---|---:|---:|---:|"]
    for scheme, c in sorted(choice.items()):
        p = c["pilot"]
        lines.append(f"| {scheme} | {p[str(PAPER_LR)]:.3f} | {p[str(1e-3)]:.3f} | {c['lr']:g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pilot", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    choice = choose(pilot_runs(a.pilot))
    if a.json:
        a.json.write_text(json.dumps(choice, indent=1))
    text = table(choice)
    if a.out:
        a.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
