"""Training compute of the runs under a folder (experiments/context_extension_methods/README.md): per run, the
optimizer steps, the rows and tokens per step and the training FLOPs = steps x rows x row length x FLOPs per token,
the FLOPs per token being the run's own estimate (summary.json -> model.flops_per_token: 6 N + 12 n_layers d_model T,
pelab.training.module.flops_per_token, T = the row length). A fine-tuned run counts its own steps only (not its
parent's); an evaluation (eval.py) trains nothing and is left out. Prints a markdown table, one row a setting (the
runs of its seeds together: they have the same compute).

    python experiments/context_extension_methods/flops.py experiments/context_extension_methods/runs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_compute(summary: dict) -> dict | None:
    """The compute of one finished training run; None for an evaluation or an unfinished run."""
    cfg = summary.get("config") or {}
    if summary.get("status") != "ok" or summary.get("task", "train") != "train" or "model" not in summary:
        return None
    rows, length, steps = int(cfg["data"]["batch_size"]), int(cfg["data"]["seq_len"]), int(summary["global_step"])
    per_token = float(summary["model"]["flops_per_token"])
    return {"arm": arm_of(cfg), "steps": steps, "rows": rows, "length": length, "tokens_per_step": rows * length,
            "flops_per_token": per_token, "flops": steps * rows * length * per_token}


def arm_of(cfg: dict) -> str:
    """A readable name of the run's setting: parent / control / full-length / PoSE, with its scaling."""
    extend, scaling = cfg.get("extend") or {}, cfg["pe"]["scaling"]["type"]
    if not extend.get("from"):
        return f"parent (L={cfg['data']['seq_len']})"
    if extend.get("pose_length"):
        return f"PoSE {scaling} (L={cfg['data']['seq_len']} -> {extend['pose_length']})"
    if scaling == "none" and cfg["data"]["seq_len"] == (extend.get("parent") or {}).get("seq_len"):
        return f"control (L={cfg['data']['seq_len']})"
    return f"full-length {scaling} (L={cfg['data']['seq_len']})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args()
    arms: dict[str, list[dict]] = {}
    for folder in args.folders:
        for path in sorted(folder.rglob("summary.json")):
            compute = run_compute(json.loads(path.read_text()))
            if compute is not None:
                arms.setdefault(compute["arm"], []).append(compute)
    print("| setting | runs | steps | rows x length | tokens / step | MFLOP / token | training TFLOP per run |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm, runs in arms.items():
        first = runs[0]
        same = all((r["steps"], r["tokens_per_step"], r["flops"]) == (first["steps"], first["tokens_per_step"],
                                                                      first["flops"]) for r in runs)
        flops = f"{first['flops'] / 1e12:.2f}" if same else " / ".join(f"{r['flops'] / 1e12:.2f}" for r in runs)
        print(f"| {arm} | {len(runs)} | {first['steps']} | {first['rows']} x {first['length']} | "
              f"{first['tokens_per_step']:,} | {first['flops_per_token'] / 1e6:.2f} | {flops} |")


if __name__ == "__main__":
    main()
