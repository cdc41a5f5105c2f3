"""Will one training step, and the evaluation at the longest length, fit in memory? An estimate, checked before
the first step: refused in one line naming the setting to lower when it exceeds the memory available, a warning
above 80%. And an out-of-memory failure during training as one line, not a traceback (or the kernel's kill).

The estimate (bytes; fp32 4, bf16 autocast 2 for activations):
  weights, gradients and AdamW's two moments    4 x N x 4
  activations kept for backward, per layer      B x T x (12 D + 3 d_ff) x act   (q, k, v, attention output, MLP,
                                                                                norms, residuals)
  attention scores, per layer                   B x H x C x T x 4 x 2           where a path materialises them:
                                                the explicit / additive-mask paths on CPU (C = attn_chunk_size
                                                query rows at a time, forward and backward); none for SDPA
                                                without a bias (flash / memory-efficient kernels). A
                                                layout whose every layer is local (model.layout, a window
                                                or chunk S) reads C + S - 1 keys per chunk, not T: the most
                                                over the layers that materialise scores replaces T (a local
                                                layer always takes the additive-mask path)
  logits, log-softmax and their gradient        3 x B x T x V x 4
And the probes' instances, held in host memory for one length at a time: every (kind, depth) cell's
probes.samples instances as Python lists, about 8 KB + 24 bytes per token each (measured: 7.8 KB at 128 tokens,
26 KB at 1024, the peak while they are built).
It errs high (calibration: experiments/benchmarks/README.md, "Memory estimate"). The
memory available: PELAB_AVAILABLE_MEMORY (bytes; the tests set it), else the free CUDA memory of the device, else
Linux's MemAvailable.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pelab.errors import ConfigError

if TYPE_CHECKING:
    from pelab.training.config import TrainSettings

log = logging.getLogger(__name__)

WARN_FRACTION = 0.8
GB = 1e9


def available_memory(cuda: bool = False) -> float | None:
    """Bytes this process may still allocate, or None where it cannot be told."""
    if os.environ.get("PELAB_AVAILABLE_MEMORY"):
        return float(os.environ["PELAB_AVAILABLE_MEMORY"])
    if cuda:
        import torch

        return float(torch.cuda.mem_get_info()[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class Estimate:
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])[:3]
        return ", ".join(f"{k} {v / GB:.1f} GB" for k, v in big)


def training_step(n_params: int, batch: int, length: int, d_model: int, d_ff: int, n_layers: int, n_heads: int,
                  vocab: int, chunk: int, scores_materialised: bool, act_bytes: int = 4,
                  keys: int | None = None) -> Estimate:
    """The estimate of one training step on one device (`batch`: rows per device); see the module doc. `keys`:
    the most key columns a query chunk reads (local spans), default `length`."""
    c, keys = min(chunk, length), min(keys or length, length)
    return Estimate({
        "weights + gradients + AdamW": 16.0 * n_params,
        "activations": float(batch * length * (12 * d_model + 3 * d_ff) * act_bytes * n_layers),
        "attention scores": float(batch * n_heads * c * keys * 4 * 2 * n_layers) if scores_materialised else 0.0,
        "logits": 3.0 * batch * length * vocab * 4,
    })


def evaluation(n_params: int, windows: int, length: int, d_model: int, d_ff: int, n_heads: int, vocab: int,
               chunk: int, keys: int | None = None) -> Estimate:
    """The estimate of one evaluation forward at `length` (no gradients; one layer's activations alive); `keys`
    as in `training_step`."""
    c, keys = min(chunk, length), min(keys or length, length)
    return Estimate({
        "weights": 4.0 * n_params,
        "activations": float(windows * length * (4 * d_model + d_ff) * 4 * 2),
        "attention scores": float(windows * n_heads * c * keys * 4 * 2),
        "logits": 2.0 * windows * length * vocab * 4,
    })


PROBE_SAMPLE_BYTES, PROBE_TOKEN_BYTES = 8192, 24


def probe_instances(samples: int, cells: int, length: int) -> Estimate:
    """The probes' instances alive at once: `cells` (kinds x depths) x `samples` at `length` tokens (module doc)."""
    return Estimate({"probe instances": float(samples) * cells * (PROBE_SAMPLE_BYTES + PROBE_TOKEN_BYTES * length)})


def check(estimate: Estimate, what: str, fix: str, cuda: bool = False, warn: bool = True) -> None:
    """Refuse `estimate` above the memory available (one line: `what` needs about X, `fix`); warn above 80%."""
    have = available_memory(cuda)
    if have is None:
        return
    need = estimate.total
    if need > have:
        raise ConfigError(f"{what} needs about {need / GB:.1f} GB ({estimate.describe()}), more than the "
                          f"{have / GB:.1f} GB available; {fix}.")
    if warn and need > WARN_FRACTION * have:
        log.warning("%s needs about %.1f GB of the %.1f GB available (%s): close to running out of memory",
                    what, need / GB, have / GB, estimate.describe())


def is_out_of_memory(err: BaseException) -> bool:
    """A failed allocation PyTorch raised (CUDA or CPU), as opposed to the kernel killing the process."""
    import torch

    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def check_memory(settings: TrainSettings, model, vocab: int, rows_per_device: int, precision: str,
                 cuda: bool, warn: bool = True) -> None:
    """The training step and the evaluation at the longest length of a run, against the memory available
    (`warn`: also warn above WARN_FRACTION)."""
    from pelab.evaluation.config import resolve_lengths

    c, ev = model.config, settings.eval
    n = sum(p.numel() for p in model.parameters())
    length = settings.data.seq_len
    # the additive-mask / explicit paths (a score bias, a content bias or a local span): their key columns
    materialised = model.score_keys(length) > 0
    act = 2 if str(precision).startswith(("bf16", "16")) else 4
    step = training_step(n, rows_per_device, length, c.d_model, c.d_ff, c.n_layers, c.n_heads, vocab,
                         c.attn_chunk_size, materialised, act, model.score_keys(length))
    check(step, f"a training step at data.seq_len={length} with {rows_per_device} rows per device "
                f"(data.batch_size={settings.data.batch_size})",
          "lower data.batch_size or data.seq_len (or the model's size, model.*)", cuda, warn)
    if settings.run.evaluate_after_fit:
        longest = max(resolve_lengths(list(ev.lengths), length) + [length])
        windows = max(1, min(64, ev.batch_tokens // longest))
        check(evaluation(n, windows, longest, c.d_model, c.d_ff, c.n_heads, vocab, c.attn_chunk_size,
                         model.score_keys(longest) or longest),
              f"the evaluation at {longest} tokens ({windows} windows per batch, eval.batch_tokens="
              f"{ev.batch_tokens})", "lower the longest eval.lengths or eval.batch_tokens", cuda, warn)
        check_probe_memory(settings, warn)


def check_probe_memory(settings: TrainSettings, warn: bool = True) -> None:
    """The probes' instances of the final evaluation, in host memory (a CUDA run builds them on the CPU too)."""
    from pelab.evaluation.config import resolve_lengths

    p = settings.probes
    if not (p.enabled and p.kinds):
        return
    train_length = settings.data.seq_len
    offset = (max(p.prefix_multiples, default=0) + 1) * train_length  # an offset kind's window and its prefix
    longest = max(resolve_lengths(list(p.lengths), train_length) + [offset])
    cells = len(p.kinds) * len(p.depths)
    check(probe_instances(p.samples, cells, longest),
          f"the probes' instances ({p.samples} per cell, probes.samples={p.samples}; {cells} cells of "
          f"probes.kinds x probes.depths, up to {longest} tokens)", "lower probes.samples", warn=warn)


def check_memory_before_data(settings: TrainSettings, model_cfg, pe_cfg, rows_per_device: int, precision: str,
                             cuda: bool) -> None:
    """`check_memory` before the token cache is built (a BPE cache: tens of seconds), on the run's model built on
    the meta device (no memory, ~20 ms) with a one-id vocabulary: the estimate grows with the vocabulary, so what
    this refuses the check after the build (the real vocabulary) refuses too. Its warnings wait for that check."""
    import torch

    from pelab.model import build_model

    with torch.device("meta"):
        model = build_model(model_cfg, pe_cfg, 1, settings.data.seq_len)
    check_memory(settings, model, 1, rows_per_device, precision, cuda, warn=False)
