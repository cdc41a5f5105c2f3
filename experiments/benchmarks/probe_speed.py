"""Samples per second of the whole probe phase: sample construction + batched scoring (``run_probes``).

    python experiments/benchmarks/probe_speed.py                              # model=tiny, 512 tokens, CPU
    python experiments/benchmarks/probe_speed.py --model small --length 4096 --device cuda --dtype bf16 \
        --batch-tokens 1048576 --samples 100 --json experiments/benchmarks/results/probe_speed_h200.json

The model is the project's GPT from ``conf/model/<name>.yaml`` with random weights (speed does not depend on
them) and ``--pe``; the tokenizer is the byte tokenizer (no corpus needed; the passkey filler is the fixed
sentence). One warm-up call (a few samples) first, then ``run_probes`` is timed on ``--kinds`` x 5 depths x
``--samples`` per cell at one length; construction (``make_probe_samples``) and scoring (``score_samples``)
are timed separately inside the same call. On CUDA the clock stops after a synchronize. The load average
before and after is recorded: on a shared machine the wall-clock numbers move with it, so the process CPU
time is recorded too (samples per CPU-second: at T threads on T idle cores, samples/s is about T times that).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="conf/model/<name>.yaml")
    p.add_argument("--pe", default="rope")
    p.add_argument("--length", type=int, default=512, help="tokens per probe sample")
    p.add_argument("--train-len", type=int, default=None, help="the training length (default: --length)")
    p.add_argument("--kinds", nargs="+", default=None, help="probe kinds (default: the depth x length kinds)")
    p.add_argument("--samples", type=int, default=20, help="samples per (kind, depth) cell")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16 = autocast (CUDA)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens per forward")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", type=Path, default=None, help="write the measurements here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    import torch

    from pelab.conf_values import group_yaml
    from pelab.data import recall
    from pelab.data.tokenizer import ByteTokenizer
    from pelab.encodings import default_pe_config
    from pelab.evaluation import probes
    from pelab.model import build_model

    if a.threads:
        torch.set_num_threads(a.threads)
    kinds = a.kinds or [k for k, e in recall.PROBE_KINDS.items() if e.layout == recall.DEPTH]
    tok = ByteTokenizer()
    torch.manual_seed(0)
    model_cfg = group_yaml("model", a.model)
    model = build_model(model_cfg, default_pe_config(a.pe), tok.vocab_size, a.train_len or a.length)
    model = model.to(a.device).eval()
    cuda = torch.device(a.device).type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if a.dtype == "bf16" else nullcontext()

    # time the two halves inside run_probes (the same functions, wrapped)
    spent = {"construction": 0.0, "scoring": 0.0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if cuda and name == "scoring":
                torch.cuda.synchronize()
            spent[name] += time.perf_counter() - t0
            return out
        return wrapper

    probes.make_probe_samples = timed("construction", probes.make_probe_samples)
    probes.score_samples = timed("scoring", probes.score_samples)

    def run(n: int):
        with autocast:
            return probes.run_probes(
                model, tok, kinds=kinds, lengths=[a.length], samples_per_cell=n, seed=1234, device=a.device,
                batch_size=a.batch_size, batch_tokens=a.batch_tokens, train_length=a.train_len or a.length,
            )

    run(2)  # warm-up: allocator, kernels, the samplers' pools
    spent.update(construction=0.0, scoring=0.0)
    load_before = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    res = run(a.samples)
    if cuda:
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    load_after = os.getloadavg()
    n = sum(c.n for c in res.cells.values())
    out = {
        "model": a.model, "pe": a.pe, "length": a.length, "kinds": kinds, "samples": n,
        "device": a.device, "dtype": a.dtype, "batch_tokens": a.batch_tokens,
        "seconds": seconds, "samples_per_s": n / seconds,
        # CPU time of this process (all its threads): less sensitive than the wall clock to other load
        "cpu_seconds": cpu_seconds, "samples_per_cpu_s": n / cpu_seconds,
        "construction_s": spent["construction"], "scoring_s": spent["scoring"],
        "construction_samples_per_s": n / spent["construction"] if spent["construction"] else None,
        "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": load_after,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "machine": platform.platform(), "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"{n} samples of {a.length} tokens ({', '.join(kinds)}; model={a.model}, pe={a.pe}, {a.device} "
          f"{a.dtype}): {seconds:.2f} s = {out['samples_per_s']:.1f} samples/s; construction "
          f"{spent['construction']:.3f} s, scoring {spent['scoring']:.2f} s; {out['samples_per_cpu_s']:.1f} "
          f"samples per CPU-second; load average {load_before[0]:.2f} -> {load_after[0]:.2f} "
          f"on {os.cpu_count()} CPUs, {out['threads']} torch threads")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
