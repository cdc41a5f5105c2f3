"""summary.json kept current during fit; `pelab.runs.build` always adds it (not a conf/callbacks entry)."""

from __future__ import annotations

import lightning.pytorch as L
from lightning.pytorch.trainer.states import TrainerFn

from pelab.training.job import JobRecord


class SummaryUpdates(L.Callback):
    """summary.json kept current during fit: the step and the val/*, train/* metrics after each validation
    (`job`: the job's record; only its own process of rank 0 writes)."""

    def __init__(self, job: JobRecord):
        self.job = job

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self.job.summary.update(global_step=int(trainer.global_step), metrics=pl_module.run_metrics(trainer))
        self.job.save()
