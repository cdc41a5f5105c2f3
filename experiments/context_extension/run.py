"""Context extension study (experiment=context_extension): a rope parent at L = 128, four children fine-tuned
from its weights at 512 tokens with pe.scaling.type none / linear (PI) / ntk / yarn, and one table putting
training-free (the parent's weights under each scaling, before any step: extend.eval_before) and fine-tuned
perplexity side by side at 1-16 x 128 tokens.

    OMP_NUM_THREADS=1 python experiments/context_extension/run.py --out outputs/context_extension
    python experiments/context_extension/run.py --out DIR --table-only    # the table of finished runs
    python experiments/context_extension/run.py --figure experiments/context_extension/results.md  # its plot

Extra arguments after `--` go to every train.py command (e.g. `-- logger=csv`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCALINGS = ("none", "linear", "ntk", "yarn")
LENGTHS = (128, 256, 512, 1024, 2048)


def train(args: list[str], multirun: bool = False) -> None:
    cmd = [sys.executable, str(ROOT / "train.py"), *(["-m"] if multirun else []), "experiment=context_extension", *args]
    print("+", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def read(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def fmt(x: float | str | None) -> str:
    x = float("nan") if x is None else float(x)
    return "n/a" if math.isnan(x) else f"{x:.2f}"


def table(out: Path, child_steps: int) -> str:
    """Markdown: one row per (scaling, regime); columns: ppl at each length (x the parent's length)."""
    parent = read(out / "parent")
    children = {}
    for folder in sorted((out / "children").glob("*/")):
        if (folder / "summary.json").is_file():
            s = read(folder)
            children[s["config"]["pe"]["scaling"]["type"]] = s
    L = parent["config"]["data"]["seq_len"]
    head = "| scaling | regime | " + " | ".join(f"{n} ({n // L}x)" for n in LENGTHS) + " |"
    lines = [head, "|" + "---|" * (len(LENGTHS) + 2)]
    pm = parent["metrics"]
    lines.append(f"| (parent) | trained at {L}, {parent['global_step']} steps | "
                 + " | ".join(fmt(pm.get(f"extrap/ppl@{n}")) for n in LENGTHS) + " |")
    for scaling in SCALINGS:
        s = children.get(scaling)
        if s is None:
            continue
        m = s["metrics"]
        L2 = s["config"]["data"]["seq_len"]
        lines.append(f"| {scaling} | training-free | " + " | ".join(fmt(m.get(f"extrap/step0/ppl@{n}")) for n in LENGTHS)
                     + " |")
        lines.append(f"| {scaling} | fine-tuned at {L2}, {s['global_step']} steps | "
                     + " | ".join(fmt(m.get(f"extrap/ppl@{n}")) for n in LENGTHS) + " |")
    factor = next(iter(children.values()))["config"]["pe"]["scaling"]["factor"] if children else "?"
    notes = [
        "",
        f"Perplexity (byte-level, non-overlapping windows) on the same {parent['evaluation']['extrapolation']['n_tokens']}"
        f" validation tokens at every length; scaling factor {factor}, pe.train_length = {L} (the parent's length).",
        "`training-free` = the parent's weights under that scaling before any fine-tuning step (extend.eval_before); "
        "`none` training-free is the parent itself.",
        f"Wall: parent {parent['wall_seconds']:.0f} s; children "
        + ", ".join(f"{k} {v['wall_seconds']:.0f} s" for k, v in children.items()) + ".",
    ]
    return "\n".join(lines + notes) + "\n"


def figure(results_md: Path, png: Path) -> Path:
    """Perplexity vs length, one line per (scaling, regime), from a table this script wrote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [ln for ln in results_md.read_text().splitlines() if ln.startswith("|")][2:]  # skip head + rule
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, ln in enumerate(lines):
        scaling, regime, *cells = [c.strip() for c in ln.strip("|").split("|")]
        if scaling == "none" and regime == "training-free":
            continue  # the parent itself (its own row)
        ys = [float("nan") if c == "n/a" else float(c) for c in cells]
        tuned = regime.startswith("fine-tuned")
        color = "k" if scaling.startswith("(") else f"C{SCALINGS.index(scaling)}"
        ax.plot(LENGTHS[: len(ys)], ys, "-" if tuned or color == "k" else ":", marker="o" if tuned else ".",
                color=color, label=f"{scaling}, {regime.split(',')[0]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(LENGTHS, [str(L) for L in LENGTHS])
    ax.minorticks_off()
    ax.axvline(128, color="grey", lw=0.8)
    ax.axvline(512, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="evaluation length (tokens; parent L = 128, children fine-tuned at 512)",
           ylabel="perplexity (byte level)", ylim=(4, 22))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "context_extension")
    p.add_argument("--child-steps", type=int, default=200)
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--skip-parent", action="store_true", help="reuse OUT/parent (trained already)")
    p.add_argument("--write", type=Path, default=None, help="also write the table to this file")
    p.add_argument("--figure", type=Path, default=None,
                   help="plot a results.md this script wrote (next to it, as .png) and stop")
    args, extra = p.parse_known_args()
    if args.figure:
        print(figure(args.figure, args.figure.with_suffix(".png")))
        return
    extra = [a for a in extra if a != "--"]
    out = args.out.resolve()
    t0 = time.time()
    if not args.table_only:
        if not args.skip_parent:
            train([f"paths.output_dir={out / 'parent'}", *extra])
        child_len = 512
        train([f"extend.from={out / 'parent'}", "extend.eval_before=true", f"data.seq_len={child_len}",
               # the parent's tokens per step (16 x 128) at 4 x the length; a gentler lr for fine-tuning
               "data.batch_size=4", f"trainer.max_steps={args.child_steps}",
               f"trainer.val_check_interval={args.child_steps}", "optim.lr=5e-4", "optim.warmup_steps=20",
               f"pe.scaling.factor={args.factor}", "pe.scaling.type=" + ",".join(SCALINGS),
               f"hydra.sweep.dir={out / 'children'}", *extra], multirun=True)
        print(f"total wall: {time.time() - t0:.0f} s", flush=True)
    md = table(out, args.child_steps)
    print(md)
    if args.write:
        args.write.write_text(md)


if __name__ == "__main__":
    main()
