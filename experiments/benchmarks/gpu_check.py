"""The Python pieces of experiments/benchmarks/gpu_check.sh; each writes one JSON, ``collect`` joins them.

    python experiments/benchmarks/gpu_check.py attention --json out/attention.json   # flex vs reference, timings
    python experiments/benchmarks/gpu_check.py steps --json out/steps.json           # training step per scheme
    python experiments/benchmarks/gpu_check.py mfu --json out/mfu.json               # MFU, eager and compiled
    python experiments/benchmarks/gpu_check.py collect out                           # -> out/gpu_check.json
    ... --cpu-smoke                                                                  # tiny sizes on CPU

attention  Per score-bias scheme, the encoding's real bias for T consecutive positions (``pe.bias``: what the
           model feeds attention) and random q, k, v (B, H, T, Dh): FlexAttention (forced, with the CUDA
           kernel options) against ``reference_attention`` in fp64, in fp32 and in bf16 (max abs error of the
           output; for learned biases also of the bias parameters' gradients, bf16 fwd+bwd), the SDPA path's
           error beside it, and fwd+bwd times of both paths (bf16, CUDA events, median).
steps      Per scheme, a plain-loop training step (forward, fp32 cross-entropy, backward, fused AdamW) of
           ``conf/model/<model>.yaml`` at (B, T) under bf16 autocast: median ms, ratio to nope, and the attention
           path recorded; bias schemes also with model.attn_backend=flex (``--flex``).
mfu        A bf16 matmul (n^3) measured in this process, then plain-loop steps of ``--mfu-model`` for
           ``--mfu-schemes``, eager and under torch.compile (the harness's static-shape compile):
           MFU = FLOPs/token x tokens/s against the spec peak (``--peak``, H200 dense bf16 989e12) and the
           measured matmul.
collect    The sections' JSONs (and throughput.py's, eval_memory.py's, probe_speed.py's, train.py's summary)
           -> one gpu_check.json and a printed digest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCHEMES = ("nope", "sinusoidal", "learned", "t5_bias", "rope", "xpos", "alibi", "kerple", "sandwich", "fire", "cope")
BIAS_SCHEMES = ("alibi", "t5_bias", "kerple", "sandwich", "fire")  # a score bias: the flex / sdpa_mask choice
H200_BF16_DENSE = 989e12


def machine() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else None,
            "python": platform.python_version(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def timer(device):
    """fn -> seconds of one call: CUDA events on CUDA (no host clock in the loop), perf_counter on CPU."""
    import torch

    def run(fn) -> float:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return run


def median_time(fn, device, warmup: int, repeats: int) -> float:
    run = timer(device)
    for _ in range(warmup):
        run(fn)
    return statistics.median(run(fn) for _ in range(repeats))


def save_partial(a, result: dict) -> None:
    """Write what a section has so far: a section cut by its time limit still leaves its finished rows."""
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"section": a.section, "partial": True, **result}, indent=1, default=str))


def guarded(name: str, fn, *args) -> dict:
    """fn(*args) as a dict; an exception becomes {"error": ...} (one section's failure must not end the check)."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - recorded in the JSON, the check goes on
        traceback.print_exc()
        return {"error": f"{name}: {type(err).__name__}: {' '.join(str(err).split())[:500]}"}


# ---- attention: FlexAttention vs the reference, and timings ---------------------------------------------------
def attention_case(scheme: str, a, device) -> dict:
    import torch

    from pelab.encodings import build_encoding
    from pelab.model.attention.dispatch import reference_attention
    from pelab.model.attention.flex import flex_biased_attention
    from pelab.model.attention.sdpa import chunked_biased_attention

    torch.manual_seed(0)
    B, H, T, Dh = a.batch, a.heads, a.seq, a.d // a.heads
    pe = build_encoding({"name": scheme}, a.d, H, train_length=T).to(device)  # FIRE: init_L = T
    pos = torch.arange(T, device=device)
    bias = pe.bias(pos, consecutive=True)  # what the model hands attention on this device
    q, k, v = (torch.randn(B, H, T, Dh, device=device) for _ in range(3))
    full = pe.score_bias(pos, pos).double()
    with torch.no_grad():
        ref = reference_attention(q.double(), k.double(), v.double(), full)
    out = {"bias_form": type(bias).__name__}
    flex_dtypes = a.flex_dtypes
    for dtype_name in ("fp32", "bf16"):
        dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        with torch.no_grad():
            sdpa = chunked_biased_attention(qd, kd, vd, bias, chunk_size=a.chunk)
            out[f"sdpa_err_{dtype_name}"] = (sdpa.double() - ref).abs().max().item()
            if dtype_name in flex_dtypes:
                flex = guarded("flex", lambda q_=qd, k_=kd, v_=vd: {"y": flex_biased_attention(q_, k_, v_, bias, strict=True)[0]})
                out[f"flex_err_{dtype_name}"] = (flex["y"].double() - ref).abs().max().item() if "y" in flex else None
                if "error" in flex:
                    out[f"flex_error_{dtype_name}"] = flex["error"]
    params = [p for p in pe.parameters() if p.requires_grad]
    if params and "bf16" in flex_dtypes:  # a learned bias: its gradients through flex vs the reference (fp32)
        out.update(guarded("flex_grad", learned_bias_grads, pe, params, q, k, v, a, device))
    if params and pe.bias_translation_invariant:
        out.update(guarded("bias_grad", bias_gradient_timing, pe, params, a, device))
    if device.type == "cuda" and not a.skip_timing:
        out.update(guarded("timing", attention_timing, pe, q, k, v, a, device))
    return out


def bias_gradient_timing(pe, params, a, device) -> dict:
    """A learned translation-invariant bias, the (H, T, T) causal mask built and differentiated: through a
    gather of the T^2 pairs (``causal_bias(score_bias(pos, pos))``, the CUDA path before: a scatter-add
    backward) vs the per-distance table (``DistanceBias.full``: anti-diagonal sums). ms of forward + backward
    for a given upstream gradient, and the two gradients' largest difference relative to their largest entry."""
    import torch

    from pelab.score_bias import causal_bias, distance_bias

    T = a.seq
    pos = torch.arange(T, device=device)
    upstream = torch.randn(pe.n_heads, T, T, device=device).tril()  # a causal mask's gradient: 0 above the diagonal

    def pairs():
        return torch.autograd.grad(causal_bias(pe.score_bias(pos, pos)).mask, params, upstream)

    def per_distance():
        return torch.autograd.grad(distance_bias(pe, T, device).full(), params, upstream)

    rel = max(((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for g, r in zip(per_distance(), pairs()))
    return {"bias_grad_ms_gather": median_time(pairs, device, 2, a.repeats) * 1e3,
            "bias_grad_ms_per_distance": median_time(per_distance, device, 2, a.repeats) * 1e3,
            "bias_grad_rel_diff": rel}


def learned_bias_grads(pe, params, q, k, v, a, device) -> dict:
    import torch

    from pelab.model.attention.dispatch import reference_attention
    from pelab.model.attention.flex import flex_biased_attention

    T = q.shape[-2]
    pos = torch.arange(T, device=device)
    w = torch.randn_like(q)
    ref = reference_attention(q, k, v, pe.score_bias(pos, pos))
    want = torch.autograd.grad((ref * w).sum(), params)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    y, _ = flex_biased_attention(qb, kb, vb, pe.bias(pos, consecutive=True), strict=True)
    got = torch.autograd.grad((y.float() * w).sum(), params)
    rel = max(((g - r).norm() / r.norm().clamp_min(1e-30)).item() for g, r in zip(got, want))
    return {"flex_bf16_param_grad_rel_err": rel}


def attention_timing(pe, q, k, v, a, device) -> dict:
    """fwd+bwd ms at this shape in bf16: flex (CUDA kernel options) vs the SDPA path (what auto takes)."""
    import torch

    from pelab.model.attention.flex import flex_biased_attention
    from pelab.model.attention.sdpa import chunked_biased_attention

    T = q.shape[-2]
    pos = torch.arange(T, device=device)
    qb, kb, vb = (t.bfloat16().requires_grad_() for t in (q, k, v))

    def fwd_bwd(path: str):
        def run():
            bias = pe.bias(pos, consecutive=True)  # rebuilt per call, as per forward (learned: its gradient too)
            if path == "flex":
                y = flex_biased_attention(qb, kb, vb, bias, strict=True)[0]
            else:
                y = chunked_biased_attention(qb, kb, vb, bias, chunk_size=a.chunk)
            y.sum().backward()
        return run

    out = {}
    for path in ("sdpa_mask", "flex"):
        t = guarded(path, lambda p=path: {"s": median_time(fwd_bwd(p), device, 3, a.repeats)})
        out[f"{path}_fwd_bwd_ms"] = t["s"] * 1e3 if "s" in t else None
        if "error" in t:
            out[f"{path}_timing_error"] = t["error"]
    return out


def cmd_attention(a) -> dict:
    import torch

    device = torch.device(a.device)
    rows = {}
    for scheme in a.schemes:
        t0 = time.perf_counter()
        rows[scheme] = guarded(scheme, attention_case, scheme, a, device)
        rows[scheme]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"attention {scheme}: {json.dumps(rows[scheme])}", flush=True)
        save_partial(a, {"rows": rows})
    return {"shape": {"B": a.batch, "H": a.heads, "T": a.seq, "Dh": a.d // a.heads}, "rows": rows}


# ---- training steps ---------------------------------------------------------------------------------------------
def model_config(name: str, chunk: int | None = None, backend: str = "auto") -> dict:
    from omegaconf import OmegaConf

    from pelab.conf_values import group_yaml

    cfg = OmegaConf.to_container(group_yaml("model", name))
    cfg["attn_backend"] = backend
    if chunk:
        cfg["attn_chunk_size"] = chunk
    return cfg


def plain_step_time(scheme: str, model_cfg: dict, a, device, compile_model: bool = False) -> dict:
    """Median ms of a plain-loop training step (bf16 autocast on CUDA), and what happened in it."""
    import torch
    import torch.nn.functional as F

    from pelab.encodings import default_pe_config
    from pelab.model import attention_paths, build_model, reset_attention_paths
    from pelab.training.module import flops_per_token

    reset_attention_paths()
    torch.manual_seed(0)
    model = build_model(model_cfg, default_pe_config(scheme), a.vocab, a.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    net = torch.compile(model, dynamic=False) if compile_model else model  # as LMModule.net
    batch = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device)
    x, y = batch[:, :-1], batch[:, 1:]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step():
        with autocast:
            logits = net(x)
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()  # the first step: compiles (when compiled) and allocates
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    seconds = median_time(step, device, a.warmup, a.steps)
    tokens_per_s = a.batch * a.seq / seconds
    return {"step_ms": seconds * 1e3, "first_step_s": first_s, "tokens_per_s": tokens_per_s,
            "flops_per_token": flops_per_token(model, a.seq),
            "attention": attention_paths()["paths"].get(model.pe.name, {})}


def cmd_steps(a) -> dict:
    import torch

    device = torch.device(a.device)
    rows = {}
    for scheme in a.schemes:
        for backend in ("auto", "flex") if scheme in a.flex else ("auto",):
            key = scheme if backend == "auto" else f"{scheme}+flex"
            r = guarded(key, plain_step_time, scheme, model_config(a.model, a.chunk, backend), a, device)
            rows[key] = r
            print(f"steps {key}: {r.get('step_ms', r.get('error'))} ms; paths {list(r.get('attention', {}))}",
                  flush=True)
            save_partial(a, {"rows": rows})
    nope = rows.get("nope", {}).get("step_ms")
    for r in rows.values():
        if nope and "step_ms" in r:
            r["vs_nope"] = r["step_ms"] / nope
    return {"model": a.model, "batch": a.batch, "seq": a.seq, "dtype": a.dtype, "rows": rows}


# ---- MFU --------------------------------------------------------------------------------------------------------
def matmul_flops(n: int, dtype_name: str, device, repeats: int) -> float:
    import torch

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    x, y = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    seconds = median_time(lambda: torch.mm(x, y), device, 2, repeats)
    return 2 * n**3 / seconds


def cmd_mfu(a) -> dict:
    import torch

    device = torch.device(a.device)
    measured = matmul_flops(a.matmul_n, a.dtype, device, a.repeats)
    rows = {}
    for scheme in a.mfu_schemes:
        for compiled in (False, True) if a.compile else (False,):
            key = f"{scheme}{'+compile' if compiled else ''}"
            r = guarded(key, plain_step_time, scheme, model_config(a.mfu_model, a.chunk), a, device, compiled)
            if "tokens_per_s" in r:
                achieved = r["flops_per_token"] * r["tokens_per_s"]
                r.update(mfu_vs_spec=achieved / a.peak, mfu_vs_matmul=achieved / measured)
            rows[key] = r
            print(f"mfu {key}: {json.dumps({k: v for k, v in r.items() if k != 'attention'})}", flush=True)
            save_partial(a, {"matmul_flops": measured, "spec_peak": a.peak, "rows": rows})
    return {"model": a.mfu_model, "batch": a.batch, "seq": a.seq, "dtype": a.dtype, "spec_peak": a.peak,
            "matmul_n": a.matmul_n, "matmul_flops": measured, "rows": rows}


# ---- collect ------------------------------------------------------------------------------------------------------
def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"error": f"{path.name}: {type(err).__name__}: {err}"}


def cmd_collect(a) -> dict:
    out = Path(a.out)
    report = {"machine": machine(), "timeouts_or_failures": (out / "failures.txt").read_text().split()
              if (out / "failures.txt").exists() else []}
    for name in ("attention", "steps", "mfu", "throughput", "eval_memory", "probe_speed"):
        report[name] = read_json(out / f"{name}.json")
    train = read_json(out / "train" / "summary.json") or {}
    report["train"] = {k: train.get(k) for k in ("status", "error", "wall_seconds", "global_step", "metrics",
                                                 "attention", "wandb")}
    if (out / "train_seconds.txt").exists():
        report["train"]["process_seconds"] = float((out / "train_seconds.txt").read_text().strip() or "nan")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print_digest(report)
    print(f"wrote {out / 'gpu_check.json'}")
    return report


def print_digest(r: dict) -> None:
    """The numbers the issue's targets ask about, one line each."""
    def fmt(x, spec=".3g"):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    print(f"machine: {r['machine']}")
    att = (r.get("attention") or {}).get("rows", {})
    for s, row in att.items():
        print(f"attention {s:<9} form {row.get('bias_form')}  flex err fp32 {fmt(row.get('flex_err_fp32'))} "
              f"bf16 {fmt(row.get('flex_err_bf16'))} (sdpa {fmt(row.get('sdpa_err_fp32'))} / "
              f"{fmt(row.get('sdpa_err_bf16'))})  grad rel {fmt(row.get('flex_bf16_param_grad_rel_err'))}  "
              f"fwd+bwd ms sdpa {fmt(row.get('sdpa_mask_fwd_bwd_ms'))} flex {fmt(row.get('flex_fwd_bwd_ms'))}"
              + (f"  bias grad ms gather {fmt(row['bias_grad_ms_gather'])} per-distance "
                 f"{fmt(row['bias_grad_ms_per_distance'])}" if "bias_grad_ms_gather" in row else "")
              + (f"  ERROR {row['error']}" if "error" in row else ""))
    for key, row in ((r.get("steps") or {}).get("rows") or {}).items():
        print(f"step {key:<14} {fmt(row.get('step_ms'), '.2f')} ms  x{fmt(row.get('vs_nope'), '.2f')} nope  "
              f"paths {','.join(row.get('attention', {}))}" + (f"  ERROR {row['error']}" if "error" in row else ""))
    for row in (r.get("throughput") or {}).get("rows") or []:
        if row.get("impl") == "lightning":
            print(f"lightning/plain {row['scheme']:<10} {fmt(row.get('vs_plain'), '.3f')}  MFU {fmt(row.get('mfu'), '.3f')}")
    mfu = r.get("mfu") or {}
    for key, row in (mfu.get("rows") or {}).items():
        print(f"mfu {key:<16} {fmt(row.get('mfu_vs_spec'), '.3f')} of spec, {fmt(row.get('mfu_vs_matmul'), '.3f')} of "
              f"measured matmul ({fmt(mfu.get('matmul_flops') and mfu['matmul_flops'] / 1e12, '.0f')} TFLOP/s)")
    for row in (r.get("eval_memory") or {}).get("rows") or []:
        peak = row.get("cuda_peak_bytes")
        print(f"eval {row.get('scheme'):<10} {row.get('length')} tokens: CUDA peak "
              f"{fmt(peak and peak / 2**30, '.2f')} GiB" + (f"  ERROR {row['error']}" if "error" in row else ""))
    ps = r.get("probe_speed") or {}
    print(f"probes: {fmt(ps.get('samples_per_s'), '.0f')} samples/s ({ps.get('samples')} samples of {ps.get('length')})")
    t = r.get("train") or {}
    print(f"train.py: status {t.get('status')}, {t.get('global_step')} steps, {fmt(t.get('wall_seconds'), '.0f')} s, "
          f"val/ppl {fmt((t.get('metrics') or {}).get('val/ppl'))}, attention {((t.get('attention') or {}).get('paths'))}")
    if r.get("timeouts_or_failures"):
        print(f"sections that failed or timed out: {r['timeouts_or_failures']}")


# ---- command line -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("section", choices=["attention", "steps", "mfu", "collect"])
    p.add_argument("out", nargs="?", default=None, help="collect: the output folder")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (the check's plumbing only)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--schemes", nargs="+", default=None)
    p.add_argument("--flex", nargs="*", default=["alibi", "t5_bias"], help="steps: also with attn_backend=flex")
    p.add_argument("--model", default="small")
    p.add_argument("--mfu-model", default="base")
    p.add_argument("--mfu-schemes", nargs="+", default=["nope", "alibi"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--d", type=int, default=384, help="attention: d_model (heads x Dh)")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=None, help="model.attn_chunk_size (default: the model's, 512)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--peak", type=float, default=H200_BF16_DENSE, help="spec peak FLOP/s (H200 dense bf16)")
    p.add_argument("--flex-dtypes", nargs="*", default=["fp32", "bf16"])
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="mfu: eager only")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.section == "attention" and a.chunk is None:
        a.chunk = 512  # conf/model/*.yaml
    if a.cpu_smoke:  # CPU, tiny: every code path but the CUDA-only timings; flex fp32 forward only (CPU)
        a.device, a.dtype, a.batch, a.seq, a.d, a.heads, a.vocab = "cpu", "fp32", 2, 128, 32, 2, 64
        a.model = a.mfu_model = "micro"
        a.steps, a.warmup, a.repeats, a.matmul_n, a.flex = 2, 1, 2, 256, []
        a.flex_dtypes = [d for d in a.flex_dtypes if d == "fp32"]
    if a.schemes is None:
        a.schemes = list(BIAS_SCHEMES) if a.section == "attention" else list(SCHEMES)
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.section == "collect":
        return cmd_collect(a)
    t0 = time.perf_counter()
    result = {"section": a.section, "machine": machine(), "args": {k: v for k, v in vars(a).items() if k != "json"},
              **{"attention": cmd_attention, "steps": cmd_steps, "mfu": cmd_mfu}[a.section](a)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
