"""The evaluation suite run after training and by `eval.py`: extrapolation + probes -> metrics, plots, W&B.

One function, `run_evaluation`, so the end-of-training numbers and a standalone `eval.py` of the same
checkpoint are computed by exactly the same code on exactly the same tokens.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
from omegaconf import DictConfig

from pelab.errors import ConfigError
from pelab.evaluation.attention_stats import STATS, attention_diagnostics, by_length
from pelab.evaluation.attention_stats import metrics as attention_metrics
from pelab.evaluation.config import resolve_lengths
from pelab.evaluation.extrapolation import (
    blocks_for_budget,
    evaluate_extrapolation,
    spread_blocks,
)
from pelab.evaluation.plots import plot_loss_by_position, plot_ppl_vs_length, probe_figures, save_figure
from pelab.evaluation.probes import run_probes
from pelab.metric_keys import with_variant
from pelab.summary import json_safe

log = logging.getLogger(__name__)


def eval_blocks(datamodule: Any, ecfg: Any, lengths: list[int]) -> torch.Tensor:
    """The blocks every length scores: `eval.tokens` (null: the whole split) in blocks of the longest length,
    drawn over the whole `eval.split` by `eval.seed` (`spread_blocks`), (K, max(lengths) + 1)."""
    block = max(lengths)
    tokens = datamodule.eval_tokens(ecfg.split)  # the whole split, (n,) int64
    check_eval_budget(str(ecfg.split), ecfg.get("tokens"), block, len(tokens))
    blocks, _ = spread_blocks(tokens, block, blocks_for_budget(ecfg.get("tokens"), block), int(ecfg.get("seed", 0)))
    return blocks


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
) -> dict[str, float]:
    """Evaluate `model`; return flat metrics (also logged to `run` and stored in `summary`).

    `prefix` namespaces a variant (e.g. a RoPE scaling type in eval.py): metrics become
    `extrap/{prefix}/ppl@L` style keys and files `plots/{prefix}_*.png`.
    """
    train_length = int(cfg.data.seq_len)
    ecfg, pcfg = cfg.eval, cfg.probes
    lengths = resolve_lengths(list(ecfg.lengths), train_length)
    blocks = eval_blocks(datamodule, ecfg, lengths)
    device = next(model.parameters()).device
    log.info("extrapolation: lengths %s on %d %s tokens (%d blocks of %d)", lengths, blocks[:, 1:].numel(),
             ecfg.split, blocks.shape[0], blocks.shape[1] - 1)
    t0 = time.perf_counter()
    extrap = evaluate_extrapolation(
        model, blocks, lengths, train_length,
        stride=ecfg.get("stride"), device=device, bytes_per_token=datamodule.bytes_per_token,
        protocols=list(ecfg.protocols), batch_tokens=int(ecfg.batch_tokens),
    )
    seconds = {"extrapolation": time.perf_counter() - t0}
    extrap.parent_train_length = parent_train_length(cfg)
    extrap.split, extrap.seed = str(ecfg.split), int(ecfg.get("seed", 0))
    metrics = extrap.metrics()
    attention = None
    dcfg = ecfg.get("diagnostics") or {}
    if dcfg.get("enabled"):
        text = blocks[:, :-1].reshape(-1)  # the blocks end to end: windows of a length dividing theirs stay inside
        attention = attention_diagnostics(model, text, lengths, train_length, int(dcfg.get("windows", 2)))
        seconds["attention"] = attention["seconds"]
        log.info("attention diagnostics: %.2f s (extrapolation: %.2f s)", attention["seconds"],
                 seconds["extrapolation"])
        metrics.update(attention_metrics(attention["rows"]))
    probes = None
    if pcfg.get("enabled", True) and pcfg.get("kinds"):
        p_lengths = resolve_lengths(list(pcfg.lengths), train_length)
        filler = datamodule.eval_tokens(ecfg.split, min(datamodule.n_tokens(ecfg.split), 4 * max(p_lengths)))
        log.info("probes: %s at depths %s, lengths %s", list(pcfg.kinds), list(pcfg.depths), p_lengths)
        probes = run_probes(
            model, datamodule.tokenizer, kinds=list(pcfg.kinds), depths=list(pcfg.depths), lengths=p_lengths,
            samples_per_cell=int(pcfg.samples), seed=int(pcfg.seed),
            filler_ids=filler if pcfg.get("filler", "val") == "val" else None,
            device=device, train_length=train_length, batch_tokens=int(ecfg.batch_tokens),
            prefix_multiples=list(pcfg.get("prefix_multiples", [0, 1, 3, 7])),
            **{k: int(pcfg[k]) for k in ("key_len", "value_len", "pairs") if k in pcfg},
        )
        metrics.update(probes.metrics())
    if prefix:
        metrics = {with_variant(k, prefix): v for k, v in metrics.items()}

    label = cfg.pe.name if not prefix else f"{cfg.pe.name} ({prefix})"
    figures = make_figures(extrap, probes, label, train_length)
    if attention is not None:
        figures.update(attention_figures(attention["rows"], label, train_length))
    paths = save_figures(figures, output_dir / "plots", prefix)
    if summary is not None:
        key = f"evaluation/{prefix}" if prefix else "evaluation"
        summary[key] = {"extrapolation": extrap.to_dict(), "probes": probes.to_dict() if probes else None,
                        "plots": {k: str(p) for k, p in paths.items()}, "seconds": seconds}
        if attention is not None:
            summary[key]["attention"] = json_safe(attention)
    if run is not None:
        log_to_wandb(run, metrics, extrap, probes, paths, prefix)
        if attention is not None:
            log_attention_to_wandb(run, attention["rows"], prefix)
    for fig in figures.values():
        plt.close(fig)
    return metrics


def parent_train_length(cfg: DictConfig) -> int | None:
    """The training length of the run this one extends (train.py fills extend.parent), else None."""
    parent = (cfg.get("extend") or {}).get("parent") or {}
    return int(parent["train_length"]) if parent.get("train_length") else None


def attention_figures(rows: list[dict], label: str, train_length: int) -> dict[str, Any]:
    """One figure per statistic: its value vs evaluation length, one line per layer (mean over heads, at
    the queries of each length's last position bucket; pelab.evaluation.attention_stats.by_length)."""
    figs = {}
    for stat in STATS:
        series = {f"layer {layer}": curve for layer, curve in by_length(rows, stat).items()}
        figs[f"attn_{stat}"] = plot_ppl_vs_length(series, train_length, title=f"{label}: attention {stat} vs length",
                                                  ylabel=STAT_LABELS[stat], yscale="linear")
    return figs


STAT_LABELS = {"entropy": "entropy (nats)", "distance": "mean attention distance (tokens)",
               "mass_past_L": "attention mass at distances >= L", "max_logit": "largest pre-softmax logit"}


def log_attention_to_wandb(run: Any, rows: list[dict], prefix: str = "") -> None:
    """The diagnostics as one W&B table and, per statistic, a line plot of value vs length, one line per layer."""
    import wandb

    ns = f"{prefix}/" if prefix else ""
    cols = ["length", "layer", "head", "q_lo", "q_hi", *STATS, "max_logit_peak"]
    data: dict[str, Any] = {f"attn/{ns}table": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])}
    for stat in STATS:
        series = by_length(rows, stat)
        xs = sorted({n for curve in series.values() for n in curve})
        data[f"attn/{ns}{stat}_vs_length"] = wandb.plot.line_series(
            xs=xs, ys=[[series[layer].get(n, float("nan")) for n in xs] for layer in series],
            keys=[f"layer {layer}" for layer in series], title=f"attention {stat} vs length", xname="length")
    try:
        run.log(data)
    except Exception as err:  # noqa: BLE001 - W&B trouble must not lose the evaluation (summary.json has it)
        log.warning("W&B logging of the attention diagnostics failed: %s", err)


