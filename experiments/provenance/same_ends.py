"""Do an along-training arm's runs end where the runs they repeat ended? (issue 59: the v4 studies' along-training
arms run seeds of a study again with evaluations during training added, which change no weight.) Each finished run
under ALONG is paired with the finished run under REFERENCE of the same encoding, model, corpus, length, scaling and
seed, and its final numbers are compared to the digit: verify.py's `recorded_numbers` (wall-clock values and paths
left out) less the settings and the along-training points, which differ by design -- the metrics, the final
evaluation's details, the model's counts, the data fingerprint and the step reached. Prints a markdown table, one row
a run, and exits 1 when a run differs or has no single pair.

    python experiments/provenance/same_ends.py experiments/lost_in_the_middle/v4/along/runs \
        experiments/lost_in_the_middle/v4/lr1e-3/runs > experiments/lost_in_the_middle/v4/along/ends.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from verify import compare, recorded_numbers  # this folder's rerun check: one definition of "to the digit"

from pelab.report.generated import runs_of

ENDS = ("global_step", "metrics", "evaluation", "model", "data.fingerprint")


def finished(root: Path) -> list[tuple[Path, dict]]:
    """(folder, summary) of every finished run under `root`, wherever it ran (`runs_of`, as restore reads them)."""
    return runs_of(root, Path("/"))


def key(summary: dict) -> tuple[Any, ...]:
    """What a repeated run keeps: encoding, model, corpus, length, scaling, seed."""
    c = summary["config"]
    return (c["pe"]["name"], c["model"]["name"], c["data"].get("source"), c["data"]["seq_len"],
            (c["pe"].get("scaling") or {}).get("type"), c["seed"])


def ends(summary: dict) -> dict[str, Any]:
    return {k: v for k, v in recorded_numbers(summary).items() if k.startswith(ENDS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("along", type=Path, help="the along-training arm's collected runs")
    parser.add_argument("reference", type=Path, help="the collected runs it repeats")
    args = parser.parse_args(argv)
    refs: dict[tuple, list[tuple[Path, dict]]] = {}
    for folder, summary in finished(args.reference):
        refs.setdefault(key(summary), []).append((folder, summary))
    print("| run | its pair | commits | numbers compared | differing | to the digit |")
    print("|---|---|---:|---:|---:|---:|")
    bad = 0
    for folder, summary in finished(args.along):
        pairs = refs.get(key(summary), [])
        commit = summary["provenance"]["code"]["git"][:7]
        if len(pairs) != 1:
            bad += 1
            print(f"| {folder.relative_to(args.along)} | {len(pairs)} runs match | {commit} | — | — | no |")
            continue
        ref_folder, ref = pairs[0]
        a, b = ends(summary), ends(ref)
        diffs = compare(b, a)
        bad += bool(diffs)
        first = f" (first: `{diffs[0]['key']}`)" if diffs else ""
        print(f"| {folder.relative_to(args.along)} | {ref_folder.relative_to(args.reference)} | {commit} / "
              f"{ref['provenance']['code']['git'][:7]} | {len(b)} | {len(diffs)}{first} | {'no' if diffs else 'yes'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
