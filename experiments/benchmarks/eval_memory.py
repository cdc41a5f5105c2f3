"""Peak memory and time of long evaluation forwards, per scheme and length (tiny model, batch 1).

    python experiments/benchmarks/eval_memory.py                       # 4k, 16k, 32k tokens, all schemes
    python experiments/benchmarks/eval_memory.py --pe rope alibi --lengths 4096 --json out.json
    python experiments/benchmarks/eval_memory.py --pe rope --layout irope --lengths 2048 16384  # a layout preset
    python experiments/benchmarks/eval_memory.py --device cuda --dtype bf16 --lengths 32768 --d 384 --layers 6 \
        --heads 6 --vocab 32768 --pe nope rope alibi t5_bias          # GPU: peak CUDA memory per case

Each (scheme, length) runs in a fresh subprocess, so its peak RSS (VmHWM from /proc/self/status, else
ru_maxrss) is that case's alone: interpreter + torch + model + one evaluation forward. The forward is the
real evaluation path: ``score_windows`` (pelab.evaluation.extrapolation) on one window of ``length``
tokens under ``torch.no_grad()`` -- full logits (T, V), per-token fp32 cross-entropy, per-position sums.
``learned`` gets ``pe.max_position = length`` (its table must cover the evaluated positions).
On CUDA (``--device cuda``) the peak is ``torch.cuda.max_memory_allocated`` of the case (model + activations),
``--dtype bf16`` = autocast as in evaluation under bf16-mixed; ``--in-process`` runs the cases one after the
other in this process (the CUDA peak is reset per case; the RSS columns then mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("nope", "rope", "alibi", "t5_bias", "learned", "sinusoidal")  # the default set
# data-dependent positions (issue 54): FoX, FoX + RoPE, stick-breaking attention (pe=nope, model.attention=stickbreaking)
DATA_DEPENDENT = {"fox": ({"name": "fox"}, {}), "fox_rope": ({"name": "fox", "rope": True}, {}),
                  "stickbreaking": ({"name": "nope"}, {"attention": "stickbreaking"})}
ALL_SCHEMES = (*SCHEMES, "xpos", "kerple", "sandwich", "fire", "cope", "fope", *DATA_DEPENDENT)
GIB = 2**30


def status_kib(field: str) -> int | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in KiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    hwm = status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def run_case(a: argparse.Namespace) -> dict:
    """One evaluation forward in this process; returns its measurements."""
    import torch

    from pelab.evaluation.extrapolation import Window, score_windows
    from pelab.model import build_model

    if a.threads:
        torch.set_num_threads(a.threads)
    scheme, length = a.case[0], int(a.case[1])
    pe, model_keys = DATA_DEPENDENT.get(scheme, ({"name": scheme}, {}))
    if scheme == "learned":
        pe["max_position"] = length
    model_cfg = {"n_layers": a.layers, "n_heads": a.heads, "d_model": a.d, "attn_chunk_size": a.chunk, **model_keys}
    if a.layout:  # a conf/layout preset: its keys (model.layout, temperature constants) into the model's
        from omegaconf import OmegaConf

        model_cfg |= OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "layout" / f"{a.layout}.yaml"))
    torch.manual_seed(0)
    device = torch.device(a.device)
    model = build_model(model_cfg, pe, a.vocab, a.train_len).eval().to(device)
    tokens = torch.randint(0, a.vocab, (length + 1,)).to(device)
    sums, counts = (torch.zeros(length, dtype=torch.float64, device=device) for _ in range(2))
    rss_before = (status_kib("VmRSS") or 0) * 1024
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    t0 = time.perf_counter()
    with torch.no_grad(), autocast:
        (nll,), n = score_windows(model, tokens[None], [Window(0, length, 0)], 1, sums, counts)  # one block
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {
        "device": a.device,
        "dtype": a.dtype,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "scheme": scheme,
        "layout": a.layout,
        "length": length,
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "rss_before": rss_before,
        "nll_per_token": nll / n,
        "threads": torch.get_num_threads(),
    }


def measure(scheme: str, length: int, a: argparse.Namespace) -> dict:
    """run_case in a fresh interpreter (its peak RSS is this case's alone), or here with --in-process."""
    if a.in_process:
        try:
            return run_case(argparse.Namespace(**{**vars(a), "case": [scheme, str(length)]}))
        except Exception as err:  # noqa: BLE001 - one case's failure is recorded, the others run
            return {"scheme": scheme, "length": length, "error": [f"{type(err).__name__}: {err}"]}
    sizes = f"--d {a.d} --layers {a.layers} --heads {a.heads} --vocab {a.vocab} --chunk {a.chunk}"
    cmd = [
        sys.executable,
        __file__,
        "--case",
        scheme,
        str(length),
        *sizes.split(),
        "--train-len",
        str(a.train_len),
        "--device",
        a.device,
        "--dtype",
        a.dtype,
    ]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.layout:
        cmd += ["--layout", a.layout]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=a.timeout)
    if proc.returncode != 0:
        return {"scheme": scheme, "length": length, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict], lengths: list[int], limit_gib: float) -> None:
    by = {(r["scheme"], r["length"]): r for r in rows}
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    label = [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths]
    head = f"{'scheme':<11}" + "".join(f"{f'{n} peak RSS':>15}{'time':>9}" for n in label)
    print(head)
    print("-" * len(head))
    for s in schemes:
        cells = []
        for n in lengths:
            r = by[(s, n)]
            if "error" in r:
                cells.append(f"{'error':>15}{'-':>9}")
            else:
                cells.append(f"{r['peak_rss'] / GIB:>11.2f} GiB{r['seconds']:>8.1f}s")
        print(f"{s:<11}" + "".join(cells))
    ok = [r for r in rows if "error" not in r]
    worst = max(ok, key=lambda r: r["peak_rss"]) if ok else None
    if worst:
        print(
            f"largest peak RSS: {worst['peak_rss'] / GIB:.2f} GiB ({worst['scheme']} at {worst['length']}); "
            f"target < {limit_gib} GiB: {'met' if worst['peak_rss'] < limit_gib * GIB else 'MISSED'}"
        )
    base = [r["rss_before"] for r in ok]
    if base:
        print(
            f"RSS before the forward (interpreter + torch + model): {min(base) / GIB:.2f}-"
            f"{max(base) / GIB:.2f} GiB"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pe", nargs="+", default=list(SCHEMES), choices=ALL_SCHEMES)
    p.add_argument("--device", default="cpu", help="cuda: also the case's peak CUDA memory")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16 = autocast (CUDA)")
    p.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384, 32768])
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512, help="model.attn_chunk_size (conf/model/tiny.yaml)")
    p.add_argument("--train-len", type=int, default=256, help="training length (RoPE scaling's L)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--layout", default=None, help="a conf/layout preset (model.layout) for every case")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    p.add_argument("--limit-gib", type=float, default=4.0)
    p.add_argument("--json", default=None)
    p.add_argument("--in-process", action="store_true", help="all cases in this process (CUDA peak only)")
    p.add_argument("--case", nargs=2, metavar=("SCHEME", "LENGTH"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    if a.case:
        print(json.dumps(run_case(a)))
        return []
    load = os.getloadavg()
    print(
        f"tiny model d={a.d} layers={a.layers} heads={a.heads} vocab={a.vocab} chunk={a.chunk}, batch 1, "
        f"threads={a.threads or 'torch default'}; load avg {load[0]:.2f}"
    )
    rows = []
    for scheme in a.pe:
        for n in a.lengths:
            rows.append(measure(scheme, n, a))
            r = rows[-1]
            msg = r.get("error") or f"{r['peak_rss'] / GIB:.2f} GiB RSS, {r['seconds']:.1f} s" + (
                f", CUDA peak {r['cuda_peak_bytes'] / GIB:.2f} GiB" if r.get("cuda_peak_bytes") is not None else "")
            print(f"  {scheme} {n}: {msg}", flush=True)
    print_table(rows, a.lengths, a.limit_gib)
    load_after = os.getloadavg()
    print(f"load average before {load[0]:.2f}, after {load_after[0]:.2f} (1-min)")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "config": {k: v for k, v in vars(a).items() if k != "case"},
                    "loadavg_before": load,
                    "loadavg_after": load_after,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "rows": rows,
                },
                indent=2,
            )
        )
    return rows


if __name__ == "__main__":
    main()
