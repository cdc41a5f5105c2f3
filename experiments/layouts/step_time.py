"""Training step time of a layout against the same model with every layer of one of its layer types (issue 53:
a layout's step should take at most 1.1 x that of its most expensive type).

    OMP_NUM_THREADS=1 python experiments/layouts/step_time.py --layout irope --json out.json
    python experiments/layouts/step_time.py --layout rnope_swa --device cuda --dtype bf16   # GPU (unrun here)

A step is forward + backward + AdamW on a random-token batch held in memory, the study model of
experiment=length_extrapolation (d 128, 4 layers, 4 heads, L 128, batch 16, byte vocabulary). Steps of the
configurations are interleaved (one of each in turn, so they share the machine's load) and timed in process CPU
time at one thread on CPU (the time other processes hold the cores is not counted), wall time on CUDA; the first
--warmup of each are dropped, then the median of --steps. Configurations: the layout, for each distinct entry of
its pattern the model with every layer that entry ("all <entry>": the ratio's denominator is the slowest of these),
and each encoding on every layer without a layout ("plain <pe>", for reference: the fused SDPA path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from pelab import CONF_DIR
from pelab.encodings import default_pe_config
from pelab.model import build_model


def models(layout: list[str], args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    """The layout, 'all <entry>' for each distinct entry, and 'plain <pe>' (every layer the encoding, global, no
    modifier: the model without a layout, for reference), same sizes and seed."""
    out = {}
    plain = dict.fromkeys(e.split("@")[0].split("+")[0] for e in layout)
    for label, pattern in ([("layout", layout)] + [(f"all {e}", [e]) for e in dict.fromkeys(layout)]
                           + [(f"plain {pe}", [pe]) for pe in plain]):
        torch.manual_seed(0)
        spec = {"n_layers": args.layers, "n_heads": args.heads, "d_model": args.d, "layout": pattern}
        pe = "rope" if any(e.split("@")[0].split("+")[0] == "rope" for e in pattern) else pattern[0].split("@")[0]
        out[label] = build_model(spec, default_pe_config(pe.split("+")[0]), args.vocab, args.seq).to(args.device)
    return out


def step_fn(model: torch.nn.Module, args: argparse.Namespace):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else None

    def step() -> None:
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        return time.perf_counter() - t
    t = time.process_time()
    step()
    return time.process_time() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="irope", help="a conf/layout preset")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    layout = list(OmegaConf.load(Path(CONF_DIR) / "layout" / f"{args.layout}.yaml").layout)
    steps = {label: step_fn(m, args) for label, m in models(layout, args).items()}
    times: dict[str, list[float]] = {label: [] for label in steps}
    for i in range(args.warmup + args.steps):
        for label, step in steps.items():
            t = timed(step, args.device == "cuda")
            if i >= args.warmup:
                times[label].append(t)
    median = {label: statistics.median(ts) for label, ts in times.items()}
    worst = max(m for label, m in median.items() if label.startswith("all "))
    for label, m in median.items():
        print(f"{label:40s} {1000 * m:8.1f} ms")
    print(f"layout / most expensive type: {median['layout'] / worst:.3f} (target <= 1.1)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "layout": layout, "median_s": median,
                                               "ratio_to_most_expensive": median["layout"] / worst,
                                               "torch": torch.__version__}, indent=2))


if __name__ == "__main__":
    main()