def make_figures(extrap: Any, probes: Any | None, label: str, train_length: int) -> dict[str, Any]:
    figs = {
        "ppl_vs_length": plot_ppl_vs_length(
            {f"{label} nonoverlap": extrap.ppl_by_length("nonoverlap"),
             **({f"{label} sliding": extrap.ppl_by_length("sliding")} if "sliding" in extrap.protocols else {})},
            train_length,
        ),
    }
    if extrap.loss_by_position:
        figs["loss_by_position"] = plot_loss_by_position({label: extrap.loss_by_position}, train_length)
    if probes is not None:
        figs.update(probe_figures(probes, label))
    return figs


def save_figures(figures: dict[str, Any], folder: Path, prefix: str = "") -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {k: save_figure(f, folder / f"{prefix + '_' if prefix else ''}{k}.png") for k, f in figures.items()}


def log_to_wandb(run: Any, metrics: dict, extrap: Any, probes: Any | None, paths: dict[str, Path],
                 prefix: str = "") -> None:
    """Scalars into the summary (and one history row), tables, a line plot of ppl vs length, PNGs."""
    import wandb

    ns = f"{prefix}/" if prefix else ""
    data: dict[str, Any] = dict(metrics)
    rows = extrap.rows()
    cols = ["length", *(["x_parent"] if extrap.parent_train_length else []), "protocol", "ppl", "bpb", "nll",
            "n_tokens", "note"]
    table = wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])
    data[f"extrap/{ns}table"] = table
    nonover = wandb.Table(columns=["length", "ppl"],
                          data=[[r["length"], r["ppl"]] for r in rows if r["protocol"] == "nonoverlap"])
    data[f"extrap/{ns}ppl_vs_length"] = wandb.plot.line(nonover, "length", "ppl",
                                                        title="Perplexity vs evaluation length")
    if extrap.parent_train_length:  # an extended run: the same curve on the parent's axis
        by_parent = wandb.Table(columns=["x_parent", "ppl"], data=[[r["x_parent"], r["ppl"]] for r in rows
                                                                   if r["protocol"] == "nonoverlap"])
        data[f"extrap/{ns}ppl_vs_parent_x"] = wandb.plot.line(
            by_parent, "x_parent", "ppl", title="Perplexity vs length / the parent's training length")
    if extrap.loss_by_position:
        pos_table = wandb.Table(columns=["position", "loss"],
                                data=[[i, v] for i, v in enumerate(extrap.loss_by_position)])
        data[f"extrap/{ns}loss_by_position"] = wandb.plot.line(pos_table, "position", "loss",
                                                               title="Loss by token position")
    if probes is not None:
        # n, the Wilson interval (lo, hi), the gold's mean rank and the error split (other in-context value,
        # not in the context, depth of the wrongly picked value) beside each accuracy
        pcols = ["kind", "depth", "length", "n", "acc", "lo", "hi", "logprob", "rank", "other", "absent",
                 "other_depth", "chance", "chance_copy", "note"]
        for kind in probes.kinds + probes.offset_kinds():
            cols = pcols + (["prefix"] if kind in probes.offset_kinds() else [])
            data[f"probe/{kind}/{ns}table"] = wandb.Table(
                columns=cols, data=[[r[c] for c in cols] for r in probes.rows(kind)])
    for key, path in paths.items():
        data[f"plots/{ns}{key}"] = wandb.Image(str(path))
    try:
        run.log(data)
        run.summary.update(metrics)
    except Exception as err:  # noqa: BLE001 - W&B trouble must not lose the evaluation (summary.json has it)
        log.warning("W&B logging of the evaluation failed: %s", err)
