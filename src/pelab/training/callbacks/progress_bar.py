"""The progress bar of conf/callbacks/default.yaml `progress_bar`: Rich on a terminal, tqdm in logs."""

from __future__ import annotations

import sys

import lightning.pytorch as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress import ProgressBar


class SparseRichProgressBar(RichProgressBar):
    """Lightning's RichProgressBar, reading its metrics (train/loss, ...: `.item()`, a host sync on CUDA) only
    every `refresh_rate` training steps: the stock bar reads them after every step whatever its refresh rate
    (lightning 2.6 `RichProgressBar.on_train_batch_end`). TQDMProgressBar already reads them only when it
    refreshes."""

    def _update_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training and trainer.global_step % max(self.refresh_rate, 1):
            return
        super()._update_metrics(trainer, pl_module)


def progress_bar(refresh_rate: int = 10, log_refresh_rate: int = 50) -> ProgressBar:
    """Rich on a terminal, its metrics read every `refresh_rate` steps; plain tqdm every `log_refresh_rate`
    steps in logs and CI."""
    if sys.stdout.isatty():
        return SparseRichProgressBar(refresh_rate=refresh_rate)
    return TQDMProgressBar(refresh_rate=log_refresh_rate)
