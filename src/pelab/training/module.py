"""The LightningModule: next-token cross-entropy on a GPT whose position scheme comes from `cfg.pe`.

The module owns optimisation and metrics only; the model and the encoding are built by
`pelab.model.build_model`, which is also what `eval.py` uses to rebuild a checkpoint.

Reliability (see also `pelab.signals` and `pelab.training.checkpoints`):
- the torch RNG is re-seeded before every training step from (seed, step, rank), like the data stream, so
  dropout masks after a resume equal those of an uninterrupted run without saving any RNG state;
- a non-finite loss or gradient (checked after backward, before the optimizer step) stops the run
  (`optim.nonfinite=stop`) or skips that update (`skip`, at most `optim.max_skips` times). With the fused
  AdamW (CUDA by default, `optim.fused`) the check costs no host sync per step: the kernel skips a flagged
  update itself (`found_inf`, as under a GradScaler) and the flags are read every `trainer.log_every_n_steps`
  steps and before a checkpoint, so a stop is raised up to that many (good) steps late, never after a bad
  update was applied; otherwise each step's flag is read at once;
- a checkpoint is never written from non-finite weights.
"""

from __future__ import annotations

import logging
import math
from functools import cached_property
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import get_method
from omegaconf import OmegaConf
from torchmetrics import CatMetric, SumMetric

from pelab.checks import typed
from pelab.data.batch import IGNORE_INDEX, Batch
from pelab.encodings.pose import pose_positions
from pelab.errors import NonFiniteError
from pelab.evaluation import stats
from pelab.model import GPT, build_model
from pelab.training.config import OptimConfig

log = logging.getLogger(__name__)


