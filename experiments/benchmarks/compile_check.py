"""`compile: true` for every encoding: the harness's compiled model (LMModule.net) against the eager one.

    python experiments/benchmarks/compile_check.py                   # all 11 schemes, micro model, CPU
    python experiments/benchmarks/compile_check.py --pe rope t5_bias --json out.json
    python experiments/benchmarks/compile_check.py --device cuda --d 384 --layers 6 --heads 6 --seq 1024

Per scheme, in a fresh interpreter (dynamo's caches and recompile counts are per process): LMModule with
``compile: true`` (the module train.py builds), one training forward + backward of ``LMModule.net`` (the
compiled model) and of ``LMModule.model`` (the same weights, eager) on the same batch; then an eval-mode
forward at another batch size (what validation does). Reports the largest absolute difference of the logits
and of every parameter gradient, the compile time (the first compiled call) and the attention path recorded.
Inductor's on-disk cache is off (``--cache`` turns it on): on this machine a shared cache directory has
handed back broken CPU kernels (torch 2.13).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("nope", "sinusoidal", "learned", "t5_bias", "rope", "xpos", "alibi", "kerple", "sandwich", "fire", "cope")


def run_case(a: argparse.Namespace) -> dict:
    """One scheme in this process: compiled vs eager forward + backward; returns the measurements."""
    import torch
    import torch._inductor.config as inductor_config

    from pelab.encodings import default_pe_config
    from pelab.model.attention.dispatch import attention_paths
    from pelab.training.module import LMModule

    if a.threads:
        torch.set_num_threads(a.threads)
    if not a.cache:
        inductor_config.force_disable_caches = True
    device = torch.device(a.device)
    cfg = {"data": {"seq_len": a.seq}, "compile": True,
           "model": {"n_layers": a.layers, "n_heads": a.heads, "d_model": a.d, "attn_chunk_size": a.chunk},
           "pe": default_pe_config(a.case), "optim": {}}
    torch.manual_seed(0)
    module = LMModule(cfg, vocab_size=a.vocab).to(device)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    params = [p for p in module.model.parameters() if p.requires_grad]

    def step(model) -> tuple:
        logits = model(x)
        grads = torch.autograd.grad(logits.float().square().mean(), params, allow_unused=True)
        return logits.detach(), grads

    module.train()
    eager_logits, eager_grads = step(module.model)
    t0 = time.perf_counter()
    logits, grads = step(module.net)  # compiles
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(module.net)
    compiled_step_s = time.perf_counter() - t0
    grad_err = max(((g - e).abs().max().item() for g, e in zip(grads, eager_grads) if g is not None), default=0.0)
    module.eval()
    xv = torch.randint(0, a.vocab, (a.batch + 1, a.seq), device=device)  # validation: another batch size
    with torch.no_grad():
        eval_err = (module.net(xv) - module.model(xv)).abs().max().item()
    return {
        "scheme": a.case, "ok": True, "logits_max_abs_err": (logits - eager_logits).abs().max().item(),
        "grad_max_abs_err": grad_err, "eval_logits_max_abs_err": eval_err,
        "logits_scale": eager_logits.abs().max().item(),
        "compile_s": compile_s, "compiled_step_s": compiled_step_s,
        "attention": attention_paths()["paths"].get(module.model.pe.name, {}),
    }


def measure(scheme: str, a: argparse.Namespace) -> dict:
    """run_case in a fresh interpreter."""
    cmd = [sys.executable, __file__, "--case", scheme, "--device", a.device, "--d", str(a.d), "--layers",
           str(a.layers), "--heads", str(a.heads), "--seq", str(a.seq), "--batch", str(a.batch), "--vocab",
           str(a.vocab), "--chunk", str(a.chunk)] + (["--threads", str(a.threads)] if a.threads else []) + (
           ["--cache"] if a.cache else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=a.timeout)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"scheme": scheme, "ok": False, "error": lines[-3:], "wall_s": time.perf_counter() - t0}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pe", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tol", type=float, default=1e-4, help="largest accepted |compiled - eager| (fp32)")
    p.add_argument("--cache", action="store_true", help="keep inductor's on-disk cache on")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    if a.case:
        print(json.dumps(run_case(a)))
        return []
    load = os.getloadavg()
    rows = []
    for scheme in a.pe:
        r = measure(scheme, a)
        if r["ok"]:
            errs = (r["logits_max_abs_err"], r["grad_max_abs_err"], r["eval_logits_max_abs_err"])
            r["within_tol"] = max(errs) <= a.tol
            paths = ",".join(r["attention"])
            print(f"{scheme:<11} logits {errs[0]:.1e}  grads {errs[1]:.1e}  eval {errs[2]:.1e}  "
                  f"{'ok' if r['within_tol'] else 'ABOVE TOL'}  compile {r['compile_s']:.1f} s  path {paths}", flush=True)
        else:
            print(f"{scheme:<11} FAILED: {' | '.join(r['error'])}", flush=True)
        rows.append(r)
    good = sum(bool(r.get("within_tol")) for r in rows)
    print(f"{good}/{len(rows)} schemes: compiled == eager within {a.tol}; load average {load[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"config": {k: v for k, v in vars(a).items() if k != "case"},
                                            "loadavg_before": load, "loadavg_after": os.getloadavg(),
                                            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
