"""train/tokens_per_sec and train/mfu (conf/callbacks/default.yaml `throughput`)."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only

from pelab.data.batch import Batch


def _rows(batch: Batch) -> int:  # (B, T+1) windows
    return batch.tokens.size(0)


def _tokens(batch: Batch) -> int:  # the inputs of a (B, T+1) batch: B*T tokens
    return batch.inputs.numel()


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor, logged as `train/tokens_per_sec` (all devices),
    `train/tokens_per_sec_per_device` and `train/mfu` (model FLOPs utilisation: `pl_module.flops_per_token`
    x tokens/s per device / the device's peak, from Lightning's `get_available_flops(device, dtype)`, known
    GPUs only: no MFU on CPU; `available_flops` overrides the peak). Rates are over the last
    `trainer.log_every_n_steps` steps, validation time excluded.

    Two changes to the stock callback: it reads the clock (a CUDA synchronize) only on the steps that log, not
    after every step, and it does not measure validation batches (it would log them under validation batch
    indices as steps, which W&B rejects as going backwards)."""

    def __init__(self, available_flops: float | None = None):
        super().__init__(batch_size_fn=_rows, length_fn=_tokens, window_size=2)  # 2 readings: one interval
        self.configured_flops = available_flops
        self._flops_since = 0.0  # per device, since the last reading
        self._val_t0 = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.configured_flops:
            self.available_flops = float(self.configured_flops)
            for throughput in self._throughputs.values():
                throughput.available_flops = self.available_flops

    @staticmethod
    def _clock(trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the work queued so far belongs to the time read here
        return time.perf_counter()

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        stage = RunningStage.TRAINING
        self._batches[stage] += 1
        self._samples[stage] += _rows(batch)
        self._lengths[stage] += _tokens(batch)
        self._flops_since += pl_module.flops_per_token * _tokens(batch)
        if not trainer._logger_connector.should_update_logs:
            return
        self._throughputs[stage].update(time=self._clock(trainer) - self._t0s[stage],
                                        batches=self._batches[stage], samples=self._samples[stage],
                                        lengths=self._lengths[stage], flops=self._flops_since)
        self._flops_since = 0.0

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_start(trainer)
        self._flops_since = 0.0

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           *_: Any) -> None:
        self._update(trainer, pl_module, batch, trainer.fit_loop.total_batch_idx + 1)
        if not trainer._logger_connector.should_update_logs:
            return
        m = self._throughputs[RunningStage.TRAINING].compute()
        if "device/items_per_sec" not in m:  # the first reading: no interval yet
            return
        per_device = m["device/items_per_sec"]
        pl_module.log("train/tokens_per_sec", per_device * trainer.world_size, prog_bar=True, rank_zero_only=True)
        pl_module.log("train/tokens_per_sec_per_device", per_device, rank_zero_only=True)
        if "device/mfu" in m:
            pl_module.log("train/mfu", m["device/mfu"], rank_zero_only=True)

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, *_: Any) -> None:
        if not trainer.sanity_checking:
            self._val_t0 = self._clock(trainer)

    def on_validation_batch_end(self, *_: Any, **__: Any) -> None:
        pass

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, *_: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._t0s[RunningStage.TRAINING] += self._clock(trainer) - self._val_t0  # not training time
