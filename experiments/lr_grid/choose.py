"""The learning rate per scheme and corpus from the grid's runs (README.md, rule stated before the runs): the rate with
the lowest final in-window validation perplexity (`val/ppl` at the last step, the mean over the 512 fixed validation
windows); extrapolation and retrieval never enter. Each cell shows val/ppl with its interval over the windows; a
choice at an end of the grid is flagged (the grid may not bracket the best rate), and so is a choice whose interval
overlaps the runner-up's (the two rates are not told apart by these windows: the lower point estimate still decides).
Reads the summary.json of each finished run folder (python -m pelab.report collect).
    python experiments/lr_grid/choose.py <runs folder> [--out choice.md] [--json choice.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pelab.report.discovery import find_jobs

GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # README "The grid": a choice waits until a scheme and corpus has run at each


@dataclass(frozen=True)
class Cell:
    scheme: str  # pe.name, or the layout preset a model.name tiny-<preset> names
    corpus: str  # data.source
    lr: float
    ppl: float
    lo: float
    hi: float


def cell(summary: dict) -> Cell:
    """One finished run's cell; a run short of its trainer.max_steps is refused (a grid point is a complete run)."""
    cfg, m = summary["config"], summary["metrics"]
    steps = cfg["trainer"]["max_steps"]
    if summary.get("global_step") != steps:
        raise ValueError(f"{summary.get('output_dir')}: step {summary.get('global_step')} of {steps}: not complete")
    name = cfg["model"]["name"]
    scheme = name.removeprefix("tiny-") if name.startswith("tiny-") else cfg["pe"]["name"]
    return Cell(scheme, cfg["data"]["source"], float(cfg["optim"]["lr"]), m["val/ppl"], m["val/ppl_lo"],
                m["val/ppl_hi"])


def choose(cells: list[Cell]) -> dict[tuple[str, str], dict]:
    """Per (scheme, corpus): the chosen rate, the grid, and the two flags."""
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c.scheme, c.corpus)].append(c)
    out = {}
    for key, cs in groups.items():
        rates = sorted({c.lr for c in cs})
        if len(rates) != len(cs):
            raise ValueError(f"{key}: two runs at one rate ({sorted(c.lr for c in cs)})")
        ranked = sorted(cs, key=lambda c: c.ppl)
        best = ranked[0]
        missing = [lr for lr in GRID if lr not in rates]
        out[key] = {
            "lr": None if missing else best.lr,  # a partial grid chooses nothing (a session's end, not a rule)
            "missing": missing,
            "grid": {c.lr: (c.ppl, c.lo, c.hi) for c in sorted(cs, key=lambda c: c.lr)},
            "at_edge": len(rates) > 1 and best.lr in (rates[0], rates[-1]),
            "overlaps_next": len(ranked) > 1 and ranked[1].lo <= best.hi,
        }
    return out


def table(choice: dict[tuple[str, str], dict]) -> str:
    rates = sorted({lr for c in choice.values() for lr in c["grid"]})
    head = "| scheme | corpus | " + " | ".join(f"lr {r:g}" for r in rates) + " | chosen | note |"
    lines = [head, "|---|---|" + "---:|" * len(rates) + "---:|---|"]
    for (scheme, corpus), c in sorted(choice.items()):
        cells = []
        for r in rates:
            if r not in c["grid"]:
                cells.append("n/a")
                continue
            ppl, lo, hi = c["grid"][r]
            text = f"{ppl:.3f} [{lo:.3f}, {hi:.3f}]"
            cells.append(f"**{text}**" if r == c["lr"] else text)
        if c["lr"] is None:
            missing = ", ".join(f"{r:g}" for r in c["missing"])
            lines.append(f"| {scheme} | {corpus} | " + " | ".join(cells) + f" | — | incomplete: not run at {missing} |")
            continue
        note = "; ".join(n for n, on in (("at the grid's end", c["at_edge"]),
                                         ("interval overlaps the runner-up's", c["overlaps_next"])) if on)
        lines.append(f"| {scheme} | {corpus} | " + " | ".join(cells) + f" | {c['lr']:g} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path)
    p.add_argument("--out", type=Path, help="the table (markdown)")
    p.add_argument("--json", type=Path, help="the choice, {scheme: {corpus: lr}}")
    a = p.parse_args(argv)
    choice = choose([cell(j.summary) for j in find_jobs([a.runs]) if j.status == "ok"])
    text = table(choice)
    if a.out:
        a.out.write_text(text)
    if a.json:
        nested: dict[str, dict[str, float]] = defaultdict(dict)
        for (scheme, corpus), c in sorted(choice.items()):
            if c["lr"] is not None:  # an incomplete cell has no rate: a study asking for it stops in one line
                nested[scheme][corpus] = c["lr"]
        a.json.write_text(json.dumps(nested, indent=2) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
