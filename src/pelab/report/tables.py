"""Rendering, tables: the markdown tables of the report (metrics by length, probes, runs, failures)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pelab.evaluation.stats import (
    MIN_SEEDS,
    budget_interaction,
    difference_interval,
    edge_mask,
    seeds_accuracy_interval,
    t_interval,
    wilson,
)
from pelab.metric_keys import interval_keys, metric_key, parse_key
from pelab.provenance import provenance_state
from pelab.report.aggregation import (
    Row,
    acquired,
    aggregate,
    along_training_points,
    budget_key,
    by_length,
    curves,
    fmt_number,
    metric_lengths,
    outcome_matrix,
    val_curves,
)
from pelab.report.comparisons import Comparison
from pelab.report.discovery import Job
from pelab.report.eval_text import clustered_ppl, run_interval
from pelab.report.questions import POWER, Answer, Holds, Judgement


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    notes: list[str] = field(default_factory=list)
    collapsed: bool = False  # rendered inside <details> (long per-row tables)

    def markdown(self) -> str:
        lines = [
            f"| {' | '.join(self.columns)} |",
            f"|{'|'.join(['---'] + ['---:'] * (len(self.columns) - 1))}|",
        ]
        lines += [f"| {' | '.join(r)} |" for r in self.rows]
        out = ([self.caption, ""] if self.caption else []) + lines
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)


def metric_table(
    rows: Sequence[Row],
    name: str,
    title: str,
    digits: int = 2,
    caption: str = "",
    protocol: str | None = None,
) -> Table | None:
    """rows x lengths of `name@L` (mean ± std over seeds); the training-length cell in bold.
    `protocol` picks the notes (why a cell is n/a) from the extrapolation rows."""
    cells = by_length(rows, name, lambda v: aggregate(v, digits))
    if cells.columns.empty:
        return None
    lengths = [int(L) for L in cells.columns]
    seeds = "seeds" if any(len(r.jobs) > 1 for r in rows) else "seed"
    table = Table(title, ["encoding", seeds] + [str(L) for L in lengths], [], caption)
    for r, (_, line) in zip(rows, cells.fillna("—").iterrows()):
        marked = [
            f"**{c}**" if L == r.train_length and c not in ("—", "n/a") else c for L, c in zip(lengths, line)
        ]
        table.rows.append([r.label, ",".join(map(str, r.seeds))] + marked)
        if protocol:
            table.notes += [
                f"{r.label} @ {L}: {n}" for L, n in extrapolation_notes(r, protocol).items() if L in lengths
            ]
    return table


def extrapolation_notes(row: Row, protocol: str) -> dict[int, str]:
    """{length: note} for cells that could not be evaluated (e.g. learned positions past their table)."""
    notes: dict[int, str] = {}
    for job in row.jobs:
        for rec in job.extrapolation.get("rows") or []:
            if rec.get("protocol") == protocol and rec.get("note"):
                notes.setdefault(int(rec["length"]), str(rec["note"]))
    return notes


def probe_notes(rows: Sequence[Row], kind: str) -> list[str]:
    """Why probe cells are n/a ("kv needs at least 37 tokens ..."), once per (row, length)."""
    notes: dict[tuple[str, int], str] = {}
    for r in rows:
        for j in r.jobs:
            for rec in j.probes.get("rows") or []:
                if rec.get("kind") == kind and rec.get("note"):
                    notes.setdefault((r.label, int(rec["length"])), str(rec["note"]))
    return [f"{label} @ {L}: {n}" for (label, L), n in notes.items()]


def interval_cell(row: Row, metric: str, digits: int = 2) -> str:
    """``metric`` (e.g. "extrap/ppl@128") of a row with its 95% interval: with one seed the run's own interval
    (perplexities and their ratios: a bootstrap over the documents of the evaluation text, ``eval_text``; other
    metrics: ``<name>_lo@L`` / ``<name>_hi@L``, e.g. over probe instances), "0.85 [0.80, 0.89]";
    with several, the mean over seeds and its t interval over the seeds, "0.85 [0.79, 0.91] (3 seeds)" (for
    perplexities and ratios on the log scale: the geometric mean, i.e. exp of the mean NLL, and an interval
    that stays positive); probe accuracies and gaps with several seeds: a bootstrap over seeds, then instances.
    Not applicable, diverged and partial cells as ``aggregate`` says them."""
    k = parse_key(metric)
    vals = [j.metrics[metric] for j in row.jobs if metric in j.metrics]
    if len(row.jobs) == 1 and len(vals) == 1 and math.isfinite(vals[0]):
        m = row.jobs[0].metrics
        lo, hi = (m.get(b, math.nan) for b in interval_keys(metric))
        if (c := run_interval(row.jobs[0], metric)) is not None:  # perplexities: clustered by document
            lo, hi = c.lo, c.hi
        if math.isfinite(lo) and math.isfinite(hi):
            return f"{fmt_number(vals[0], digits)} [{fmt_number(lo, digits)}, {fmt_number(hi, digits)}]"
        return fmt_number(vals[0], digits)
    # probe outcomes are kept for the main evaluation only (no variant)
    probe = k.family == "probe" and not k.variant and k.stat_name in ("acc", "lim_gap")
    if probe and len(vals) == len(row.jobs) > 1 and all(math.isfinite(v) for v in vals):
        groups = [instance_scores(j, k.kind, k.length, k.stat) for j in row.jobs]
        if all(len(g) for g in groups):  # seeds, then instances: both kinds of spread
            if k.stat == "acc":  # the rules of one seed (stats.depth_summary), over the seeds together
                _, lo, hi = seeds_accuracy_interval([job_outcomes(j, k.kind, k.length) for j in row.jobs])
            else:
                _, lo, hi = difference_interval(groups)  # (all instances alike: a bound, not [x, x])
            mid = statistics.fmean(vals)
            return f"{fmt_number(mid, digits)} [{fmt_number(lo, digits)}, {fmt_number(hi, digits)}] ({len(vals)} seeds)"
    if len(vals) == len(row.jobs) > 1 and all(math.isfinite(v) for v in vals):
        if k.stat.startswith("ppl"):  # perplexities and their ratios: on the log scale
            lo, hi = (math.exp(x) for x in t_interval([math.log(v) for v in vals]))
            mid = math.exp(statistics.fmean(math.log(v) for v in vals))  # = exp(mean NLL over seeds)
        else:
            (lo, hi), mid = t_interval(vals), statistics.fmean(vals)
        return f"{fmt_number(mid, digits)} [{fmt_number(lo, digits)}, {fmt_number(hi, digits)}] ({len(vals)} seeds)"
    return aggregate(vals, digits)


def job_outcomes(job: Job, kind: str, length: int) -> list[list[bool]]:
    """One run's probe outcomes at one length, a list per depth (mqar_offset: per prefix) over the same instances."""
    return outcome_matrix(job, kind, length)[1].astype(bool).tolist()


