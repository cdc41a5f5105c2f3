"""Extrapolation measured during training (`eval.at`): at fractions of `trainer.max_steps`, the perplexity at every
evaluation length on the test blocks, logged against the step (W&B, CSV) and kept in summary.json
(`along_training`) and in the checkpoints (a resumed run keeps the points it had).

A point in the middle of a cosine schedule is not the end of a shorter run (the learning rate is still high
there), so these points are labelled "mid-schedule"; compare budgets with separate runs (README "Evaluation").
Each point runs at the validation step nearest its fraction, inside validation, so its time is not counted as
training time (`train/tokens_per_sec`). It may score fewer tokens than the final evaluation
(`eval.at_tokens`): its interval says what that costs. With `eval.at_probes` each point also runs the probes (the
run's `probes` settings, as at the end), their metrics in the same record: retrieval along training.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import lightning.pytorch as L
from lightning.pytorch.callbacks import Callback

from pelab.evaluation.config import EvalConfig, ProbesConfig, resolve_lengths
from pelab.evaluation.extrapolation import evaluate_extrapolation
from pelab.evaluation.suite import eval_blocks

log = logging.getLogger(__name__)


def steps_at(fractions: list[float], max_steps: int, every: int) -> dict[int, float]:
    """{step: fraction asked} for the fractions below 1 (1 is the end-of-training evaluation), each at the
    validation step nearest to fraction x max_steps, a tie going to the later one (at least the first
    validation, before the last step). The point's record says the fraction it ran at, step / max_steps."""
    out = {}
    for f in sorted(set(fractions)):
        if f < 1.0:
            # floor(x + 0.5), not round(): round() ties to even, so ties went earlier or later by the step count
            step = max(every, math.floor(f * max_steps / every + 0.5) * every)
            if step < max_steps:
                out.setdefault(step, f)
    return out


class EvaluationAlongTraining(Callback):
    """`eval.at`: the extrapolation evaluation at fractions of training (see the module doc). `ev`: the run's eval
    settings (lengths, at, tokens / at_tokens, seed, split, batch_tokens); `on_point(record)` is told each new point
    (the harness writes it into summary.json)."""

    def __init__(self, ev: EvalConfig, train_length: int, on_point: Callable[[dict], None] | None = None,
                 probes: ProbesConfig | None = None):
        self.ev, self.train_length, self.on_point = ev, int(train_length), on_point
        self.probes = probes  # eval.at_probes: the run's probe settings (None: perplexity only)
        self.lengths = resolve_lengths(list(ev.lengths), self.train_length)
        self.records: list[dict[str, Any]] = []
        self.steps: dict[int, float] = {}
        self.text = None  # suite.EvalBlocks

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        every = int(trainer.val_check_interval) if trainer.val_check_interval else 1
        self.steps = steps_at(list(self.ev.at), int(trainer.max_steps), every)
        for step, asked in self.steps.items():
            if step != asked * trainer.max_steps:  # said at the start: the point is not where it was asked for
                log.info("eval.at %.3g runs at step %d, %.3g of training: the nearest validation step "
                         "(trainer.val_check_interval=%d)", asked, step, step / trainer.max_steps, every)
        if self.steps:
            budget = replace(self.ev, tokens=self.ev.tokens if self.ev.at_tokens is None else self.ev.at_tokens)
            self.text = eval_blocks(trainer.datamodule, budget, self.lengths)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = int(trainer.global_step)
        if trainer.sanity_checking or step not in self.steps or any(r["step"] == step for r in self.records):
            return
        t0 = time.perf_counter()
        result = evaluate_extrapolation(pl_module.model, self.text.blocks, self.lengths, self.train_length,
                                        device=pl_module.device, protocols=("nonoverlap",),
                                        batch_tokens=self.ev.batch_tokens)
        result.split, result.seed = self.ev.split, self.ev.seed
        result.block_docs = self.text.docs.tolist()  # intervals clustered by document, as at the end
        metrics = result.metrics()
        if self.probes is not None:
            metrics |= self.probe_metrics(trainer, pl_module)
        record = {"step": step, "fraction": step / int(trainer.max_steps), "asked": self.steps[step],
                  "schedule": "mid-schedule",
                  "tokens_seen": int(pl_module.tokens_per_step() * step), "blocks": result.blocks,
                  "split": result.split, "seconds": round(time.perf_counter() - t0, 2), "metrics": metrics}
        self.records.append(record)
        shown = [f"ppl@{L} {result.ppl(L):.3g}" for L in self.lengths]
        shown += [f"{k.removeprefix('probe/')} {v:.3g}" for k, v in metrics.items() if k.startswith("probe/") and "/acc@" in k]
        log.info("eval.at %.3g (step %d, mid-schedule): %s in %.1f s", record["fraction"], step, ", ".join(shown),
                 record["seconds"])
        pl_module.log_dict({k: v for k, v in metrics.items() if not math.isnan(v)}, rank_zero_only=True)
        if self.on_point is not None:
            self.on_point(record)

    def probe_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """The end-of-training probe evaluation (pelab.evaluation.builtin.run_probe_cells) at this point, its
        figures dropped (the end draws them)."""
        import matplotlib.pyplot as plt

        from pelab.evaluation.builtin import run_probe_cells
        from pelab.evaluation.registry import EvalSettings

        settings = EvalSettings(None, self.ev, self.probes, self.train_length, self.lengths, self.text.blocks,
                                pl_module.device, label="")
        probed = run_probe_cells(pl_module.model, trainer.datamodule, settings)
        for fig in probed.figures.values():
            plt.close(fig)
        return probed.metrics

    def state_dict(self) -> dict[str, Any]:
        return {"records": self.records}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = list(state.get("records") or [])
