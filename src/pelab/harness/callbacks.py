"""Callbacks built from `conf/callbacks/`: checkpoints, progress bar, MFU peak.

Checkpoints: `best.ckpt` (by the optimized metric) and `last.ckpt` at every validation, and, with
`callbacks.checkpoint.every_n_steps=k`, `last.ckpt` every k training steps too (what a preempted or killed
run resumes from with `ckpt_path=auto`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar, TQDMProgressBar

# Dense peak FLOP/s for train/mfu on known accelerators (bf16 tensor cores, no sparsity).
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def measure_cpu_matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a large fp32 matmul on this CPU: the practical peak MFU is measured against."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_flops(device: torch.device, configured: float | None) -> float | None:
    if configured:
        return float(configured)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)
    if device.type == "cpu":
        return measure_cpu_matmul_peak()
    return None


class PeakFlops(Callback):
    """Sets `pl_module.peak_flops` once training starts, on the device the model actually runs on."""

    def __init__(self, configured: float | None = None):
        self.configured = configured

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.peak_flops = peak_flops(pl_module.device, self.configured)


def build_callbacks(ccfg: dict, output_dir: Path, optimized_metric: str) -> list[Callback]:
    callbacks: list[Callback] = []
    ckpt = ccfg.get("checkpoint") or {}
    if ckpt:
        # Only validation metrics exist when checkpoints are taken; others cannot pick "best".
        monitor = optimized_metric if ckpt.get("save_best") and optimized_metric.startswith("val/") else None
        callbacks.append(
            ModelCheckpoint(
                dirpath=str(output_dir / "checkpoints"),
                filename="best",
                monitor=monitor,
                mode=ckpt.get("mode", "min"),
                save_top_k=1 if monitor else 0,
                save_last=bool(ckpt.get("save_last", True)),
                auto_insert_metric_name=False,
                enable_version_counter=False,
            )
        )
        every = ckpt.get("every_n_steps")
        if every:
            if int(every) <= 0:
                raise ValueError(f"callbacks.checkpoint.every_n_steps={every} must be a positive number of steps")
            # Only last.ckpt, every k steps (saved at the end of the step: a consistent mid-run resume point).
            callbacks.append(
                ModelCheckpoint(
                    dirpath=str(output_dir / "checkpoints"),
                    filename="step",
                    every_n_train_steps=int(every),
                    save_top_k=0,
                    save_last=True,
                    enable_version_counter=False,
                )
            )
    if ccfg.get("progress_bar", True):
        # Rich on a terminal; plain tqdm with sparse refreshes in logs and CI.
        callbacks.append(RichProgressBar() if sys.stdout.isatty() else TQDMProgressBar(refresh_rate=50))
    if ccfg.get("throughput", True):
        callbacks.append(PeakFlops(ccfg.get("peak_flops")))
    return callbacks
