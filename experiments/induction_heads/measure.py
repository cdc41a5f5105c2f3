"""The costs behind the study's budget (README "Measurements"), on one thread: training steps per second at batch 8,
T = 258 (L = 2^8) in plain PyTorch and under Lightning (`python train.py experiment=induction_heads`, the difference
of two runs so that start-up is not counted), and the seconds one test sequence costs at each probe length (the
harness's own scorer, pelab.evaluation.probes.score_samples). Each in CPU seconds of this process / its children
(what a CPU-hour budget counts) and in wall seconds (which depend on what else the machine runs: the load average is
recorded). Writes measure.json next to this file (or --out).
    OMP_NUM_THREADS=1 .venv/bin/python experiments/induction_heads/measure.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from pelab import CONF_DIR
from pelab.data.recall import make_probe_samples
from pelab.data.recall.induction import INDUCTION_HEADS, VOCABULARY
from pelab.evaluation.probes import score_samples
from pelab.model import build_model

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ROWS = ("sinusoidal", "rope", "xpos")


def config(pe: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=["experiment=induction_heads", f"pe={pe}"])


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def plain_steps(pe: str, steps: int) -> dict:
    """Adam steps of the study's model on fresh batches (8, 258), loss on every position."""
    cfg = config(pe)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.pe, VOCABULARY.vocab_size, 256)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    x = torch.randint(0, 14, (8, 258))

    def step() -> None:
        logits = model(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    w0, c0 = clocks()
    for _ in range(steps):
        step()
    w1, c1 = clocks()
    return {"steps": steps, "steps_per_wall_s": steps / (w1 - w0), "steps_per_cpu_s": steps / (c1 - c0)}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def lightning_run(pe: str, steps: int, folder: Path) -> tuple[float, float]:
    """Wall and CPU seconds of `python train.py experiment=induction_heads` for `steps` steps, no evaluation."""
    cmd = [sys.executable, str(REPO / "train.py"), "experiment=induction_heads", f"pe={pe}", f"trainer.max_steps={steps}",
           "trainer.val_check_interval=100000", "callbacks.retrieval_criterion=null", "callbacks.checkpoint=null",
           "callbacks.progress_bar=false", "evaluate_after_fit=false", "provenance.allow_dirty=true",
           f"hydra.run.dir={folder}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    c0, w0 = children_cpu(), time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - w0, children_cpu() - c0


def lightning_steps(pe: str, short: int, long: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ws, cs = lightning_run(pe, short, Path(tmp) / "short")
        wl, cl = lightning_run(pe, long, Path(tmp) / "long")
    n = long - short
    return {"steps": [short, long], "wall_s": [ws, wl], "cpu_s": [cs, cl],
            "steps_per_wall_s": n / (wl - ws), "steps_per_cpu_s": n / (cl - cs)}


def eval_cost(pe: str, lengths: list[int], quick: bool) -> dict:
    """Seconds per test sequence at each task length (the answer scored as the probes score it)."""
    cfg = config(pe)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.pe, VOCABULARY.vocab_size, 256).eval()
    out = {}
    for L in lengths:
        n = max(2, min(64, (1 << 16) // L)) if not quick else 2
        samples = make_probe_samples(INDUCTION_HEADS, VOCABULARY, L, 0.5, n, seed=0)
        score_samples(model, samples[:1])  # warm the kernels of this shape
        w0, c0 = clocks()
        score_samples(model, samples)
        w1, c1 = clocks()
        out[L] = {"n": n, "wall_s_per_seq": (w1 - w0) / n, "cpu_s_per_seq": (c1 - c0) / n}
        print(f"  {pe} L={L}: {out[L]['cpu_s_per_seq']:.4f} CPU s / sequence", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "measure.json"))
    ap.add_argument("--quick", action="store_true", help="few steps and sequences (a smoke test of this script)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lengths = [1 << k for k in range(6, 15)]
    short, long = (20, 60) if args.quick else (200, 1200)
    record: dict = {"threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg(),
                    "cpu_count": os.cpu_count(), "batch": 8, "row_tokens": 258}
    record["plain"] = {pe: plain_steps(pe, 30 if args.quick else 300) for pe in ROWS}
    print("plain:", {pe: round(v["steps_per_cpu_s"], 2) for pe, v in record["plain"].items()}, flush=True)
    record["lightning"] = {pe: lightning_steps(pe, short, long) for pe in ROWS}
    print("lightning:", {pe: round(v["steps_per_cpu_s"], 2) for pe, v in record["lightning"].items()}, flush=True)
    record["eval"] = {pe: eval_cost(pe, lengths, args.quick) for pe in ROWS}
    record["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