def two_means(logits: torch.Tensor, targets: torch.Tensor, answers: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """recall_loss=two_means: the loss is the sum of (mean NLL over the scored text targets, mean NLL over the
    answer targets), each over the whole batch, so the few answers weigh as much as all the text (both are
    logged). A mean over no target is 0. (B, T, V), (B, T), (B, T) -> two scalars, fp32. No data-dependent branch:
    no device sync."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    text = (targets != IGNORE_INDEX) & ~answers
    answers = answers & (targets != IGNORE_INDEX)
    mean = lambda m: (nll * m).sum() / m.sum().clamp_min(1)
    return mean(text), mean(answers)


def flops_per_token(model: GPT, train_length: int) -> float:
    """PaLM/nanoGPT estimate: 6*N (N = params without the input embedding, LM head counted) + 12*l*d*T."""
    c = model.config
    return 6.0 * model.matmul_params() + 12.0 * c.n_layers * c.d_model * train_length


class LMModule(L.LightningModule):
    """Trains `GPT` on `(B, T+1)` windows: training batches are `Batch`es (ids and loss masks), validation batches
    the ids alone. `cfg` is the full resolved run config (saved in checkpoints: eval.py rebuilds the model from
    it). Building the module reads only `data.seq_len`, `model` and `pe` (a benchmark runs
    a module built from those forward); training reads `optim` (typed, `OptimConfig`), `seed`, `compile`,
    `debug`, `data.batch_size` / `recall_loss` and `paths.output_dir`, each without a default: a run config
    has them all."""

    def __init__(self, cfg: dict, vocab_size: int):
        super().__init__()
        self.save_hyperparameters()
        self.cfg = cfg
        self.train_length = int(cfg["data"]["seq_len"])
        self.model = build_model(cfg["model"], cfg["pe"], vocab_size, self.train_length)
        self.flops_per_token = flops_per_token(self.model, self.train_length)  # read by the throughput callback
        # DDP-safe perplexity: sum fp32 NLL and token counts, reduce, then exp (no softmax-then-log).
        self.val_nll = SumMetric()
        self.val_tokens = SumMetric()
        self.val_windows = CatMetric()  # mean NLL of each validation window, gathered over ranks
        self._compiled: torch.nn.Module | None = None
        self.start_step: int | None = None  # global step when fit began (> 0 after a resume)
        self.nonfinite_skips = 0  # saved in checkpoints: the budget holds across resumes
        self.last_ckpt_step: int | None = None  # step of the newest checkpoint written or loaded
        # val/* and train/* known when the loaded checkpoint was written: the run's metrics when a relaunch
        # has no step left to train (Lightning then computes none).
        self.restored_metrics: dict[str, float] = {}
        self._loss: torch.Tensor | None = None
        # fused AdamW: (step, non-finite flag, loss, grad norm) of the steps not yet read back (device tensors)
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @cached_property
    def optim(self) -> OptimConfig:
        """The optimisation settings, typed (read when training first needs them)."""
        return OmegaConf.to_object(typed(OptimConfig, self.cfg["optim"], "optim"))

    @cached_property
    def inject_nan_at(self) -> set[int]:
        """debug.inject_nan_at_step as a set of steps (a testing aid)."""
        nan_at = self.cfg["debug"]["inject_nan_at_step"]
        return set() if nan_at is None else {int(s) for s in np.atleast_1d(nan_at)}

    def tokens_per_step(self) -> int:
        """Training tokens per optimizer step, all devices together (data.batch_size is the global batch)."""
        return int(self.cfg["data"]["batch_size"]) * self.train_length

    # -- forward ---------------------------------------------------------------------------------
    @property
    def net(self) -> torch.nn.Module:
        """The model to run: compiled lazily when `compile=true` (the state dict stays the plain model's)."""
        if self.cfg["compile"] and self._compiled is None:
            # static shapes: a new batch size or length recompiles (validation: once). With dynamic shapes
            # inductor failed on RoPE at a second length (torch 2.13 CPU: "mul expected 2 arguments, got 3").
            self._compiled = torch.compile(self.model, dynamic=False)
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

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout (and any other torch randomness in a step) = f(seed, step, rank), as the batches are.
        seq = np.random.SeedSequence([int(self.cfg["seed"]), int(self.global_step), self.global_rank])
        # int() before the shift: numpy 1.x has no uint64 >> int
        torch.manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0]) >> 1)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        # (B, T) each; targets that are IGNORE_INDEX are not scored
        x, y = batch.inputs, batch.targets
        logits = self(x, pos=self.training_positions(x))
        if self.cfg["data"]["recall_loss"] == "two_means":
            text_loss, answer_loss = two_means(logits, y, batch.answer_targets)
            loss = text_loss + answer_loss
            self.log_dict({"train/loss_text": text_loss, "train/loss_answers": answer_loss})
        else:
            loss = self.nll(logits, y)
        if self.global_step in self.inject_nan_at:  # testing aid: debug.inject_nan_at_step
            loss = loss * float("nan")
        self._loss = loss.detach()
        tokens = x.numel() * self.trainer.world_size
        self.log("train/loss", loss, prog_bar=True)
        # host numbers as CPU tensors: self.log(float) would copy each to the GPU and wait for it (a sync)
        self.log("train/tokens", torch.tensor(float((self.global_step + 1) * tokens)))
        self.log("train/lr", torch.tensor(float(self.optimizers().param_groups[0]["lr"])))
        return loss

    def training_positions(self, x: torch.Tensor) -> torch.Tensor | None:
        """The positions of a training batch x (B, T): PoSE's skip-wise positions when `extend.pose_length` is set
        (`pelab.encodings.pose`; drawn from the step's seeded RNG), else None (the model's 0..T-1)."""
        target = (self.cfg.get("extend") or {}).get("pose_length")  # absent from configs older than the key
        return None if target is None else pose_positions(x.shape[0], x.shape[1], int(target), x.device)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Stop "early" at max_steps: Lightning then runs a last validation, so val/* and last.ckpt
        # always describe the final weights (the ones the end-of-training evaluation scores).
        max_steps = self.trainer.max_steps
        if max_steps and max_steps > 0 and self.global_step >= max_steps:
            self.trainer.should_stop = True

    # -- bad numbers ------------------------------------------------------------------------------
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After backward (gradients already averaged over DDP ranks, so every rank decides alike: a NaN
        loss on one rank makes every rank's averaged gradient NaN): check, then clip to optim.grad_clip."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if optimizer.defaults.get("fused"):
            self._flag_nonfinite(optimizer, params, norm)
            return
        if torch.isfinite(norm) and (self._loss is None or torch.isfinite(self._loss)):  # a host sync
            if self.optim.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(params, self.optim.grad_clip, norm)
            self.log("train/grad_norm", norm)
            return
        self._bad_step(int(self.global_step), float(norm))
        for p in params:  # AdamW skips parameters without gradient: no update, moments untouched
            p.grad = None

    def _flag_nonfinite(self, optimizer: torch.optim.Optimizer, params: list, norm: torch.Tensor) -> None:
        """Fused AdamW, without a host sync: a non-finite step sets the optimizer's ``found_inf``, with which
        the fused kernel changes no parameter, moment or step count (what a GradScaler uses); the flag is
        queued and read in ``check_nonfinite``. A bad step's clipped gradients are NaN but never applied."""
        loss = self._loss if self._loss is not None else norm.new_zeros(())
        bad = ~(torch.isfinite(norm) & torch.isfinite(loss))
        if self.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.optim.grad_clip, norm)
        optimizer.found_inf = bad.float()
        self.log("train/grad_norm", norm)
        self._pending.append((int(self.global_step), bad, loss, norm))
        if len(self._pending) >= max(1, int(getattr(self.trainer, "log_every_n_steps", 1) or 1)):
            self.check_nonfinite(in_step=True)

    def check_nonfinite(self, in_step: bool = False) -> None:
        """Read the queued non-finite flags (one host sync) and count or stop for each bad step, in order.
        ``in_step``: called from a training step's hook, where the skip count may be logged."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flags = torch.stack([bad for _, bad, _, _ in pending]).tolist()
        for (step, _, loss, norm), flagged in zip(pending, flags, strict=True):
            if flagged:
                self._bad_step(step, float(norm), float(loss), log_skips=in_step)

    def on_train_end(self) -> None:
        self.check_nonfinite()

    def _bad_step(self, step: int, grad_norm: float, loss: float | None = None, log_skips: bool = True) -> None:
        if loss is None:
            loss = float(self._loss) if self._loss is not None else float("nan")
        kind = "loss" if not math.isfinite(loss) else "gradient"
        what = f"non-finite {kind} at step {step} (loss={loss}, grad_norm={grad_norm})"
        if self.optim.nonfinite == "skip" and self.nonfinite_skips < self.optim.max_skips:
            self.nonfinite_skips += 1
            if log_skips:  # Lightning allows self.log in step hooks only (not in on_save_checkpoint / on_train_end)
                self.log("train/nonfinite_skips", float(self.nonfinite_skips))
            log.warning("%s; update skipped (%d/%d, optim.max_skips).", what, self.nonfinite_skips,
                        self.optim.max_skips)
            return
        why = (f"stopped (optim.nonfinite={self.optim.nonfinite})" if self.optim.nonfinite != "skip"
               else f"already skipped {self.nonfinite_skips} steps (optim.max_skips={self.optim.max_skips})")
        raise NonFiniteError(
            f"{what}; {why} before the optimizer step. Last good checkpoint: {self.last_good_checkpoint()}. "
            "Lower optim.lr or raise optim.warmup_steps, then resume with ckpt_path=auto; "
            "or set optim.nonfinite=skip."
        )

    def last_good_checkpoint(self) -> str:
        last = Path(self.cfg["paths"]["output_dir"]) / "checkpoints" / "last.ckpt"
        if self.last_ckpt_step is None or not last.exists():
            return "none yet (no checkpoint was written before this step)"
        return f"{last} (step {self.last_ckpt_step})"

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.check_nonfinite()  # a stop queued by the fused path comes before any later checkpoint
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # never replace a good checkpoint with a broken state
            raise NonFiniteError(f"refusing to write a checkpoint at step {self.global_step}: non-finite "
                                 f"weights in {bad[:3]}. Last good checkpoint: {self.last_good_checkpoint()}.")
        checkpoint["pelab"] = {"nonfinite_skips": self.nonfinite_skips, "metrics": self.run_metrics()}
        self.last_ckpt_step = int(self.global_step)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint.get("pelab") or {}
        self.nonfinite_skips = int(saved.get("nonfinite_skips", 0))
        self.restored_metrics = dict(saved.get("metrics") or {})
        self.last_ckpt_step = int(checkpoint.get("global_step", 0))

    def run_metrics(self, trainer: L.Trainer | None = None) -> dict[str, float]:
        """The latest val/* and train/* values: this fit's, over those of the checkpoint it resumed from."""
        metrics = (trainer or self.trainer).callback_metrics
        now = {k: float(v) for k, v in metrics.items() if k.startswith(("val/", "train/"))}
        return {**self.restored_metrics, **now}

    # -- validation ------------------------------------------------------------------------------
    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self(x)
        self.val_nll.update(self.nll(logits, y, reduction="sum"))
        self.val_tokens.update(torch.tensor(float(y.numel()), device=self.device))
        # per window, for the interval (the windows are spread over the split: the independent unit)
        self.val_windows.update(self.nll(logits, y, reduction="none").view_as(y).float().mean(-1))

    def on_validation_epoch_end(self) -> None:
        nll, n = self.val_nll.compute(), self.val_tokens.compute()  # reduced over ranks
        loss = nll / n.clamp_min(1)
        self.log("val/loss", loss, sync_dist=False, rank_zero_only=False)
        self.log("val/ppl", torch.exp(loss.clamp(max=80.0)), prog_bar=True)
        lo, hi = stats.mean_interval(self.val_windows.compute().double().cpu().numpy())  # 95%, bootstrap
        self.log_dict({"val/ppl_lo": math.exp(min(lo, 80.0)), "val/ppl_hi": math.exp(min(hi, 80.0))})
        self.val_nll.reset()
        self.val_tokens.reset()
        self.val_windows.reset()

    # -- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> dict:
        build = get_method(self.optim._target_)  # conf/optim: adamw_cosine (pelab.training.optimizer) by default
        return build(self.model, self.optim, self.device, self.trainer.max_steps)
