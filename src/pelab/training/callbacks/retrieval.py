"""Train to an in-window retrieval criterion: schemes differ in how fast they learn retrieval at
all, so a fixed step budget confounds learnability with extrapolation. This callback scores a fixed set of
probe instances at the training length every ``every_n_steps`` steps, logs ``train/retrieval_acc``, and
stops training once it reaches ``threshold`` (``train/steps_to_criterion``; NaN = not acquired within
``trainer.max_steps``, the cap). Probe instances come from the probe seed stream: never trained on.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as L
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


class RetrievalCriterion(Callback):
    def __init__(self, kind: str = "mqar", threshold: float = 0.95, every_n_steps: int = 50, samples: int = 128,
                 depths: int = 8, seed: int = 4321, stop: bool = True):
        if not 0.0 < threshold <= 1.0 or every_n_steps < 1 or samples < depths or depths < 1:
            raise ValueError(f"callbacks.retrieval_criterion: threshold={threshold} must be in (0, 1], "
                             f"every_n_steps={every_n_steps} >= 1, samples={samples} >= depths={depths} >= 1")
        self.kind, self.threshold, self.every = kind, float(threshold), int(every_n_steps)
        self.n, self.depths, self.seed, self.stop = int(samples), int(depths), int(seed), bool(stop)
        self.samples: list | None = None
        self.reached: int | None = None  # step at which the criterion was first met
        self.last_acc = float("nan")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from pelab.data.recall import make_probe_samples

        dm = trainer.datamodule
        length = int(dm.seq_len)
        filler = dm.eval_tokens("val", min(dm.n_tokens("val"), 4 * length))
        per_depth = self.n // self.depths
        self.samples = [
            s
            for i in range(self.depths)
            for s in make_probe_samples(self.kind, dm.tokenizer, length, i / max(1, self.depths - 1), per_depth,
                                        self.seed, filler_ids=filler, pairs=dm.recall_pairs,  # the rows' N
                                        ruler=dm.recall_ruler)
        ]

    def accuracy(self, model: Any) -> float:
        from pelab.evaluation.probes import score_samples

        records = score_samples(model, self.samples)
        return sum(bool(r.correct) for r in records) / len(records)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step % self.every:
            return
        # every rank scores the same instances with the same weights: all ranks decide alike
        self.last_acc = self.accuracy(pl_module.model)
        pl_module.log("train/retrieval_acc", self.last_acc, rank_zero_only=True)
        if self.reached is None and self.last_acc >= self.threshold:
            self.reached = step
            log.info("retrieval criterion met at step %d: in-window %s accuracy %.3f >= %.2f", step, self.kind,
                     self.last_acc, self.threshold)
            if self.stop:
                trainer.should_stop = True
        steps = float(self.reached) if self.reached is not None else float("nan")
        pl_module.log("train/steps_to_criterion", steps, rank_zero_only=True)

    def state_dict(self) -> dict[str, Any]:
        return {"reached": self.reached, "last_acc": self.last_acc}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reached = state.get("reached")
        self.last_acc = float(state.get("last_acc", math.nan))
