"""The built-in evaluations, registered in the order the suite runs them: extrapolation (perplexity by length,
loss by position), attention diagnostics (eval.diagnostics.enabled), probes (probes.enabled and probes.kinds).
The run functions import torch-side modules when called, so that the report can read this table without torch."""

from __future__ import annotations

import logging
import time
from typing import Any

from pelab.evaluation.registry import EvalResult, EvalSettings, Evaluation, ReportSection, register_evaluation

log = logging.getLogger(__name__)

# Attention statistics: (report table title, figure axis label), the one copy of their labels.
ATTENTION_LABELS = {
    "entropy": ("Attention entropy (nats)", "entropy (nats)"),
    "distance": ("Mean attention distance (tokens)", "mean attention distance (tokens)"),
    "mass_past_L": ("Attention mass at distances >= the training length", "attention mass at distances >= L"),
    "max_logit": ("Largest pre-softmax logit (mean over queries)", "largest pre-softmax logit"),
}


# ---------------------------------------------------------------------------------------------
# extrapolation


def run_extrapolation(model: Any, datamodule: Any, s: EvalSettings) -> EvalResult:
    """Perplexity at each evaluation length on the shared blocks; figures: ppl vs length, loss by position."""
    from pelab.evaluation.extrapolation import evaluate_extrapolation
    from pelab.evaluation.plots import plot_loss_by_position, plot_ppl_vs_length

    ecfg = s.eval
    log.info("extrapolation: lengths %s on %d %s tokens (%d blocks of %d)", s.lengths, s.blocks[:, 1:].numel(),
             ecfg.split, s.blocks.shape[0], s.blocks.shape[1] - 1)
    t0 = time.perf_counter()
    extrap = evaluate_extrapolation(
        model, s.blocks, s.lengths, s.train_length,
        stride=ecfg.stride, device=s.device, bytes_per_token=datamodule.bytes_per_token,
        protocols=list(ecfg.protocols), batch_tokens=int(ecfg.batch_tokens),
    )
    seconds = time.perf_counter() - t0
    extrap.parent_train_length = s.parent_train_length
    extrap.split, extrap.seed = str(ecfg.split), int(ecfg.seed)
    extrap.block_docs, extrap.split_documents = s.block_docs, s.split_documents  # the intervals' unit
    curves = {f"{s.label} nonoverlap": extrap.ppl_by_length("nonoverlap")}
    if "sliding" in extrap.protocols:
        curves[f"{s.label} sliding"] = extrap.ppl_by_length("sliding")
    figures = {"ppl_vs_length": plot_ppl_vs_length(curves, s.train_length)}
    if extrap.loss_by_position:
        figures["loss_by_position"] = plot_loss_by_position({s.label: extrap.loss_by_position}, s.train_length)
    return EvalResult(extrap.metrics(), extrap.to_dict(), figures, extrap.rows(), seconds, extrap)


def extrapolation_wandb(r: EvalResult, ns: str) -> dict[str, Any]:
    """The table of cells, a line plot of ppl vs length (and vs the parent's length), loss by position."""
    import wandb

    extrap, rows = r.result, r.rows
    data: dict[str, Any] = {}
    cols = ["length", *(["x_parent"] if extrap.parent_train_length else []), "protocol", "ppl", "bpb", "nll",
            "n_tokens", "note"]
    data[f"extrap/{ns}table"] = wandb.Table(columns=cols, data=[[row[c] for c in cols] for row in rows])
    nonover = wandb.Table(columns=["length", "ppl"],
                          data=[[row["length"], row["ppl"]] for row in rows if row["protocol"] == "nonoverlap"])
    data[f"extrap/{ns}ppl_vs_length"] = wandb.plot.line(nonover, "length", "ppl",
                                                        title="Perplexity vs evaluation length")
    if extrap.parent_train_length:  # an extended run: the same curve on the parent's axis
        by_parent = wandb.Table(columns=["x_parent", "ppl"], data=[[row["x_parent"], row["ppl"]] for row in rows
                                                                   if row["protocol"] == "nonoverlap"])
        data[f"extrap/{ns}ppl_vs_parent_x"] = wandb.plot.line(
            by_parent, "x_parent", "ppl", title="Perplexity vs length / the parent's training length")
    if extrap.loss_by_position:
        pos_table = wandb.Table(columns=["position", "loss"],
                                data=[[i, v] for i, v in enumerate(extrap.loss_by_position)])
        data[f"extrap/{ns}loss_by_position"] = wandb.plot.line(pos_table, "position", "loss",
                                                               title="Loss by token position")
    return data


# ---------------------------------------------------------------------------------------------
# attention diagnostics


def attention_enabled(s: EvalSettings) -> bool:
    return s.eval.diagnostics.enabled


def run_attention(model: Any, datamodule: Any, s: EvalSettings) -> EvalResult:
    """Attention statistics by length on the extrapolation blocks end to end (windows of a length dividing theirs
    stay inside); one figure per statistic: value vs length, one line per layer."""
    from pelab.evaluation.attention_stats import STATS, attention_diagnostics, layer_curves, metrics
    from pelab.evaluation.plots import plot_ppl_vs_length
    from pelab.summary import json_safe

    text = s.blocks[:, :-1].reshape(-1)
    attention = attention_diagnostics(model, text, s.lengths, s.train_length, s.eval.diagnostics.windows)
    log.info("attention diagnostics: %.2f s", attention["seconds"])
    figures = {}
    for stat in STATS:
        series = {f"layer {layer}": curve for layer, curve in layer_curves(attention["rows"], stat).items()}
        figures[f"attn_{stat}"] = plot_ppl_vs_length(
            series, s.train_length, title=f"{s.label}: attention {stat} vs length",
            ylabel=ATTENTION_LABELS[stat][1], yscale="linear")
    return EvalResult(metrics(attention["rows"]), json_safe(attention), figures, attention["rows"],
                      attention["seconds"], attention)