def instance_scores(job: Job, kind: str, length: int, what: str = "acc") -> list[float]:
    """Per probe instance of one run at one length: its mean outcome over depths (`acc`) or its edges-minus-
    middle gap (`lim_gap`), from the per-instance outcome bits in summary.json ([] without them)."""
    depths, x = outcome_matrix(job, kind, length)  # (depths, instances)
    if not depths:
        return []
    if what == "acc":
        return x.mean(axis=0).tolist()
    edges = edge_mask(depths)
    return [] if edges is None else (x[edges].mean(axis=0) - x[~edges].mean(axis=0)).tolist()


def interval_table(rows: Sequence[Row], name: str, title: str, caption: str = "", digits: int = 2,
                   protocol: str | None = None) -> Table | None:
    """rows x lengths of ``name@L`` with intervals (``interval_cell``); the training length in bold.
    `protocol` picks the notes (why a cell is n/a) from the extrapolation rows."""
    lengths = metric_lengths(rows, name)
    if not lengths:
        return None
    seeds = "seeds" if any(len(r.jobs) > 1 for r in rows) else "seed"
    table = Table(title, ["encoding", seeds] + [str(L) for L in lengths], [], caption)
    for r in rows:
        cells = [interval_cell(r, metric_key(name, L), digits) for L in lengths]
        marked = [
            f"**{c}**" if L == r.train_length and c not in ("—", "n/a") else c for L, c in zip(lengths, cells)
        ]
        table.rows.append([r.label, ",".join(map(str, r.seeds))] + marked)
        if protocol:
            table.notes += [
                f"{r.label} @ {L}: {n}" for L, n in extrapolation_notes(r, protocol).items() if L in lengths
            ]
    return table


def _in_window(row: Row, kind: str) -> int | None:
    """The training length when probed there, else the shortest probed length."""
    lengths = metric_lengths([row], f"probe/{kind}/acc")
    return row.train_length if row.train_length in lengths else (lengths[0] if lengths else None)


def _seed_values(row: Row, metric: str, fmt: Callable[[float], str]) -> str:
    vals = list(dict.fromkeys(fmt(j.metrics[metric]) for j in row.jobs if metric in j.metrics))
    return ", ".join(vals) or "—"


