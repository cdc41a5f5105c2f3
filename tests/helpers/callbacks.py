"""Test callbacks, instantiated from the config like any callback (`+callbacks.x._target_=helpers.callbacks.X`),
in-process or in a launched `train.py` (which gets tests/ on its PYTHONPATH: helpers.runs.launch)."""

from __future__ import annotations

import time

import torch
from lightning.pytorch.callbacks import Callback


class SlowSteps(Callback):
    """From step `after` on, each step starts with a `seconds` sleep, announced on stdout (and its end too), so that
    a signal can be sent while a step is under way and a test can tell whether the step went on after it."""

    def __init__(self, after: int = 0, seconds: float = 5.0):
        self.after, self.seconds = after, seconds

    def on_train_batch_start(self, trainer, *_) -> None:
        if trainer.global_step >= self.after:
            print(f"slow step {trainer.global_step}", flush=True)
            time.sleep(self.seconds)
            print(f"slow step {trainer.global_step} done", flush=True)


class WorsenAfter(Callback):
    """From step `step` on, noise on the token embeddings before every validation, so that the later validations
    are worse than the one before."""

    def __init__(self, step: int):
        self.step = step

    def on_validation_start(self, trainer, pl_module):
        if trainer.global_step >= self.step:
            with torch.no_grad():
                pl_module.model.tok_emb.weight.add_(torch.randn_like(pl_module.model.tok_emb.weight))


class DiskFullAtLast(Callback):
    """Every write of `last.ckpt` fails as a full disk does (ENOSPC, the file named), the other checkpoints are
    written: a run whose disk filled at its first last.ckpt, after best.ckpt of the same validation."""

    def on_fit_start(self, trainer, pl_module) -> None:
        import errno

        save = trainer.save_checkpoint

        def full_at_last(filepath, *args, **kwargs):
            if str(filepath).endswith("last.ckpt"):
                raise OSError(errno.ENOSPC, "No space left on device", str(filepath))
            return save(filepath, *args, **kwargs)

        trainer.save_checkpoint = full_at_last