def attention_wandb(r: EvalResult, ns: str) -> dict[str, Any]:
    """The diagnostics as one W&B table and, per statistic, a line plot of value vs length, one line per layer."""
    import wandb

    from pelab.evaluation.attention_stats import STATS, layer_curves

    cols = ["length", "layer", "head", "q_lo", "q_hi", *STATS, "max_logit_peak"]
    data: dict[str, Any] = {f"attn/{ns}table": wandb.Table(columns=cols, data=[[row[c] for c in cols] for row in r.rows])}
    for stat in STATS:
        series = layer_curves(r.rows, stat)
        xs = sorted({n for curve in series.values() for n in curve})
        data[f"attn/{ns}{stat}_vs_length"] = wandb.plot.line_series(
            xs=xs, ys=[[series[layer].get(n, float("nan")) for n in xs] for layer in series],
            keys=[f"layer {layer}" for layer in series], title=f"attention {stat} vs length", xname="length")
    return data


ATTENTION_SECTION = ReportSection(
    "Attention diagnostics",
    tables=tuple((f"attn/{stat}", title) for stat, (title, _) in ATTENTION_LABELS.items()),
    figures=tuple(f"attn_{stat}_vs_length" for stat in ATTENTION_LABELS),
    text="eval.diagnostics.enabled=true runs (pelab.evaluation.attention_stats): at each length, the queries of its "
         "last position bucket ([L/2, L) past the training length), mean over layers and heads.",
)


# ---------------------------------------------------------------------------------------------
# probes


def probes_enabled(s: EvalSettings) -> bool:
    return s.probes.enabled and bool(s.probes.kinds)


def run_probe_cells(model: Any, datamodule: Any, s: EvalSettings) -> EvalResult:
    """The lost-in-the-middle probes of probes.kinds (filler: the start of the evaluation split)."""
    from pelab.evaluation.config import resolve_lengths
    from pelab.evaluation.effective_length import effective_length_metrics, effective_length_record
    from pelab.evaluation.plots import probe_figures
    from pelab.evaluation.probes import run_probes

    ecfg, pcfg = s.eval, s.probes
    p_lengths = resolve_lengths(list(pcfg.lengths), s.train_length)
    filler = datamodule.eval_tokens(ecfg.split, min(datamodule.n_tokens(ecfg.split), 4 * max(p_lengths)))
    log.info("probes: %s at depths %s, lengths %s", list(pcfg.kinds), list(pcfg.depths), p_lengths)
    probes = run_probes(
        model, datamodule.tokenizer, kinds=list(pcfg.kinds), depths=list(pcfg.depths), lengths=p_lengths,
        samples_per_cell=pcfg.samples, seed=pcfg.seed, filler_ids=filler if pcfg.filler == "val" else None,
        device=s.device, train_length=s.train_length, batch_tokens=ecfg.batch_tokens,
        prefix_multiples=list(pcfg.prefix_multiples), key_len=pcfg.key_len, value_len=pcfg.value_len,
        pairs=pcfg.pairs, ruler=pcfg.ruler,
    )
    # the effective length per kind (pelab.evaluation.effective_length) beside the probes' own metrics, and in the
    # record the rule and what it read (in-window accuracy, the lower bound at each length)
    metrics = {**probes.metrics(), **effective_length_metrics(probes, pcfg.effective_length)}
    record = {**probes.to_dict(), "eff_length": effective_length_record(probes, pcfg.effective_length)}
    return EvalResult(metrics, record, probe_figures(probes, s.label), probes.rows(), None, probes)


def probes_wandb(r: EvalResult, ns: str) -> dict[str, Any]:
    """One table per kind: n, the Wilson interval (lo, hi), the gold's mean rank and the error split (other
    in-context value, not in the context, depth of the wrongly picked value) beside each accuracy."""
    import wandb

    probes = r.result
    pcols = ["kind", "depth", "length", "n", "acc", "lo", "hi", "logprob", "rank", "other", "absent",
             "other_depth", "chance", "chance_copy", "note"]
    data: dict[str, Any] = {}
    for kind in probes.kinds + probes.offset_kinds():
        cols = pcols + (["prefix"] if kind in probes.offset_kinds() else [])
        data[f"probe/{kind}/{ns}table"] = wandb.Table(columns=cols, data=[[row[c] for c in cols]
                                                                           for row in probes.rows(kind)])
    return data


register_evaluation(Evaluation("extrapolation", run_extrapolation, wandb=extrapolation_wandb))
register_evaluation(Evaluation("attention", run_attention, enabled=attention_enabled, wandb=attention_wandb,
                               sections=(ATTENTION_SECTION,)))
register_evaluation(Evaluation("probes", run_probe_cells, enabled=probes_enabled, wandb=probes_wandb,
                               null_when_off=True))
