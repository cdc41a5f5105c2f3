"""`best.ckpt` and `last.ckpt` of a run (conf/callbacks/default.yaml `checkpoint`): `best.ckpt` by the optimized
metric and `last.ckpt` at every validation, and, with `callbacks.checkpoint.every_n_steps=k`, `last.ckpt` every k
training steps too (what a preempted or killed run resumes from with `ckpt_path=auto`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn


class RunCheckpoint(ModelCheckpoint):
    """`best.ckpt` by `monitor` (the best validation so far) and `last.ckpt` at every validation and the end of
    training, whatever the metric did (the final weights: what eval.py and extend.from read); with
    `every_n_steps=k`, `last.ckpt` every k training steps too (written at the end of the step: a consistent
    mid-run resume point).

    Only validation metrics exist when checkpoints are taken, so a `monitor` outside `val/` (e.g. a metric
    of the end-of-training evaluation) keeps no best.ckpt instead of failing at the first validation."""

    def __init__(self, dirpath: str, monitor: str | None = None, mode: str = "min",
                 every_n_steps: int | None = None):
        monitor = monitor if monitor and monitor.startswith("val/") else None
        super().__init__(dirpath=dirpath, filename="best", monitor=monitor, mode=mode,
                         save_top_k=1 if monitor else 0, save_last=True, auto_insert_metric_name=False,
                         enable_version_counter=False)
        self.every_n_steps = every_n_steps

    @property
    def last_path(self) -> Path:
        return Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.every_n_steps and trainer.global_step % int(self.every_n_steps) == 0:
            trainer.save_checkpoint(self.last_path, weights_only=False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """last.ckpt after every validation, whatever the monitored metric did: Lightning writes "last" only on a
        step where it also wrote a top-k checkpoint (lightning 2.6 `ModelCheckpoint.on_validation_end`), so a
        validation worse than the best left last.ckpt behind (a resume lost those steps; eval.py read old
        weights)."""
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        if self._last_global_step_saved != trainer.global_step:  # Lightning saved nothing at this step
            self.last_model_path = str(self.last_path)
            trainer.save_checkpoint(self.last_path, weights_only=False)
            self._last_global_step_saved = trainer.global_step
