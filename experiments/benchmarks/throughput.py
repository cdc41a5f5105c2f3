"""Training throughput, side by side in one process: PELab under Lightning, PELab in a plain loop, x-transformers.

    python experiments/benchmarks/throughput.py                      # reference config, CPU fp32, all schemes
    python experiments/benchmarks/throughput.py --pe rope alibi --steps 20 --json out.json
    python experiments/benchmarks/throughput.py --device cuda --dtype bf16 --d 768 --layers 12 --heads 12 \
        --seq 1024 --batch 16 --vocab 32768                          # GPU: MFU against Lightning's table

A step is forward + backward + AdamW on a random-token batch held in memory (data is never the bottleneck).
Steps are interleaved so that every column sees the same machine load: per scheme one Lightning fit, and
after each of its steps one step of the plain loop and of x-transformers on that scheme, and of both on
``nope`` (the reference of the encoding-overhead column). The first ``--warmup`` steps of each fit are
dropped; the reported time is the median of the ``--steps`` timed ones, pooled over ``--rounds``; the
ratio columns are medians of per-step ratios between steps that ran back to back (drifts cancel).
``--clock cpu`` times process CPU time instead of wall time: on a shared machine, with ``--threads 1``,
it does not count the time other processes hold the cores.

  lightning  LMModule under a real lightning.Trainer; step = on_train_batch_start -> on_train_batch_end
             (training_step, its self.log calls, backward, optimizer and scheduler step, hooks)
  plain      the same model (same seed) in a hand-written loop: forward, cross-entropy, backward, step
  x-transf.  x-transformers' TransformerWrapper(Decoder) configured like PELab per scheme (see peer_config)

MFU = FLOPs/token * tokens/s / peak, with FLOPs/token = 6 N + 12 * layers * d * T (N: parameters without
position tables, tied embedding counted once as the LM head) and, on CPU, the peak FLOP/s of a large fp32
``torch.mm`` measured in this process (best of ``--peak-repeats``). On CUDA: ``--peak-flops`` or
Lightning's get_available_flops. Without x-transformers importable the peer column is skipped (said so).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import get_available_flops
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[2]

from pelab.data.batch import Batch
from pelab.encodings import default_pe_config
from pelab.training.callbacks.throughput import TokenThroughput
from pelab.training.module import LMModule, build_model, flops_per_token

SCHEMES = ("nope", "rope", "alibi", "t5_bias", "learned", "sinusoidal")  # the default set; each has a peer config
ALL_SCHEMES = (*SCHEMES, "xpos", "kerple", "sandwich", "fire", "cope")  # --pe: the others without the peer
IMPLS = ("plain", "lightning", "x-transformers")
# wall: elapsed time. cpu: CPU time of this process -- insensitive to other processes taking the cores
# (with --threads 1; with more threads it also counts OpenMP spin-waits).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
OPTIM = {
    "lr": 1e-3,
    "weight_decay": 0.1,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "warmup_steps": 10,
    "min_lr_ratio": 0.1,
    "grad_clip": 0.0,
    "nonfinite": "stop",
    "max_skips": 0,
    "fused": None,
}  # conf/optim/adamw.yaml (warm-up shortened: irrelevant to speed; no clipping, as this benchmark has always run)


# ---- configuration ---------------------------------------------------------------------------------------
def pe_config(scheme: str) -> dict:
    """conf/pe/<scheme>.yaml as it is; settings that mean "the training length" (a learned table's size)
    are filled from the training length when the model is built."""
    return default_pe_config(scheme)


def model_config(a: argparse.Namespace) -> dict:
    return {
        "n_layers": a.layers,
        "n_heads": a.heads,
        "d_model": a.d,
        "d_ff": None,
        "dropout": 0.0,
        "bias": False,
        "attn_chunk_size": a.chunk,
    }


def peer_config(scheme: str, a: argparse.Namespace) -> tuple[dict, dict]:
    """x-transformers kwargs (Decoder, TransformerWrapper) matching PELab: pre-norm LayerNorm, GELU MLP 4x
    without biases, no qkv/out biases, tied embeddings, SDPA attention (attn_flash) where it allows.
    Known differences: separate q/k/v projections; rotary pairs interleaved channels; T5 bias forbids
    attn_flash (explicit softmax, bias recomputed per layer); learned/sinusoidal tables are scaled by d^-0.5
    (sinusoidal with a learned scale, sin/cos concatenated rather than interleaved)."""
    dh = a.d // a.heads
    layers = {
        "dim": a.d,
        "depth": a.layers,
        "heads": a.heads,
        "attn_dim_head": dh,
        "attn_flash": True,
        "ff_mult": 4,
        "ff_no_bias": True,
        "verbose": False,
    }
    wrapper = {"num_tokens": a.vocab, "max_seq_len": a.seq, "tie_embedding": True, "use_abs_pos_emb": False}
    if scheme == "rope":
        layers.update(rotary_pos_emb=True, rotary_emb_dim=dh)  # its default rotates only dh/2 channels
    elif scheme == "alibi":
        layers.update(alibi_pos_bias=True, alibi_num_heads=a.heads)
    elif scheme == "t5_bias":
        layers.update(rel_pos_bias=True, rel_pos_num_buckets=32, rel_pos_max_distance=128, attn_flash=False)
    elif scheme == "learned":
        wrapper.update(use_abs_pos_emb=True)
    elif scheme == "sinusoidal":
        wrapper.update(use_abs_pos_emb=True, scaled_sinu_pos_emb=True)
    return layers, wrapper


def import_peer():
    """x_transformers module, or None with the reason printed (benchmark-only dependency)."""
    if os.environ.get("PELAB_BENCH_NO_PEER"):
        print("x-transformers: disabled by PELAB_BENCH_NO_PEER; peer column skipped")
        return None
    try:
        import x_transformers
    except ImportError as err:
        print(
            f"x-transformers not importable ({err}); peer column skipped. "
            "Install it with `pip install -e .[bench]` to compare."
        )
        return None
    return x_transformers


def peer_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("x-transformers")
    except PackageNotFoundError:
        return None


def build_peer(xt, scheme: str, a: argparse.Namespace) -> nn.Module:
    layers, wrapper = peer_config(scheme, a)
    return xt.TransformerWrapper(attn_layers=xt.Decoder(**layers), **wrapper)


def peer_flops_per_token(model: nn.Module, a: argparse.Namespace) -> float:
    """The same estimate as pelab's flops_per_token: position tables excluded, tied embedding once."""
    n = 0
    for name, p in model.named_parameters():  # unique parameters (tied weights appear once)
        if "pos_emb" not in name and "rel_pos" not in name:
            n += p.numel()
    return 6.0 * n + 12.0 * a.layers * a.d * a.seq


# ---- timing ----------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(model: nn.Module, device: torch.device, no_decay=lambda name: False) -> torch.optim.AdamW:
    """AdamW as LMModule.configure_optimizers builds it: decay on matrices except position tables."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not no_decay(name) else rest).append(p)
    groups = [{"params": decay, "weight_decay": OPTIM["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=OPTIM["lr"], betas=tuple(OPTIM["betas"]), eps=OPTIM["eps"], fused=device.type == "cuda"
    )


class Stepper:
    """One implementation outside Lightning: a model, its AdamW, and the times of its steps."""

    def __init__(self, name: str, model: nn.Module, opt, batches: list[Tensor], a, device, clock):
        self.name, self.model, self.opt, self.batches = name, model, opt, batches
        self.net = torch.compile(model, dynamic=False) if a.compile else model  # as LMModule.net
        self.a, self.device, self.clock = a, device, clock
        self.times: list[float] = []

    def step(self) -> None:
        """Forward, fp32 cross-entropy, backward, AdamW on the next batch; appends its time."""
        batch = self.batches[len(self.times) % len(self.batches)]
        self.net.train()
        sync(self.device)
        t0 = self.clock()
        x, y = batch[:, :-1], batch[:, 1:]
        with autocast(self.device, self.a.dtype):
            logits = self.net(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(self.device)
        self.times.append(self.clock() - t0)


def make_interleaver(device: torch.device, clock, others: list[Stepper]):
    import lightning.pytorch as L

    class Interleaved(L.Callback):
        """Times each Lightning batch (on_train_batch_start -> on_train_batch_end), then runs one step of
        every other implementation: all of them see the same machine load, step by step."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._t0 = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            sync(device)
            self._t0 = clock()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            sync(device)
            self.times.append(clock() - self._t0)
            for other in others:
                other.step()

    return Interleaved()


def fit_lightning(scheme: str, batches: list[Tensor], a, device, peak, others: list[Stepper]) -> list[float]:
    """LMModule under a real Trainer (no logger, checkpoints or validation), ``others`` stepped in between;
    returns Lightning's step times (warm-up included)."""
    import lightning.pytorch as L
    from torch.utils.data import DataLoader

    cfg = {  # the keys LMModule's training reads
        "data": {"seq_len": a.seq, "recall_loss": "all"},
        "model": model_config(a),
        "pe": pe_config(scheme),
        "optim": OPTIM,
        "compile": a.compile,
        "seed": 0,
        "debug": {"inject_nan_at_step": None},
        "paths": {"output_dir": "."},
    }
    torch.manual_seed(0)
    module = LMModule(cfg, vocab_size=a.vocab)
    timer = make_interleaver(device, CLOCKS[a.clock], others)
    n = a.warmup + a.steps
    # a list of ready batches of (B, T+1) text rows: batch_size=None hands them over as they are
    texts = [Batch.text(b) for b in batches]
    loader = DataLoader([texts[i % len(texts)] for i in range(n)], batch_size=None, shuffle=False)
    trainer = L.Trainer(
        accelerator=device.type,
        devices=1,
        precision="bf16-mixed" if a.dtype == "bf16" else "32-true",
        max_steps=n,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=10,
        callbacks=[timer, TokenThroughput(available_flops=peak)],  # train/mfu as in real training
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available" banners per fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # num_workers / val-loop hints
        trainer.fit(module, train_dataloaders=loader)
    return timer.times


def matmul_peak(n: int, repeats: int, clock) -> float:
    """FLOP/s of an n x n fp32 torch.mm on this CPU, best of ``repeats`` (timed with the benchmark's clock)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        torch.mm(a, b)
        best = min(best, clock() - t0)
    return 2 * n**3 / best


def measure_peak(a, device: torch.device) -> tuple[float | None, str]:
    if a.peak_flops:
        return a.peak_flops, "--peak-flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = get_available_flops(device, torch.bfloat16 if a.dtype == "bf16" else torch.float32)
        return peak, f"get_available_flops({name})" if peak else f"unknown GPU {name}: pass --peak-flops"
    peak = matmul_peak(a.peak_n, a.peak_repeats, CLOCKS[a.clock])
    return peak, f"fp32 torch.mm {a.peak_n}^2, best of {a.peak_repeats}, {a.clock} clock"


# ---- the sweep -------------------------------------------------------------------------------------------
def make_steppers(scheme: str, a, device, xt, batches: list[Tensor]) -> dict[str, Stepper]:
    """plain: the model Lightning trains (same builder, same seed) in a hand-written loop; the peer."""
    clock = CLOCKS[a.clock]
    torch.manual_seed(0)
    model = build_model(model_config(a), pe_config(scheme), a.vocab, a.seq).to(device)
    opt = adamw(model, device, lambda n: n.startswith("pe."))
    steppers = {"plain": Stepper("plain", model, opt, batches, a, device, clock)}
    if xt is not None and scheme in SCHEMES:  # x-transformers configured like pelab for these schemes only
        torch.manual_seed(0)
        peer = build_peer(xt, scheme, a).to(device)
        opt = adamw(peer, device, lambda n: "pos_emb" in n or "rel_pos" in n)
        steppers["x-transformers"] = Stepper("x-transformers", peer, opt, batches, a, device, clock)
    return steppers


def sweep(a, device, peak, xt) -> tuple[dict, dict, dict]:
    """Per scheme one Lightning fit; after each of its steps, one step of the plain loop and the peer on the
    same scheme, and of the plain loop and the peer on ``nope`` (the reference for the encoding overhead).
    ``--rounds`` repeats the sweep; times after each fit's warm-up are pooled.

    Returns times[(scheme, impl)], nope_times[(scheme, impl)] (nope steps interleaved with that scheme's),
    flops_per_token[(scheme, impl)].
    """
    g = torch.Generator().manual_seed(1234)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device) for _ in range(4)]
    nope = make_steppers("nope", a, device, xt, batches)
    times: dict[tuple[str, str], list[float]] = {}
    nope_times: dict[tuple[str, str], list[float]] = {}
    fpts: dict[tuple[str, str], float] = {}
    for _ in range(a.rounds):
        for scheme in a.pe:
            own = nope if scheme == "nope" else make_steppers(scheme, a, device, xt, batches)
            refs = [] if scheme == "nope" else list(nope.values())
            start = {id(s): len(s.times) for s in [*own.values(), *refs]}
            lightning = fit_lightning(scheme, batches, a, device, peak, [*own.values(), *refs])
            times.setdefault((scheme, "lightning"), []).extend(lightning[a.warmup :])
            for impl, s in own.items():
                ref = nope[impl] if refs else s
                # this fit's steps after the warm-up
                times.setdefault((scheme, impl), []).extend(s.times[start[id(s)] :][a.warmup :])
                nope_times.setdefault((scheme, impl), []).extend(ref.times[start[id(ref)] :][a.warmup :])
                fpts[scheme, impl] = (
                    flops_per_token(s.model, a.seq) if impl == "plain" else peer_flops_per_token(s.model, a)
                )
            fpts[scheme, "lightning"] = fpts[scheme, "plain"]
            print(f"  {scheme}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    return times, nope_times, fpts


def paired(num: list[float], den: list[float]) -> float:
    """Median of per-step ratios num[i] / den[i] of steps run back to back: slow load drifts cancel."""
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


def summarise(a, times: dict, nope_times: dict, fpts: dict, peak: float | None) -> list[dict]:
    """One row per (scheme, impl): median step, tokens/s, MFU, and the ratio columns, each the median of
    per-step ratios between steps that ran back to back (see sweep):
      vs_peer, vs_plain   speed relative to x-transformers / the plain loop on the same scheme;
      overhead_vs_nope    extra step time over nope: plain and x-transformers against their nope steps
                          interleaved with this scheme's; Lightning as (lightning / plain-nope in this fit)
                          over (lightning / plain in the nope fit)."""
    rows = []
    for (scheme, impl), t in times.items():
        step = statistics.median(t)
        tps = a.batch * a.seq / step
        peer, plain = times.get((scheme, "x-transformers")), times[scheme, "plain"]
        if impl == "lightning":
            in_fit = paired(t, nope_times[scheme, "plain"])
            in_nope_fit = paired(times["nope", "lightning"], times["nope", "plain"])
            overhead = in_fit / in_nope_fit - 1.0
        else:
            overhead = paired(t, nope_times[scheme, impl]) - 1.0
        rows.append(
            {
                "scheme": scheme,
                "impl": impl,
                "step_ms": step * 1e3,
                "tokens_per_s": tps,
                "flops_per_token": fpts[scheme, impl],
                "mfu": fpts[scheme, impl] * tps / peak if peak else None,
                "vs_peer": paired(peer, t) if peer else None,
                "vs_plain": paired(plain, t),
                "overhead_vs_nope": overhead,
                "step_ms_p25": _quantile(t, 0.25) * 1e3,
                "step_ms_p75": _quantile(t, 0.75) * 1e3,
                "steps_ms": [x * 1e3 for x in t],
            }
        )
    order = {impl: i for i, impl in enumerate(IMPLS)}
    rows.sort(key=lambda r: (a.pe.index(r["scheme"]), order[r["impl"]]))
    return rows


def _quantile(x: list[float], q: float) -> float:
    return statistics.quantiles(x, n=100, method="inclusive")[int(q * 100) - 1] if len(x) > 1 else x[0]


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], peak: float | None, peak_src: str, has_peer: bool) -> None:
    head = (
        f"{'scheme':<11} {'impl':<15} {'ms/step':>9} {'tokens/s':>10} {'vs x-tr':>8} {'vs plain':>9} "
        f"{'vs nope':>8} {'MFU':>6}"
    )
    print(f"\npeak: {fmt(peak and peak / 1e9, '.1f')} GFLOP/s ({peak_src})")
    if not has_peer:
        print("x-transformers column skipped (not importable)")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['scheme']:<11} {r['impl']:<15} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f} "
            f"{fmt(r['vs_peer'], '.3f'):>8} {fmt(r['vs_plain'], '.3f'):>9} "
            f"{fmt(r['overhead_vs_nope'] and 100 * r['overhead_vs_nope'], '+.1f') + ('%' if r['overhead_vs_nope'] is not None else ''):>8} "
            f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f') + '%':>6}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pe", nargs="+", default=list(SCHEMES), choices=ALL_SCHEMES)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512, help="model.attn_chunk_size (conf/model/tiny.yaml)")
    p.add_argument("--steps", type=int, default=15, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="repeat the sweep; steps are pooled")
    p.add_argument(
        "--clock", default="wall", choices=list(CLOCKS), help="cpu: process CPU time (--threads 1)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="torch.compile every model (all three columns)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU instead of measuring")
    p.add_argument("--peak-n", type=int, default=2048)
    p.add_argument("--peak-repeats", type=int, default=10)
    p.add_argument("--json", default=None, help="write rows and run metadata here")
    a = p.parse_args(argv)
    if a.device == "cpu" and a.dtype == "bf16":
        p.error("--dtype bf16 is for --device cuda (bf16 matmul on this CPU is far slower than fp32)")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    if a.clock == "cpu" and a.device == "cuda":
        p.error("--clock cpu times CPU work only; use --clock wall on CUDA")
    if "nope" not in a.pe:
        a.pe.insert(0, "nope")  # the reference of the encoding-overhead column
    if a.steps < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--steps and --rounds must be >= 1, --warmup >= 0")
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    xt = import_peer()
    load_before = os.getloadavg()
    peak, peak_src = measure_peak(a, device)
    print(
        f"config: d={a.d} layers={a.layers} heads={a.heads} T={a.seq} batch={a.batch} vocab={a.vocab} "
        f"{a.device} {a.dtype} compile={a.compile} threads={torch.get_num_threads()} "
        f"steps={a.steps} warmup={a.warmup} rounds={a.rounds} clock={a.clock}; load avg {load_before[0]:.2f}",
        flush=True,
    )
    rows = summarise(a, *sweep(a, device, peak, xt), peak)
    print_table(rows, peak, peak_src, xt is not None)
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1-min)")
    result = {
        "config": {k: v for k, v in vars(a).items() if k != "json"},
        "peak_flops": peak,
        "peak_source": peak_src,
        "peer": xt is not None,
        "peer_version": peer_version() if xt else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "rows": rows,
    }
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
