"""The evaluation suite run after training and by `eval.py`: every registered evaluation (extrapolation,
attention diagnostics, probes, and any a plugin registers; pelab.evaluation.registry) -> metrics, summary.json,
plots, W&B.

One function, `run_evaluation`, so the end-of-training numbers and a standalone `eval.py` of the same
checkpoint are computed by exactly the same code on exactly the same tokens.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import torch
from omegaconf import DictConfig, OmegaConf

from pelab.data.recall import import_plugins
from pelab.errors import ConfigError
from pelab.evaluation import progress
from pelab.evaluation.blocks import block_documents
from pelab.evaluation.config import EvalConfig, ProbesConfig, resolve_lengths, typed_evaluation
from pelab.evaluation.extrapolation import blocks_for_budget, spread_blocks
from pelab.evaluation.plots import save_figure
from pelab.evaluation.registry import EVALUATIONS, EvalResult, EvalSettings
from pelab.metric_keys import with_variant

log = logging.getLogger(__name__)


class EvalBlocks(NamedTuple):
    """The evaluation text: blocks (K, N + 1), the document of each (K,), the split's document count."""

    blocks: torch.Tensor
    docs: Any
    split_documents: int


def eval_blocks(datamodule: Any, ecfg: EvalConfig, lengths: list[int]) -> EvalBlocks:
    """The blocks every length scores: `eval.tokens` (null: the whole split) in blocks of the longest length,
    drawn over the whole `eval.split` by `eval.seed`, stratified by document (`spread_blocks`), with the document
    each belongs to (`blocks.block_documents`: the intervals resample documents)."""
    block = max(lengths)
    tokens = datamodule.eval_tokens(ecfg.split)  # the whole split, (n,) int64
    doc_starts = datamodule.document_starts(ecfg.split)  # (n_docs + 1,)
    check_eval_budget(str(ecfg.split), ecfg.tokens, block, len(tokens))
    blocks, starts = spread_blocks(tokens, block, blocks_for_budget(ecfg.tokens, block), int(ecfg.seed), doc_starts)
    return EvalBlocks(blocks, block_documents(starts, block, doc_starts), len(doc_starts) - 1)


def check_eval_budget(split: str, tokens: int | None, block: int, available: int, key: str = "eval.tokens") -> None:
    """An evaluation budget (`tokens` of `split`, in windows of the longest length `block`) against the split, once
    its size is known (before any training): one line naming the setting to change."""
    if available < block + 1:
        raise ConfigError(f"eval.split={split} has {available} tokens, fewer than one window of the longest "
                          f"eval length {block} (+1); lower eval.lengths or use a larger corpus.")
    most = ((available - 1) // block) * block
    if tokens is not None and int(tokens) > most:
        raise ConfigError(f"{key}={tokens} is more than the {split} split holds in windows of the longest "
                          f"length {block} ({most} tokens); lower it, or set {key}=null for the whole split.")


def run_evaluation(
    model: torch.nn.Module,
    datamodule: Any,
    cfg: DictConfig,
    output_dir: Path,
    run: Any | None = None,
    summary: dict | None = None,
    prefix: str = "",
    typed: tuple[EvalConfig, ProbesConfig] | None = None,
    progress_bar: bool = False,
) -> dict[str, float]:
    """Run every registered evaluation this config enables (pelab.evaluation.registry.EVALUATIONS, in order);
    return flat metrics (also logged to `run` and stored in `summary`).

    `typed`: the config's `eval` and `probes` groups as the run's validation typed them (None: typed here,
    `typed_evaluation`). `prefix` namespaces a variant (e.g. a RoPE scaling type in eval.py): metrics become
    `extrap/{prefix}/ppl@L` style keys and files `plots/{prefix}_*.png`. `progress_bar`: each evaluation draws a
    bar of its forwards (pelab.evaluation.progress).
    """
    ev, probes = typed if typed is not None else typed_evaluation(cfg)
    import_plugins(probes.plugins)
    train_length = int(cfg.data.seq_len)
    lengths = resolve_lengths(list(ev.lengths), train_length)
    label = cfg.pe.name if not prefix else f"{cfg.pe.name} ({prefix})"
    text = eval_blocks(datamodule, ev, lengths)
    # the run this one extends (train.py fills extend.parent; null, or absent before the key existed: none)
    parent_length = OmegaConf.select(cfg, "extend.parent.train_length")
    settings = EvalSettings(cfg, ev, probes, train_length, lengths, text.blocks, next(model.parameters()).device,
                            label, text.docs.tolist(), text.split_documents,
                            int(parent_length) if parent_length else None)
    with progress.showing(progress_bar):
        results = {name: e.run(model, datamodule, settings) for name, e in EVALUATIONS.items() if e.enabled(settings)}
    metrics = {k: v for r in results.values() for k, v in r.metrics.items()}
    if prefix:
        metrics = {with_variant(k, prefix): v for k, v in metrics.items()}
    figures = {k: f for r in results.values() for k, f in r.figures.items()}
    paths = save_figures(figures, output_dir / "plots", prefix)
    if summary is not None:
        summary[f"evaluation/{prefix}" if prefix else "evaluation"] = summary_entry(results, paths)
    if run is not None:
        log_to_wandb(run, metrics, results, paths, prefix)
    for fig in figures.values():
        plt.close(fig)
    return metrics


def summary_entry(results: dict[str, EvalResult], paths: dict[str, Path]) -> dict[str, Any]:
    """summary.json's `evaluation`: each evaluation's record by name (null for one that is off and says so),
    the figures' paths and the seconds of the timed ones."""
    entry: dict[str, Any] = {name: results[name].record if name in results else None
                             for name, ev in EVALUATIONS.items() if name in results or ev.null_when_off}
    entry["plots"] = {k: str(p) for k, p in paths.items()}
    entry["seconds"] = {name: r.seconds for name, r in results.items() if r.seconds is not None}
    return entry


def save_figures(figures: dict[str, Any], folder: Path, prefix: str = "") -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {k: save_figure(f, folder / f"{prefix + '_' if prefix else ''}{k}.png") for k, f in figures.items()}


def log_to_wandb(run: Any, metrics: dict, results: dict[str, EvalResult], paths: dict[str, Path],
                 prefix: str = "") -> None:
    """Scalars into the summary (and one history row), each evaluation's tables and plots, the PNGs."""
    import wandb

    ns = f"{prefix}/" if prefix else ""
    data: dict[str, Any] = dict(metrics)
    for name, r in results.items():
        if EVALUATIONS[name].wandb is not None:
            data.update(EVALUATIONS[name].wandb(r, ns))
    for key, path in paths.items():
        data[f"plots/{ns}{key}"] = wandb.Image(str(path))
    try:
        run.log(data)
        run.summary.update(metrics)
    except Exception as err:  # noqa: BLE001 - W&B trouble must not lose the evaluation (summary.json has it)
        log.warning("W&B logging of the evaluation failed: %s", err)
