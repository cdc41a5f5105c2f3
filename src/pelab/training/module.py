"""The LightningModule: next-token cross-entropy on a GPT whose position scheme comes from `cfg.pe`.

The module owns optimisation and metrics only; the model and the encoding are built by
`pelab.model.build_model`, which is also what `eval.py` uses to rebuild a checkpoint.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torchmetrics import SumMetric

from pelab.model import GPT, build_model


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to `min_ratio` at `total` steps (flat afterwards)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def flops_per_token(model: GPT, seq_len: int) -> float:
    """PaLM/nanoGPT estimate: 6*N (N = params without the input embedding, LM head counted) + 12*l*d*T."""
    c = model.config
    # num_params(exclude_embedding=True) keeps the tied token embedding once: it is the LM head's matmul.
    return 6.0 * model.num_params(exclude_embedding=True) + 12.0 * c.n_layers * c.d_model * seq_len


class LMModule(L.LightningModule):
    """Trains `GPT` on `(B, T+1)` windows. `cfg` is the full resolved run config (saved in checkpoints)."""

    def __init__(self, cfg: dict, vocab_size: int):
        super().__init__()
        self.save_hyperparameters()
        self.cfg = cfg
        self.seq_len = int(cfg["data"]["seq_len"])
        self.model = build_model(cfg["model"], cfg["pe"], vocab_size, self.seq_len)
        self.flops_per_token = flops_per_token(self.model, self.seq_len)
        self.peak_flops: float | None = None  # set by the throughput callback
        # DDP-safe perplexity: sum fp32 NLL and token counts, reduce, then exp (no softmax-then-log).
        self.val_nll = SumMetric()
        self.val_tokens = SumMetric()
        self._compiled: torch.nn.Module | None = None
        self._t_last: float | None = None
        self._tokens_since = 0
        self.start_step: int | None = None  # global step when fit began (> 0 after a resume)

    # -- forward ---------------------------------------------------------------------------------
    @property
    def net(self) -> torch.nn.Module:
        """The model to run: compiled lazily when `compile=true` (the state dict stays the plain model's)."""
        if self.cfg.get("compile") and self._compiled is None:
            self._compiled = torch.compile(self.model)
        return self._compiled if self._compiled is not None else self.model

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(idx, pos=pos)

    @staticmethod
    def nll(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Token cross-entropy in fp32, whatever the autocast precision: (B, T, V), (B, T) -> scalar."""
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)

    # -- training --------------------------------------------------------------------------------
    def on_train_start(self) -> None:
        self.start_step = int(self.global_step)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T), (B, T)
        loss = self.nll(self(x), y)
        tokens = x.numel() * self.trainer.world_size
        self._tokens_since += tokens
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/tokens", float((self.global_step + 1) * tokens))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        self._log_throughput()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Stop "early" at max_steps: Lightning then runs a last validation, so val/* and last.ckpt
        # always describe the final weights (the ones the end-of-training evaluation scores).
        max_steps = self.trainer.max_steps
        if max_steps and max_steps > 0 and self.global_step >= max_steps:
            self.trainer.should_stop = True

    def _log_throughput(self) -> None:
        # Wall time over a window of steps (no per-step device sync): accurate on average on GPU too.
        every = max(1, self.trainer.log_every_n_steps)
        now = time.perf_counter()
        if self._t_last is None:
            self._t_last, self._tokens_since = now, 0
            return
        if (self.global_step + 1) % every:
            return
        dt = now - self._t_last
        if dt > 0 and self._tokens_since > 0:
            tps = self._tokens_since / dt
            self.log("train/tokens_per_sec", tps, prog_bar=True, rank_zero_only=True)
            self.log("train/tokens_per_sec_per_device", tps / self.trainer.world_size, rank_zero_only=True)
            if self.peak_flops:
                mfu = self.flops_per_token * tps / (self.peak_flops * self.trainer.world_size)
                self.log("train/mfu", mfu, rank_zero_only=True)
        self._t_last, self._tokens_since = now, 0

    # -- validation ------------------------------------------------------------------------------
    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        x, y = batch[:, :-1], batch[:, 1:]
        self.val_nll.update(self.nll(self(x), y, reduction="sum"))
        self.val_tokens.update(torch.tensor(float(y.numel()), device=self.device))

    def on_validation_epoch_end(self) -> None:
        nll, n = self.val_nll.compute(), self.val_tokens.compute()  # reduced over ranks
        loss = nll / n.clamp_min(1)
        self.log("val/loss", loss, sync_dist=False, rank_zero_only=False)
        self.log("val/ppl", torch.exp(loss.clamp(max=80.0)), prog_bar=True)
        self.val_nll.reset()
        self.val_tokens.reset()

    # -- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> dict:
        o = self.cfg["optim"]
        # Weight decay on matmul weights only; norms, biases and position tables are not decayed.
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 and not name.startswith("pe.") else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": o["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = self.device.type == "cuda"
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], fused=fused)
        total = int(self.trainer.max_steps) if self.trainer.max_steps and self.trainer.max_steps > 0 else 1
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_lambda(s, int(o["warmup_steps"]), total, float(o["min_lr_ratio"]))
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
