"""Markdown table of perplexity by length from run folders (PELab runs and peer runs alike).

    python experiments/peer/table.py /tmp/peer20/*/ [--protocol sliding]

One row per summary.json: the run's folder name, its pe.name, model.init and the scale knobs that this
comparison varies (pe.scale, pe.learn_scale, pe.bias_scale; none for a peer run), then val/ppl and ppl@L.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pelab.summary import as_float, read_summary


def row(folder: Path, protocol: str) -> tuple[list[str], dict[int, float]]:
    s = read_summary(folder)
    cfg, m = s.get("config") or {}, s.get("metrics") or {}
    pe = cfg.get("pe") or {}
    peer = "peer" in s  # x-transformers: its own init and scheme details, not PELab's model.* / pe.* knobs
    knobs = "" if peer else ", ".join(f"{k}={pe[k]}" for k in ("scale", "learn_scale", "bias_scale") if k in pe)
    init = "x-transformers" if peer else (cfg.get("model") or {}).get("init", "?")
    key = "ppl" if protocol == "nonoverlap" else "ppl_sliding"
    ppl = {int(k.split("@")[1]): as_float(v) for k, v in m.items() if k.startswith(f"extrap/{key}@")}
    return [folder.name, pe.get("name", "?"), init, knobs, f"{as_float(m.get('val/ppl')):.3f}"], ppl


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--protocol", choices=("nonoverlap", "sliding"), default="nonoverlap")
    a = p.parse_args(argv)
    rows = [row(f, a.protocol) for f in a.folders if (f / "summary.json").is_file()]
    lengths = sorted({L for _, ppl in rows for L in ppl})
    print("| run | pe | init | knobs | val ppl | " + " | ".join(str(L) for L in lengths) + " |")
    print("|---|---|---|---|---:|" + "---:|" * len(lengths))
    for cells, ppl in rows:
        print("| " + " | ".join(cells) + " | " + " | ".join(f"{ppl.get(L, float('nan')):.2f}" for L in lengths) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