def criterion_table(rows: Sequence[Row]) -> Table | None:
    """Steps to the in-window retrieval criterion per seed ("not acquired" by the end) and the in-window accuracy
    at the end: read beside every extrapolation number (schemes differ in how fast they learn retrieval at all).
    Runs that stopped at the criterion and runs that only logged it (a fixed budget,
    callbacks.retrieval_criterion.stop=false) are told apart."""
    rows = [r for r in rows if any(acquired(j) is not None for j in r.jobs)]
    if not rows:
        return None
    stops = {bool((j.setting("callbacks.retrieval_criterion") or {}).get("stop", True))
             for r in rows for j in r.jobs if acquired(j) is not None}
    how = {frozenset({True}): "training stops once it reaches the threshold",
           frozenset({False}): "a fixed budget: the criterion only logs when it was first reached, training goes on "
                               "to trainer.max_steps",
           frozenset({True, False}): "some runs stop there, others only log it (a fixed budget)"}[frozenset(stops)]
    t = Table("Retrieval training: the in-window criterion", ["encoding", "seeds", "steps to criterion",
              "in-window accuracy at the end"], [], caption=(
        f"callbacks.retrieval_criterion: the in-window accuracy on fixed probe instances, checked during training; "
        f"{how}. \"not acquired\" = never reached by the last step. Rows not acquired are left out of the probe "
        "tables, figures and comparisons below (their own tables follow them)."))
    for r in rows:
        jobs = sorted((j for j in r.jobs if acquired(j) is not None), key=lambda j: j.setting("seed"))  # as the seeds
        steps = ", ".join(
            str(int(j.metrics["train/steps_to_criterion"])) if acquired(j)
            else f"not acquired (by step {j.setting('trainer.max_steps')})" for j in jobs)
        accs = ", ".join(f"{j.metrics['train/retrieval_acc']:.3f}" for j in jobs)
        t.rows.append([r.label, ",".join(str(j.setting("seed")) for j in jobs), steps, accs])
    return t


RETRIEVAL_AT = (0.25, 0.5, 0.8, 1.0)  # acquisition happens early (a third to half of training): a quarter is shown


