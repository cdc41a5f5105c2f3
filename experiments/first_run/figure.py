"""The README's picture of the first run: its perplexity-vs-length curve beside its retrieval heatmap (depth x
length), side by side in one PNG, from the run's own plots.

    python experiments/first_run/figure.py <run folder> experiments/first_run/first_run.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg
import matplotlib.pyplot as plt


def main(run: Path, out: Path) -> None:
    panels = [run / "plots" / "ppl_vs_length.png", run / "plots" / "probe_mqar_heatmap.png"]
    images = [mpimg.imread(p) for p in panels]
    height = max(im.shape[0] for im in images)
    widths = [im.shape[1] * height / im.shape[0] for im in images]
    fig, axes = plt.subplots(1, 2, figsize=(sum(widths) / 100, height / 100), dpi=100,
                             gridspec_kw={"width_ratios": widths})
    for ax, im in zip(axes, images):
        ax.imshow(im)
        ax.axis("off")
    fig.subplots_adjust(left=0, right=1, top=1, bottom=0, wspace=0.02)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
