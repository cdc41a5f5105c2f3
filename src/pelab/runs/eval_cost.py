"""What the end-of-training evaluation (and the evaluations during training, eval.at) will cost, known before the
first step: its compute against the training's, printed, and a warning when the evaluation would cost more than the
training itself (a long `data.seq_len` with the default 1-8 x L lengths, the sliding protocol, many probe instances).
FLOPs, PaLM's estimate (`flops_per_token`: 6 N + 12 l d T for a training token); an evaluation token is a forward
only, a third: 2 N + 4 l d T at its window length T.

  extrapolation   every length's scored tokens once (nonoverlap); sliding re-reads T / stride tokens per token
  probes          probes.samples x kinds x depths instances of each probe length, a whole forward each
  along training  each eval.at point: the extrapolation on eval.at_tokens (nonoverlap), and the probes with
                  eval.at_probes
  training        trainer.max_steps x data.batch_size x data.seq_len training tokens
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pelab.evaluation.progress import forward_flops_per_token  # the one formula, shared with the bar

if TYPE_CHECKING:
    from pelab.training.config import TrainSettings

log = logging.getLogger(__name__)

WARN_RATIO = 1.0  # the evaluation costs more than the training: said before training starts,
WARN_FLOPS = 1e12  # unless it is cheap anyway (a smoke run's few steps; a 2-core CPU does ~1e11 FLOP/s)


@dataclass
class EvalCost:
    extrapolation: float  # FLOPs
    probes: float
    training: float
    along: float = 0.0  # the evaluations during training (eval.at), all points together
    points: int = 0

    @property
    def ratio(self) -> float:
        evaluation = self.extrapolation + self.probes + self.along
        return evaluation / self.training if self.training else float("inf")

    def record(self) -> dict[str, float]:
        """summary.json's `eval_cost`: TFLOP of each part, and the evaluations' share of the training's."""
        return {"extrapolation_tflop": self.extrapolation / 1e12, "probes_tflop": self.probes / 1e12,
                "along_training_tflop": self.along / 1e12, "along_training_points": self.points,
                "training_tflop": self.training / 1e12, "ratio": self.ratio}

    def line(self) -> str:
        total = self.extrapolation + self.probes
        during = (f"; during training (eval.at, {self.points} point{'s' * (self.points > 1)}): about "
                  f"{self.along / 1e12:.3g} TFLOP" if self.points else "")
        return (f"evaluation after training: about {total / 1e12:.3g} TFLOP (extrapolation "
                f"{self.extrapolation / 1e12:.3g}, probes {self.probes / 1e12:.3g}){during}; {self.ratio:.2g} x the "
                f"training's {self.training / 1e12:.3g} TFLOP")


def extrapolation_flops(matmul_params: int, n_layers: int, d_model: int, lengths: Sequence[int], tokens: int,
                        stride: int, sliding: bool) -> float:
    """`tokens` scored at each of `lengths` (nonoverlap), and re-read L / stride times under sliding."""
    total = 0.0
    for length in lengths:
        per_token = forward_flops_per_token(matmul_params, n_layers, d_model, length)
        reads = 1.0 + (max(1.0, length / stride) if sliding and length > stride else 0.0)
        total += tokens * reads * per_token
    return total


def probe_flops(matmul_params: int, n_layers: int, d_model: int, lengths: Sequence[int], instances: int) -> float:
    """`instances` per probe length (samples x kinds x depths), each a forward over its length."""
    return sum(instances * length * forward_flops_per_token(matmul_params, n_layers, d_model, length)
               for length in lengths)


def estimate_eval_cost(settings: TrainSettings, model: Any, split_tokens: int, train_flops_per_token: float
                       ) -> EvalCost:
    """The final evaluation of a run's settings (`model`: the GPT, `split_tokens`: the evaluation split's size)."""
    from pelab.evaluation.config import resolve_lengths
    from pelab.evaluation.extrapolation import blocks_for_budget
    from pelab.training.callbacks.along_training import steps_at

    ev, p, length = settings.eval, settings.probes, settings.data.seq_len
    n, layers, d = model.matmul_params(), model.config.n_layers, model.config.d_model
    lengths = sorted(set(resolve_lengths(list(ev.lengths), length)) | {length})
    longest = lengths[-1]
    blocks = blocks_for_budget(ev.tokens, longest)
    tokens = blocks * longest if blocks is not None else split_tokens // longest * longest
    extrapolation = extrapolation_flops(n, layers, d, lengths, tokens, int(ev.stride or length),
                                        "sliding" in ev.protocols)
    probes = 0.0
    if p.enabled and p.kinds:
        probes = probe_flops(n, layers, d, resolve_lengths(list(p.lengths), length),
                             p.samples * len(p.kinds) * len(p.depths))
    # eval.at: the points that run (fractions below 1, at validation steps), each on eval.at_tokens
    points = len(steps_at(list(ev.at), int(settings.trainer.max_steps), int(settings.trainer.val_check_interval)))
    at_blocks = blocks_for_budget(ev.tokens if ev.at_tokens is None else ev.at_tokens, longest)
    at_tokens = at_blocks * longest if at_blocks is not None else split_tokens // longest * longest
    along = points * (extrapolation_flops(n, layers, d, lengths, at_tokens, length, sliding=False)
                      + (probes if ev.at_probes else 0.0))
    training = float(settings.trainer.max_steps) * settings.data.batch_size * length * train_flops_per_token
    return EvalCost(extrapolation, probes, training, along, points)


def report_eval_cost(cost: EvalCost) -> None:
    """The estimate as a log line; a warning, naming the settings that set it, above WARN_RATIO and WARN_FLOPS."""
    if cost.ratio > WARN_RATIO and cost.extrapolation + cost.probes + cost.along > WARN_FLOPS:
        log.warning("%s: the evaluation costs more than the training (lower eval.lengths or eval.tokens, drop the "
                    "sliding protocol from eval.protocols, lower probes.samples or probes.lengths, fewer eval.at "
                    "points, or set evaluate_after_fit=false)", cost.line())
    else:
        log.info("%s", cost.line())
