"""Figures of the PELab-vs-peer comparison from run folders (PELab runs and peer runs alike).

    python experiments/peer/figures.py experiments/peer/results/seeds/*/ --out experiments/peer/figures

* ``ppl_by_scheme.png``: per scheme, non-overlapping perplexity vs evaluation length, PELab and x-transformers,
  mean over seeds with the seeds' min-max as a band;
* ``training_curves.png``: training loss vs step (both implementations see the same batches, so the curves
  compare directly; PELab logs every few steps, the peer every 100) and PELab's validation perplexity vs
  step (is in-window perplexity flat at the end?), mean over seeds per scheme. Seeds without a kept log
  (the first seed-0 runs kept summary.json only) are left out of the curves.

The tables (mean ± std over seeds, each seed) come from ``python -m pelab.report`` on the same folders.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from pelab.evaluation.plots import plain_log_ticks
from pelab.summary import as_float, read_summary

IMPLS = ("PELab", "x-transformers")
STYLE = {"PELab": {"color": "C0", "marker": "o"}, "x-transformers": {"color": "C3", "marker": "s"}}


def load(folder: Path) -> dict:
    """One run: implementation, scheme, seed, ppl by length, training loss curve, validation curve."""
    s = read_summary(folder)
    cfg, m = s.get("config") or {}, s.get("metrics") or {}
    peer = "peer" in s
    ppl = {int(k.split("@")[1]): as_float(v) for k, v in m.items() if k.startswith("extrap/ppl@")}
    if peer:  # x-transformers: the loss curve kept in its summary
        train = pd.DataFrame(s.get("train_curve") or [], columns=["step", "loss"])
        val = pd.DataFrame(columns=["step", "val/ppl"])
    else:  # PELab: the CSV log copied next to summary.json
        log = pd.read_csv(folder / "metrics.csv") if (folder / "metrics.csv").is_file() else pd.DataFrame()
        train = log.dropna(subset=["train/loss"]).rename(columns={"train/loss": "loss"})[["step", "loss"]] \
            if "train/loss" in log else pd.DataFrame(columns=["step", "loss"])
        val = log.dropna(subset=["val/ppl"])[["step", "val/ppl"]] if "val/ppl" in log \
            else pd.DataFrame(columns=["step", "val/ppl"])
    pe = (s.get("peer") or {}).get("scheme") if peer else (cfg.get("pe") or {}).get("name")
    return {"impl": IMPLS[peer], "pe": pe, "seed": cfg.get("seed"), "ppl": ppl, "train": train, "val": val}


def ppl_by_scheme(runs: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = sorted({r["pe"] for r in runs})
    cols = min(3, len(schemes))
    rows = math.ceil(len(schemes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, pe in zip(axes.flat, schemes):
        for impl in IMPLS:
            mine = [r["ppl"] for r in runs if r["pe"] == pe and r["impl"] == impl]
            if not mine:
                continue
            frame = pd.DataFrame(mine)  # seeds x lengths
            lengths = sorted(frame.columns)
            mean, lo, hi = frame[lengths].mean(), frame[lengths].min(), frame[lengths].max()
            ax.plot(lengths, mean, label=f"{impl} (n={len(frame)})", **STYLE[impl])
            ax.fill_between(lengths, lo, hi, alpha=0.2, color=STYLE[impl]["color"])
        ax.set(title=pe, xlabel="evaluation length (tokens)", ylabel="ppl")
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(schemes):]:
        ax.axis("off")
    fig.tight_layout()
    path = out / "ppl_by_scheme.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def training_curves(runs: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["pe"], r["impl"])].append(r)
    schemes = sorted({pe for pe, _ in groups})
    for (pe, impl), rs in sorted(groups.items()):
        i = 2 * schemes.index(pe)  # tab20: the ten dark colours, then the light ones (tab10 repeats at 11)
        color = colormaps["tab20"].colors[i % 20 + i // 20]
        ls = "-" if impl == "PELab" else "--"
        # single-batch losses are noisy and the two log on different steps (the peer every 100): means per
        # 250-step bucket
        train = pd.concat([r["train"] for r in rs]).astype(float)
        if train.empty:  # runs without a kept log (the first seed-0 runs kept summary.json only)
            continue
        train = train.groupby((train["step"] // 250) * 250 + 125)["loss"].mean()
        a.plot(train.index, train.values, ls, color=color, label=f"{pe} {impl}")
        if impl == "PELab":
            val = pd.concat([r["val"] for r in rs]).astype(float).groupby("step")["val/ppl"].mean()
            n = sum(not r["val"].empty for r in rs)
            label = f"{pe} ({n} seed{'s' if n > 1 else ''})"
            b.plot(val.index, val.values, "-", color=color, label=label)
    a.set(xlabel="step", ylabel="training loss (mean per 250 steps and seeds)", ylim=(None, 2.2))
    b.set(xlabel="step", ylabel="PELab validation ppl (mean over seeds)", yscale="log")
    plain_log_ticks(b.yaxis)
    a.legend(fontsize=7, ncol=2)
    b.legend(fontsize=8)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    runs = [load(f) for f in a.folders if (f / "summary.json").is_file()]
    if not runs:
        print("no summary.json in the folders given", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    for path in (ppl_by_scheme(runs, a.out), training_curves(runs, a.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
