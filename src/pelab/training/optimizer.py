"""The optimizer conf/optim/adamw.yaml names (its `_target_`): AdamW with decoupled weight decay on the matmul
weights only, a linear warmup, then cosine decay (a per-step `LambdaLR`)."""

from __future__ import annotations

import math

import torch

from pelab.model import GPT
from pelab.training.config import OptimConfig


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to `min_ratio` at `total` steps (flat afterwards)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw_cosine(model: GPT, o: OptimConfig, device: torch.device, max_steps: int | None) -> dict:
    """Lightning's `configure_optimizers` answer for `model`: AdamW over two parameter groups and the warmup +
    cosine schedule over `max_steps` (the Trainer's), stepped every step."""
    # Weight decay on matmul weights only; norms, biases and position tables (of every encoding a layer uses,
    # a layout's too) are not decayed.
    decay, no_decay = [], []
    position = {id(p) for pe in model.encodings().values() for p in pe.parameters()}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and id(p) not in position else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": o.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda" if o.fused is None else o.fused
    opt = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=fused)
    total = int(max_steps) if max_steps and max_steps > 0 else 1
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(s, o.warmup_steps, total, o.min_lr_ratio)
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