def retrieval_curve_table(rows: Sequence[Row]) -> Table | None:
    """The criterion's in-window accuracy (train/retrieval_acc in the CSV log) at a quarter, half, four fifths and
    the end of training (mean ± std over the seeds), and its change over the last fifth with a 95 % t-interval over
    the seeds: is a scheme's in-window retrieval still rising when training stops (an in-window comparison that may
    still move), or flat (acquired, or stuck)? Every seed, acquired or not, of the runs on a fixed budget: a run that
    stopped at the criterion (its `stop`) was not left to move."""
    fixed = [Row(r.label, r.train_length, [j for j in r.jobs if acquired(j) is not None and not bool(
        (j.setting("callbacks.retrieval_criterion") or {}).get("stop", True))]) for r in rows]
    found = [(r, c[sorted(c.columns)]) for r in fixed if not (c := curves(r, "train/retrieval_acc")).empty]
    if not found:
        return None
    shown = [c for _, c in found]
    heads = [f"accuracy at {_shown(shown, f)} of steps" for f in RETRIEVAL_AT]
    t = Table("Retrieval training: in-window accuracy during training", ["encoding", "seeds with a log", *heads,
              f"change since {_shown(shown, 0.8)} [95 % t over seeds]"], [], caption=(
        "callbacks.retrieval_criterion's in-window accuracy from each run's CSV log (csv/metrics.csv), at the "
        "logged steps nearest a quarter, half, four fifths and the end of training (the columns say which "
        "fraction they are), every seed whether it acquired the task or not, of the runs on a fixed budget "
        "(callbacks.retrieval_criterion.stop=false); mean ± std over the seeds. A change "
        "whose interval excludes 0 means in-window retrieval was still moving at this step budget, so an in-window "
        "comparison with that row may still move with more steps."))
    for r, c in found:
        at = {f: c.apply(_at_fraction, fraction=f) for f in RETRIEVAL_AT}  # per seed
        change = (at[1.0] - at[0.8]).dropna()
        lo, hi = t_interval(change.tolist())  # nan with fewer than two seeds: the mean alone
        moved = "—" if change.empty else f"{change.mean():+.3f}" + (
            f" [{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else "")
        t.rows.append([r.label, ",".join(map(str, c.columns)), *(aggregate(at[f], 3) for f in RETRIEVAL_AT), moved])
    return t


def acquisition_table(rows: Sequence[Row]) -> Table | None:
    """Per row, how many of its seeds reached the in-window criterion by the end, as a rate with its 95 % Wilson
    interval over the seeds: how reliably a scheme acquires retrieval at all (a question of its own beside any
    comparison of the runs that did)."""
    rows = [r for r in rows if any(acquired(j) is not None for j in r.jobs)]
    if not rows:
        return None
    t = Table("Retrieval training: acquisition rate", ["encoding", "seeds", "acquired", "rate [95 % Wilson]"], [],
              caption="The seeds whose in-window accuracy reached the criterion by the last step, of the seeds run; "
                      "the interval is over seeds (Wilson), so a few seeds give a wide one.")
    for r in rows:
        flags = [bool(acquired(j)) for j in r.jobs if acquired(j) is not None]
        k, n = sum(flags), len(flags)
        lo, hi = wilson(k, n)
        t.rows.append([r.label, ",".join(map(str, r.seeds)), f"{k} of {n}", f"{k / n:.2f} [{lo:.2f}, {hi:.2f}]"])
    return t

CONVERGENCE_AT = (0.5, 0.8, 1.0)  # fractions of the training steps shown; the last two give the late change


def _nearest_step(curve: pd.Series, fraction: float) -> tuple[int, float]:
    """The validation step nearest `fraction` of training (a tie: the later one) and the fraction it is. CSV
    steps count from 0: step s ends s + 1 steps (v3: 80 % of 1,500 is step 1,249, 83 %; not 999, the last third)."""
    steps = curve.dropna().index  # a seed may not have logged every step of the others
    step = min(steps, key=lambda s: (abs(s + 1 - fraction * (steps.max() + 1)), -s))
    return step, (step + 1) / (steps.max() + 1)


def _at_fraction(curve: pd.Series, fraction: float) -> float:
    return float(curve.loc[_nearest_step(curve, fraction)[0]]) if curve.notna().any() else math.nan


def _shown(curves: list[pd.DataFrame], fraction: float) -> str:
    """The percent of training the runs' steps nearest `fraction` are: the column says what it shows."""
    pct = sorted({round(100 * _nearest_step(c[s], fraction)[1]) for c in curves for s in c if c[s].notna().any()})
    return f"{pct[0]}%" if pct[0] == pct[-1] else f"{pct[0]}–{pct[-1]}%"


def convergence_table(rows: Sequence[Row]) -> Table | None:
    """Validation perplexity at half, four fifths and the end of training (mean ± std over the seeds that kept
    a CSV log) and its relative change over the last fifth: has in-window perplexity flattened, or would more
    steps move the comparison?"""
    curves = [(r, val_curves(r)) for r in rows]
    curves = [(r, c) for r, c in curves if not c.empty]
    if not curves:
        return None
    heads = [f"val ppl at {_shown([c for _, c in curves], f)} of steps" for f in CONVERGENCE_AT]
    t = Table("Convergence: validation perplexity during training", ["encoding", "seeds with a log", *heads,
              f"change since {_shown([c for _, c in curves], 0.8)}"], [], caption=(
        "From each run's CSV log (csv/metrics.csv), at the validation steps nearest half, four fifths and the end "
        "of training (the columns say which fraction they are); a change near 0% means in-window perplexity has "
        "flattened at this step budget (learning-rate schedule included)."))
    for r, c in curves:
        at = {f: c.apply(_at_fraction, fraction=f) for f in CONVERGENCE_AT}  # per seed
        change = 100 * (at[1.0] / at[0.8] - 1)
        t.rows.append([r.label, ",".join(map(str, c.columns)), *(aggregate(at[f]) for f in CONVERGENCE_AT),
                       aggregate(change, 1) + " %"])
    return t


def short_hash(job: Job) -> str:
    fp = (job.summary.get("data") or {}).get("fingerprint") or {}
    return str(fp.get("key") or "")[:8] or "—"


def _fmt_int(x: Any) -> str:
    return f"{int(x):,}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def evaluation_text(job: Job) -> str:
    """Where a run's extrapolation numbers come from: "test: 224 blocks of 1024 (seed 0)"; runs evaluated before
    the blocks existed scored the first eval.tokens of their eval.split."""
    ex = job.extrapolation
    if not ex:
        return "—"
    if "blocks" in ex:
        return f"{ex.get('split')}: {ex['blocks']} blocks of {max(ex.get('lengths') or [0])} (seed {ex.get('seed')})"
    return f"{job.setting('eval.split') or 'val'}: first {_fmt_int(ex.get('n_tokens'))} tokens"


def metadata_table(jobs: Sequence[Job]) -> Table:
    cols = ["job", "encoding", "seed", "L", "steps", "params", "PE params", "wall time", "launches", "val ppl",
            "tokens/s", "evaluated on", "documents (design effect)", "corpus", "commit", "machine"]
    t = Table("Runs", cols, [], caption=(
        "commit: the code's commit, and where a launch ran from uncommitted changes whether a rerun from the clean "
        "commit matched it to the digit (dirty-verified), its diff is kept (dirty-with-diff), or neither "
        "(dirty-unverified: its code cannot be told). "
        "documents: how many documents the evaluation blocks come from, and the design effect of the perplexity at "
        "the longest length (the variance of its bootstrap over documents over that of a bootstrap over blocks: "
        "how much the blocks of one document move together)."))
    for j in jobs:
        m, model = j.metrics, j.summary.get("model") or {}
        wall = j.summary.get("wall_seconds_total", j.summary.get("wall_seconds"))
        code = (j.summary.get("provenance") or {}).get("code") or {}
        host = (j.summary.get("provenance") or {}).get("machine") or {}
        commit = str(code.get("git") or "—")
        state = provenance_state(j.summary, j.folder)
        commit = (commit[:8] if len(commit) == 40 else commit) + ("" if state in ("clean", "unknown") else f" ({state})")
        machine = (f"{host.get('gpu') or host.get('cpu')}, {host.get('torch_threads')} thr"
                   if host else "—")
        t.rows.append(
            [
                f"`{j.folder.name}`",
                str(j.setting("pe.name")),
                str(j.setting("seed")),
                str(j.train_length),
                _fmt_int(j.summary.get("global_step")),
                _fmt_int(model.get("params")),
                _fmt_int(model.get("pe_params")),
                f"{wall / 60:.1f} min" if isinstance(wall, (int, float)) else "—",
                str(len(j.summary.get("launches") or [])) or "—",
                interval_or(m, "val/ppl"),
                _fmt_int(m.get("train/tokens_per_sec")),
                evaluation_text(j),
                _documents(j),
                f"`{short_hash(j)}`",
                f"`{commit}`",
                machine,
            ]
        )
    return t


def _documents(job: Job) -> str:
    """"27 (deff 34 at 1024)": the documents behind the run's evaluation blocks, the design effect at its longest
    length; "—" where the documents cannot be had (the cell's interval then says why)."""
    intervals = clustered_ppl(job)
    if not intervals:
        return "—"
    L = max(intervals)
    c = intervals[L]
    return f"{c.n_documents} (deff {c.design_effect:.3g} at {L})" if c.n_documents else "—"


def interval_or(m: dict, name: str) -> str:
    """`name` of a metrics dict with its 95% interval `<name>_lo` / `_hi` when it has one."""
    if name not in m:
        return "—"
    lo, hi = m.get(f"{name}_lo", math.nan), m.get(f"{name}_hi", math.nan)
    return f"{m[name]:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else "")


def common_settings(jobs: Sequence[Job]) -> list[str]:
    """One line per shared setting worth knowing (model, tokenizer, corpus, steps, versions)."""
    lines = []

    def shared(fn: Callable[[Job], Any]) -> Any:
        vals = {json.dumps(fn(j), sort_keys=True, default=str) for j in jobs}
        return fn(jobs[0]) if len(vals) == 1 else None

    for label, key in [
        ("model", "model.name"),
        ("layers", "model.n_layers"),
        ("heads", "model.n_heads"),
        ("width", "model.d_model"),
        ("tokenizer", "tokenizer.kind"),
        ("corpus", "data.source"),
        ("training length", "data.seq_len"),
        ("steps", "trainer.max_steps"),
        ("batch size", "data.batch_size"),
        ("lr", "optim.lr"),
        ("warmup steps", "optim.warmup_steps"),
    ]:
        v = shared(lambda j, key=key: j.setting(key))
        if v is not None:
            lines.append(f"{label}: `{v}`")
    lengths = shared(lambda j: j.extrapolation.get("lengths"))  # as evaluated, in tokens (eval.lengths may be
    if lengths:  # multiples of the training length)
        lines.append(f"evaluation lengths (tokens): `{lengths}`")
    per_source: dict[str, set[str]] = {}  # a study across corpora: one fingerprint per data.source is by design
    for j in jobs:
        per_source.setdefault(str(j.setting("data.source")), set()).add(short_hash(j))
    if len(fps := set().union(*per_source.values())) == 1:
        lines.append(f"corpus + tokenizer fingerprint: `{next(iter(fps))}`")
    elif len(per_source) > 1 and all(len(f) == 1 for f in per_source.values()):
        lines.append("corpus + tokenizer fingerprint: one per corpus, "
                     + ", ".join(f"{src} `{next(iter(f))}`" for src, f in sorted(per_source.items())))
    else:
        lines.append("**warning: the jobs used different corpora / tokenizers (fingerprints differ; see Runs)**")
    vers = shared(lambda j: j.summary.get("versions"))
    if vers:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    return lines


def failures_table(jobs: Sequence[Job]) -> Table:
    t = Table("Failed / unfinished jobs", ["job", "status", "error"], [])
    for j in jobs:
        t.rows.append([f"`{j.folder}`", j.status, last_line(j.error, 300).replace("|", "\\|")])
    return t


def last_line(text: str, width: int) -> str:
    """The last line of an error (the exception itself, after any traceback), cut to `width`."""
    return (text.strip().splitlines() or [""])[-1][:width]


# ---------------------------------------------------------------------------------------------
# paired comparisons and comparisons along training


def comparison_tables(comparisons: Sequence[Comparison]) -> list[Table]:
    """One table per compared metric: a row per pair, a cell per length: the ratio first / second (the mean of the
    per-seed log differences, exponentiated; retrieval: the mean per-seed accuracy difference) with its Bonferroni
    interval over the seeds, the Holm-adjusted p and the verdict."""
    tables = []
    m = sum(not c.note for c in comparisons)
    level = next((c.level for c in comparisons if not c.note), 0.95)
    for name in dict.fromkeys(c.key.name for c in comparisons):
        these = [c for c in comparisons if c.key.name == name]
        lengths = sorted({c.key.length for c in these})
        diff = these[0].scale == "diff"
        caption = (f"{name} of the first minus the second: per seed the difference of the two runs' accuracies, then "
                   "its mean over the seeds" if diff else
                   f"{name} of the first over the second, per seed then averaged on the log scale")
        t = Table(f"Paired comparisons: {name}", ["pair"] + [str(L) for L in lengths], [],
                  caption=(f"{caption}; the seed is the unit (same seed = same batches, evaluation blocks and probe "
                           "instances). "
                           + (f"Beside it its {level:.1%} interval over the seeds (Bonferroni over the {m} "
                              f"comparisons of this report: they hold jointly), the Holm-adjusted p over the same {m}, "
                              "and the verdict: resolved where the adjusted p < 0.05. " if m else "")
                           + f"No verdict with fewer than {MIN_SEEDS} paired seeds. An exploratory family: the pairs "
                           "the options picked, not questions declared before the runs."),
                  collapsed=len({(c.a.label, c.b.label) for c in these}) > 12)
        fmt = (lambda c: f"{c.ratio:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]") if diff else (
            lambda c: f"{c.ratio:.3f} [{c.lo:.3f}, {c.hi:.3f}]")
        for a, b in dict.fromkeys((c.a.label, c.b.label) for c in these):
            by_len = {c.key.length: c for c in these if (c.a.label, c.b.label) == (a, b)}
            t.rows.append([f"{a} / {b}"] + [_comparison_cell(c, fmt) if (c := by_len.get(L)) else "—"
                                            for L in lengths])
        tables.append(t)
    return tables


def _comparison_cell(c: Comparison, fmt: Callable[[Comparison], str]) -> str:
    if c.note and c.n and math.isfinite(c.ratio):  # untested but measured: the estimate, and why no verdict
        return (f"{c.ratio:.3f}" if c.scale == "log" else f"{c.ratio:+.3f}") + f" ({c.note})"
    return c.verdict() if c.note else f"{fmt(c)} p_adj={c.p_adj:.2g} {c.verdict()}"


def _budget(row: Row) -> int | None:
    steps = {j.setting("trainer.max_steps") for j in row.jobs}
    return steps.pop() if len(steps) == 1 else None


def budget_table(comparisons: Sequence[Comparison]) -> Table | None:
    """Where the rows span several training budgets (trainer.max_steps): each pair, read across them, one cell per
    metric and length: the pair's estimate and verdict at each budget, how many seed-runs have the sign of the mean,
    and the budget interaction (a t over seeds of each seed's last-minus-first contrast: runs of one seed share
    initialisation and data order), outside the family. None where no pair is compared at two budgets."""
    at_budget = [c for c in comparisons if _budget(c.a) is not None and _budget(c.a) == _budget(c.b)]
    of_pair: dict[tuple[str, str], list[Comparison]] = {}
    for c in at_budget:
        of_pair.setdefault((budget_key(c.a), budget_key(c.b)), []).append(c)
    of_pair = {k: cs for k, cs in of_pair.items() if len({_budget(c.a) for c in cs}) > 1}  # read across budgets
    if not of_pair:
        return None
    metrics = list(dict.fromkeys(parse_key(c.metric).name + (f"@{parse_key(c.metric).length}" if parse_key(
        c.metric).length else "") for cs in of_pair.values() for c in cs))
    t = Table("Across budgets", ["pair"] + metrics, [], caption=(
        "Each pair at several training budgets (trainer.max_steps): its estimate at each (res. / n.r.: whether the "
        "family's adjusted test resolves it there; — no verdict there), the seed-runs whose contrast has the sign of "
        "the mean over all of them, and the budget interaction (p of a t over seeds of each seed's last-minus-first "
        "contrast, unadjusted, outside the family: does the size of the effect move with the budget?). A claim "
        "across budgets is a declared question (`--questions`): averaged over them, or at every one."))
    for (a, b), cs in of_pair.items():
        budgets = sorted({_budget(c.a) for c in cs})
        cells = []
        for m in metrics:
            by_budget = {_budget(c.a): c for c in cs if c.metric == m}
            parts = [f"{n}: " + ("—" if (c := by_budget.get(n)) is None or not c.per_seed else
                                 (f"{c.ratio:.3f}" if c.scale == "log" else f"{c.ratio:+.3f}")
                                 + ("" if c.note else (" res." if c.resolved else " n.r."))) for n in budgets]
            cells.append(" · ".join(parts) + _across(list(by_budget.values())))
        t.rows.append([f"{a} / {b}"] + cells)
    return t


def _across(cs: Sequence[Comparison]) -> str:
    """" → same sign in k/n seed-runs; interaction p = x" for one pair's comparisons at its budgets."""
    runs = [v for c in cs for v in c.per_seed.values()]
    if not runs:
        return ""
    mean = statistics.fmean(runs)
    same = sum((v > 0) == (mean > 0) and v != 0 for v in runs)
    out = f" → sign of the mean in {same}/{len(runs)} seed-runs"
    seeds = set.intersection(*(set(c.per_seed) for c in cs)) if len(cs) > 1 else set()
    if len(cs) > 1 and seeds:
        order = sorted(cs, key=lambda c: _budget(c.a))
        x = np.array([[c.per_seed[s] for c in order] for s in sorted(seeds, key=str)])
        inter = budget_interaction(x)
        if inter is not None:
            out += (f"; interaction p = {inter.p:.2g}" if inter.tested else f"; interaction: {inter.note}")
    return out


# ---------------------------------------------------------------------------------------------
# declared questions


def question_table(answers: Sequence[Answer], where: str = "") -> Table | None:
    """The declared questions: one row each, the estimand, the seeds, the estimate with its Bonferroni interval, p,
    Holm p and the verdict. `where`: the runs asked, in the title (``across``: "data.source=stdlib")."""
    if not answers:
        return None
    m = sum(a.tested for a in answers)
    post_hoc = any(a.post_hoc for a in answers)
    t = Table("Declared questions: verdicts" + (f" ({where})" if where else ""), ["question", "estimand", "seeds", "estimate [Bonferroni interval]", "p",
                                     "p (Holm)", "verdict"], [], caption=(
        "Each question tested once: per seed the contrast (log ratio A / B shown as the ratio; accuracy: A − B), "
        "then a t over the seeds; averaged = each seed's mean over the budgets; every = the intersection-union test "
        "(the largest per-budget p; an interval per budget). "
        + (f"Holm over the {m} tested questions; the intervals are Bonferroni intervals at 1 − {answers[0].alpha:g}/{m} "
           "(they hold jointly). " if m else "No question could be tested here: each row says why. ")
        + "The seed-level tests hold for the evaluated text: every run is scored on the same blocks."
        + (" **The questions were declared after the runs (post hoc).**" if post_hoc else "")))
    for a in answers:
        budgets = ", ".join(map(str, a.budgets))
        t.rows.append([a.q.title, f"{a.q.estimand} ({budgets})" if budgets else a.q.estimand, str(a.n),
                       a.estimate_text() if a.n else "—", f"{a.p:.3g}" if math.isfinite(a.p) else "—",
                       f"{a.p_adj:.3g}" if math.isfinite(a.p_adj) else "—", a.verdict()])
    return t


def power_table(answers: Sequence[Answer], where: str = "") -> Table | None:
    """Per tested question, what its verdict is worth for the declared smallest effect (Answer.power): the sd of its
    per-seed contrasts, the power of its test at its seeds and alpha / m at that sd, the seeds that would give 80 %."""
    these = [a for a in answers if a.tested]
    if not these:
        return None
    t = Table("Declared questions: power" + (f" ({where})" if where else ""),
              ["question", "seeds", "smallest effect", "sd of the per-seed contrasts", "power at these seeds",
               "seeds for 80 %"], [], caption=(
        "The power of each question's t over its seeds for its declared smallest effect, at the spread its own seeds "
        "show and at alpha / m (Bonferroni: Holm's first step), and the seeds that spread asks for 80 %. The sd is "
        "estimated from the same few seeds: a rough guide to what a verdict, or its absence, is worth. The contrast "
        "scale: log ratio for perplexities, difference for accuracies."))
    for a in these:
        sd, power, need = a.power()
        t.rows.append([a.q.title, str(a.n), f"{a.q.smallest_effect:g}", f"{sd:.3g}" if math.isfinite(sd) else "—",
                       f"{power:.0%}" if math.isfinite(power) else "—", str(need) if need else "—"])
    return t


def holds_table(rows: Sequence[Holds]) -> Table | None:
    """``across``: per question, its estimate and Holm p at each value of the setting, the intersection-union p (the
    largest) and whether it holds on every value."""
    if not rows:
        return None
    key, values = rows[0].key, list(rows[0].answers)
    t = Table(f"Declared questions: on every {key}", ["question", *(f"{key}={v}" for v in values),
                                                        "p (the largest Holm p)", "verdict"], [], caption=(
        f"Each question asked of the runs at each {key} on their own (the tables above: one Holm family each); it "
        f"holds on every {key} when resolved at each in one direction (the intersection-union test: p = the largest "
        "of their Holm p)."))
    for h in rows:
        cells = [(f"{a.estimate_text()}, Holm p = {a.p_adj:.3g}" if a.tested else a.verdict()) + f" ({a.n} seeds)"
                 for a in h.answers.values()]
        t.rows.append([h.q.title, *cells, f"{h.p:.3g}" if math.isfinite(h.p) else "—", h.verdict()])
    return t


def retests_table(judgements: Sequence[Judgement]) -> Table | None:
    """``retests``: per earlier claim, the question that retests it, its verdict and power here, and the judgement
    by the declared rule (questions module doc)."""
    if not judgements:
        return None
    elsewhere = sorted({k for j in judgements for k in j.elsewhere})
    t = Table("Earlier claims, judged by the declared rule", ["earlier claim", "page", "question", "verdict here", "power at its seeds",
                                         *(f"at {k}" for k in elsewhere), "judgement"], [], caption=(
        "Confirmed: resolved in the claim's direction; reversed: resolved in the other; withdrawn: not resolved at "
        f"seeds with at least {POWER:.0%} power for the declared smallest effect; not confirmed (underpowered): not "
        "resolved below that power; not retested: no declared question asks it."))
    for j in judgements:
        a, q = j.answer, j.retest.question
        t.rows.append([
            j.retest.claim, j.retest.page or "—",
            "—" if q is None else f"{q + 1}" + (f" ({j.where})" if j.where else ""),
            "—" if a is None else f"{a.verdict()} ({a.n} seeds)",
            f"{j.power:.0%}" if math.isfinite(j.power) else "—",
            *((f"{b.verdict()} ({b.n} seeds)" if (b := j.elsewhere.get(k)) else "—") for k in elsewhere),
            j.word])
    return t


def _points(points) -> list[tuple[int, str]]:
    """Evaluation points along training, (training tokens, schedule), in order: by tokens, the end last."""
    return sorted(points, key=lambda p: (p[0], p[1] == "end"))


def _point_label(point: tuple[int, str]) -> str:
    tokens, schedule = point
    return f"{tokens / 1e6:.3g}M{' end' if schedule == 'end' else ''}"


def question_along_table(answers: Sequence[Answer], where: str = "") -> Table | None:
    """Per question asked at one budget, its contrast at each evaluation point along training (Answer.along)."""
    these = [a for a in answers if a.along]
    if not these:
        return None
    points = _points({p for a in these for p in a.along})
    t = Table("Declared questions along training" + (f" ({where})" if where else ""),
              ["question"] + [_point_label(p) for p in points], [], caption=(
        "Each question's contrast at each evaluation point of its runs by training tokens, over the seeds of its "
        "verdict: mid-schedule (eval.at: the learning rate is still high there, and fewer blocks are scored) and at "
        "the end (end: the verdict's own estimate). Beside each its 95% t interval over the seeds, unadjusted: "
        "descriptive, no verdict. A contrast still changing from point to point says the ordering was still moving "
        "when training stopped."))
    for a in these:
        t.rows.append([a.q.title] + [f"{a.test_text(x)} (n = {x.n})" if (x := a.along.get(p)) else "—"
                                     for p in points])
    return t


def interaction_table(answers: Sequence[Answer], where: str = "") -> Table | None:
    """Per question with several budgets: the contrast at each budget (mean over seeds) and the budget interaction
    with its 95 % interval, unadjusted, outside the family. `where` as question_table's."""
    these = [a for a in answers if len(a.budgets) > 1 and a.n]
    if not these:
        return None
    t = Table("Budget interaction" + (f" ({where})" if where else ""), ["question", "at each budget (mean over seeds)", "interaction [95 %]", "p"], [],
              caption=("Does the effect's size move with the budget? Per seed the change of its contrast with the "
                       "budget (two budgets: last minus first; more: the slope over them), a t over the seeds; "
                       "unadjusted and outside the family of declared questions."))
    for a in these:
        at = " · ".join(f"{b}: " + (f"{a.natural(float(a.contrasts[:, k].mean())):.3f}" if a.q.log else
                                    f"{float(a.contrasts[:, k].mean()):+.3f}") for k, b in enumerate(a.budgets))
        i = a.interaction
        cell = "—" if i is None else (f"{i.estimate:+.3f} [{i.lo:+.3f}, {i.hi:+.3f}]" if i.tested else i.note)
        t.rows.append([a.q.title, at, cell, f"{i.p:.2g}" if i is not None and i.tested else "—"])
    return t


def along_training_table(rows: Sequence[Row], metric: str) -> tuple[Table | None, list[str]]:
    """The metric (e.g. the ratio at the longest length) along training, per setting, at every evaluation point
    of its runs (mid-schedule points and the ends of runs of each budget), and warnings where the order of the
    settings differs between the last two budgets (ends of runs only: a mid-schedule point is not the end of a
    shorter run)."""
    by_setting: dict[str, dict[tuple[int, str], float]] = {}
    for r in rows:
        for tokens, v, schedule in along_training_points(r, metric):
            by_setting.setdefault(budget_key(r), {})[(tokens, schedule)] = v
    cols = _points({c for p in by_setting.values() for c in p})
    if not cols or not any(len(p) > 1 for p in by_setting.values()):
        return None, []
    # budget_key marks a fine-tuned setting "(from step N)"; only then does the caption need to say so
    since_parent = (" (of a fine-tuned setting: since its parent's weights)"
                    if any("(from step" in k for k in by_setting) else "")
    t = Table(f"Along training: {metric}", ["setting"] + [_point_label(c) for c in cols], [],
              caption=(f"{metric} (mean over seeds; of perplexities and their ratios the geometric mean, as in every "
                       f"other table) by training tokens{since_parent}: at the end of a run of that "
                       "budget (end), or "
                       "mid-schedule (eval.at: the learning rate is still high there, so it is not the end of a "
                       "shorter run)."))
    for s, pts in by_setting.items():
        t.rows.append([s] + [f"{pts[c]:.3f}" if c in pts else "—" for c in cols])
    ends = sorted({c for p in by_setting.values() for c, sch in p if sch == "end"})
    warnings = []
    if len(ends) >= 2:
        a, b = ends[-2], ends[-1]
        both = [s for s, p in by_setting.items() if (a, "end") in p and (b, "end") in p]
        rank = lambda c: sorted(both, key=lambda s: by_setting[s][(c, "end")])
        if rank(a) != rank(b):
            warnings.append(f"The order of the settings by {metric} differs between the last two budgets "
                            f"({a / 1e6:.3g}M: {', '.join(rank(a))}; {b / 1e6:.3g}M: {', '.join(rank(b))}): "
                            "a ranking at one budget does not hold at the other.")
    return t, warnings
