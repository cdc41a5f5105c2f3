"""Aggregation: finished jobs -> rows (one per setting that varies, the seeds of a setting together)
-> cells (mean ± std over seeds).

A row is a distinct value of BASE_KEYS and of any other config key that varies across the jobs,
found by grouping a DataFrame of jobs x flattened settings. Rows are ordered by model, training
length, then each encoding where it first appears (the order the sweep ran them), the plain scheme
before its variants.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from pelab.data.recall import PROBE_KINDS
from pelab.metric_keys import length_of, lengths_of, parse_key
from pelab.report.discovery import Job
from pelab.summary import as_float, retrieval_acquired

# Config keys that never define a row: the seed is aggregated over, the rest is bookkeeping.
IGNORED_KEYS = (
    "seed",
    "name",
    "tags",
    "notes",
    "paths.",
    "logger.",
    "callbacks.",
    "ckpt_path",
    "hydra.",
    "compile",  # speed settings: the same model and math up to float rounding
    "matmul_precision",  # (and a run made before a speed key existed must not become its own row)
    "threads",
    "model.attn_backend",  # the attention path: same math, tested against the reference attention
    "evaluate_after_fit",
    # a child's parent by identity (one per seed): the seed is aggregated over; the parent's step and length stay
    "extend.from",
    "extend.eval_before",  # an evaluation of the parent's weights, kept as its own job (training_free_job)
    "extend.parent.path",
    "extend.parent.name",
    "extend.parent.wandb_run_id",
)
# Always a row key (each named in the labels only where it varies); pe.name always labels a row.
BASE_KEYS = ["pe.name", "data.seq_len", "model.name"]
CHOICE_KEYS = (".source", ".kind", ".name", ".type")  # keys that name an option, preferred as row labels


@functools.cache
def pe_defaults(name: Any) -> dict[str, Any]:
    """Flattened ``pe.*`` defaults of the encoding `name` (what a run made before a knob existed ran
    with); empty for an encoding this version does not know. Cached: treat as read-only."""
    from pelab.encodings import default_pe_config  # here, not at the top: `import pelab.report` stays light

    try:
        return flatten(default_pe_config(name), "pe.") if isinstance(name, str) else {}
    except (ValueError, OSError):  # ConfigError / no such config: nothing to fill in
        return {}


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become their JSON text (hashable, comparable)."""
    if isinstance(d, dict):
        return {k: v for key, value in d.items() for k, v in flatten(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.dumps(d) if isinstance(d, list) else d}


def settings(job: Job) -> dict[str, Any]:
    """The job's flattened config, with the settings it lacks filled by their defaults: the ``pe.*`` knobs of its
    encoding, ``optim._target_`` (what builds the optimizer) where it records an optim group, and ``data._target_``
    (the DataModule: a run recorded with a ``datamodule`` group named it there; `with_data_target`). Runs made by
    older code compare equal to new runs that leave those alone; a run with another optimizer is its own row."""
    from pelab.conf_values import with_data_target
    from pelab.training.config import OPTIMIZER  # here, not at the top: `import pelab.report` stays light

    flat = flatten(with_data_target(job.config))
    filled = pe_defaults(flat.get("pe.name")) if "pe.name" in flat else {}
    if any(k.startswith("optim.") for k in flat):
        filled = {**filled, "optim._target_": OPTIMIZER}
    return {**filled, **flat} if filled else flat


def settings_frame(jobs: Sequence[Job]) -> pd.DataFrame:
    """jobs x flattened settings (columns sorted), Python values, None where a job lacks a key."""
    frame = pd.DataFrame([settings(j) for j in jobs], dtype=object)
    frame = frame.reindex(columns=sorted(set(frame.columns) | set(BASE_KEYS))).astype(object)
    return frame.where(frame.notna(), None)


def _ignored(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in IGNORED_KEYS)


# (prefix, switch): the settings under prefix act only where the switch is on (probes run, recall rows mixed in)
SWITCHED = (("probes.", "probes.enabled"), ("data.recall_", "data.recall_mix"))


def _switched_off(frame: pd.DataFrame) -> list[str]:
    """The prefixes whose switch is off (False, 0 or absent) in every job."""
    return [prefix for prefix, switch in SWITCHED
            if switch in frame.columns and not frame[switch].fillna(False).astype(bool).any()]


def varying_keys(frame: pd.DataFrame) -> list[str]:
    """Settings with more than one value across the jobs, bookkeeping keys excluded, and the settings of a part
    no job used (`SWITCHED`: probes where no job ran probes, the recall rows' where none mixed them in): a
    default changed between commits must not split runs that are the same."""
    off, switches = tuple(_switched_off(frame)), {switch for _, switch in SWITCHED}
    return [k for k in frame.columns if not _ignored(k) and frame[k].nunique(dropna=False) > 1
            and not (k.startswith(off) and k not in switches)]


def _n_groups(frame: pd.DataFrame, keys: Sequence[str]) -> int:
    return frame.groupby(list(keys), dropna=False, sort=False).ngroups


def row_keys(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(extra, label_keys): the varying keys besides BASE_KEYS that define rows (those not already
    determined by BASE_KEYS, e.g. pe.base follows pe.name), and the fewest of them that tell the rows
    apart (keys that vary together, like the settings of two different sweeps, are named once)."""
    base = BASE_KEYS
    extra = [
        k
        for k in varying_keys(frame)
        if k not in base and _n_groups(frame, base + [k]) > _n_groups(frame, base)
    ]
    target = _n_groups(frame, base + extra)
    label_keys: list[str] = []
    def order(k: str) -> tuple:
        # most values first; then a key that names a choice (data.source, tokenizer.kind: what tells two corpora
        # apart, rather than a knob that differs with them); then the shortest to print (a mix ratio, not a list)
        return (-frame[k].nunique(dropna=False), not k.endswith(CHOICE_KEYS),
                int(frame[k].astype(str).str.len().max()), k)

    for k in sorted(extra, key=order):
        if _n_groups(frame, base + label_keys) == target:
            break
        if _n_groups(frame, base + label_keys + [k]) > _n_groups(frame, base + label_keys):
            label_keys.append(k)
    return extra, label_keys


@dataclass
class Row:
    """One table row: the jobs (seeds) of one setting."""

    label: str
    train_length: int | None
    jobs: list[Job]

    @property
    def seeds(self) -> list[Any]:
        return sorted(j.setting("seed") for j in self.jobs)


class Grouping(NamedTuple):
    rows: list[Row]
    shown: list[str]  # the keys that label the rows
    also: list[str]  # keys that vary between rows but follow the shown ones (not in the labels)


def group_rows(jobs: Sequence[Job]) -> Grouping:
    """Finished jobs -> rows, one per distinct value of BASE_KEYS and of the other row-defining keys
    (`row_keys`), in display order."""
    frame = settings_frame(jobs)
    extra, label_keys = row_keys(frame)
    varying = varying_keys(frame)
    shown = ["pe.name"] + [k for k in BASE_KEYS[1:] if k in varying] + label_keys
    first_seen = {pe: i for i, pe in enumerate(frame["pe.name"].unique())}
    rows: list[Row] = []
    order: list[tuple] = []
    for positions in frame.groupby(BASE_KEYS + extra, dropna=False, sort=False).indices.values():
        f = frame.iloc[positions[0]].to_dict()
        label = _label(f, shown)
        plain = label == _label(f, [k for k in shown if k == "pe.name" or not k.startswith("pe.")])
        rows.append(Row(label, jobs[positions[0]].train_length, [jobs[i] for i in positions]))
        # model, training length, the encoding where it first appears, its plain scheme first, its knobs
        first = (str(f["model.name"]), rows[-1].train_length or 0, first_seen[f["pe.name"]], not plain)
        order.append((*first, *(_sortable(f[k]) for k in extra)))
    rows = [rows[i] for i in sorted(range(len(rows)), key=order.__getitem__)]
    return Grouping(rows, shown, [k for k in extra if k not in shown])


def _sortable(v: Any) -> tuple:
    if v is None:  # a knob left unset (the plain scheme) sorts before its variants
        return (-1, 0.0, "")
    return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, str(v))


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _label(flat: dict, shown: list[str]) -> str:
    """pe.name, then the shown keys; an encoding knob is named only where it is set (not None) and
    differs from the encoding's default: "rope", "rope pe.frequency_fraction=0.75", "kerple pe.variant=power"."""
    parts = [str(flat.get("pe.name"))]
    defaults = pe_defaults(flat.get("pe.name"))
    for k in shown[1:]:
        if k.startswith("pe.") and (flat.get(k) is None or (k in defaults and flat.get(k) == defaults[k])):
            continue
        v = _value(flat.get(k))
        parts.append(f"L={v}" if k == "data.seq_len" else (v if k == "model.name" else f"{k}={v}"))
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# cells: the seeds' values of a metric at each length, aggregated per row


def metric_lengths(rows: Sequence[Row], name: str) -> list[int]:
    """The lengths L, ascending, at which any job of `rows` has the metric `name@L` (e.g. name "extrap/ppl")."""
    return lengths_of((k for r in rows for j in r.jobs for k in j.metrics), name)


def by_length(rows: Sequence[Row], name: str, agg: Callable[[pd.Series], Any]) -> pd.DataFrame:
    """rows (by position) x lengths L (sorted) of `agg` over the seeds' values of metric `name@L` (e.g. name
    "extrap/ppl"); NaN where a row has no value at that length. No columns when no job logged the metric at any
    length."""
    values = pd.DataFrame(
        [
            (i, L, v)
            for i, r in enumerate(rows)
            for j in r.jobs
            for k, v in j.metrics.items()
            if (L := length_of(k, name)) is not None
        ],
        columns=["row", "L", "value"],
    )
    cells = values.groupby(["row", "L"])["value"].agg(agg).unstack("L") if len(values) else pd.DataFrame()
    return cells.reindex(index=range(len(rows)))


def fmt_number(x: float, digits: int) -> str:
    return f"{x:.4g}" if abs(x) >= 10_000 else f"{x:.{digits}f}"


def aggregate(values: Sequence[float] | pd.Series, digits: int = 2) -> str:
    """One table cell from the seeds' values: "12.34 ± 0.56" (sample std), "n/a" when not applicable
    (NaN), "inf" when diverged, "—" when not evaluated. Partial cases say how many seeds."""
    v = pd.Series(values, dtype=float)
    if v.empty:
        return "—"
    finite, n, n_inf = v[np.isfinite(v)], len(v), int(np.isinf(v).sum())
    if n_inf == n:
        return "inf"
    if finite.empty:
        return "n/a" if n_inf == 0 else f"inf ({n_inf}/{n})"
    cell = fmt_number(finite.mean(), digits)
    if len(finite) > 1:
        cell += f" ± {fmt_number(finite.std(), digits)}"  # pandas' std is the sample std (ddof=1)
    if len(finite) < n:
        cell += f" ({len(finite)}/{n} seeds" + (f", {n_inf} inf" if n_inf else "") + ")"
    return cell


def seed_mean(values: Any, log: bool = False) -> Any:
    """Mean over seeds (axis 0); NaN wherever a seed has a non-finite value (n/a or diverged). `log`: the geometric
    mean (perplexities and their ratios: exp of the mean log, as every table and test of the report uses)."""
    a = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.exp(np.log(a).mean(axis=0)) if log else a.mean(axis=0)
    out = np.where(np.isfinite(a).all(axis=0), m, np.nan)
    return out[()]  # a numpy scalar from one dimension, an array from more


def geometric_seed_mean(values: Any) -> Any:
    return seed_mean(values, log=True)


def mean_curve(curves: Sequence[Sequence[Any]]) -> list[float]:
    """Position-wise mean of the seeds' loss-by-position curves (the common prefix)."""
    curves = [[as_float(v) for v in c] for c in curves if c]
    n = min((len(c) for c in curves), default=0)
    return seed_mean([c[:n] for c in curves]).tolist() if n else []


def curves(row: Row, column: str) -> pd.DataFrame:
    """steps x seeds of a CSV-logged `column`, for the row's jobs that logged it."""
    by_seed = {j.setting("seed"): c for j in row.jobs if not (c := j.curve(column)).empty}
    return pd.DataFrame(by_seed).sort_index()


def val_curves(row: Row) -> pd.DataFrame:
    """steps x seeds of validation perplexity, for the row's jobs that kept a CSV log."""
    return curves(row, "val/ppl")


# ---------------------------------------------------------------------------------------------
# the in-window retrieval criterion (pelab.training.callbacks.retrieval.RetrievalCriterion)


def acquired(job: Job) -> bool | None:
    """Did the job reach its in-window retrieval criterion? None: it trained without one."""
    return retrieval_acquired(job.metrics)


def trained_on_text(row: Row) -> bool:
    """Whether any run of the row trained on text (data.recall_mix < 1): a retrieval-only run, loss on the answers,
    has no language model whose perplexity means anything."""
    return any(float(j.setting("data.recall_mix") or 0.0) < 1.0 for j in row.jobs)


def not_acquired_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows restricted to jobs that did not acquire retrieval in-window: shown in tables of their own, never
    beside (or compared with) the runs that learned it."""
    out = []
    for r in rows:
        jobs = [j for j in r.jobs if acquired(j) is False]
        if jobs:
            out.append(Row(r.label, r.train_length, jobs))
    return out


def acquired_rows(rows: Sequence[Row]) -> tuple[list[Row], list[str]]:
    """The rows restricted to jobs that acquired retrieval in-window (or had no criterion), and the labels
    of the jobs left out: their probes beyond the window measure nothing learned, so they are not plotted or
    tabulated as extrapolation."""
    kept, left_out = [], []
    for r in rows:
        jobs = [j for j in r.jobs if acquired(j) is not False]
        left_out += [f"{r.label} (seed {j.setting('seed')})" for j in r.jobs if acquired(j) is False]
        if jobs:
            kept.append(Row(r.label, r.train_length, jobs))
    return kept, left_out


# ---------------------------------------------------------------------------------------------
# probes: mean accuracy over seeds of the depth x length grids


def probe_kinds(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for j in r.jobs for k in j.probes.get("kinds") or []))


def probe_panel(row: Row, kind: str) -> dict | None:
    """{grid, depths, lengths, train_length, chance, copy, n} for one row and kind (mean over its seeds; the
    seeds probed on the first one's depth x length grid)."""
    ps = [j.probes for j in row.jobs if kind in (j.probes.get("grids") or {})]
    if not ps:
        return None
    shape = (tuple(ps[0]["depths"]), tuple(ps[0]["lengths"]))
    ps = [p for p in ps if (tuple(p["depths"]), tuple(p["lengths"])) == shape]
    grids = [[[as_float(v) for v in line] for line in p["grids"][kind]["acc"]] for p in ps]
    return {
        "grid": seed_mean(grids).tolist(),
        "depths": [float(d) for d in shape[0]],
        "lengths": [int(L) for L in shape[1]],
        "train_length": row.train_length,
        "chance": float(seed_mean([as_float((p.get("chance") or {}).get(kind)) for p in ps])),
        "copy": float(seed_mean([as_float((p.get("copy") or {}).get(kind)) for p in ps])),
        "n": len(ps),
    }


# ---------------------------------------------------------------------------------------------
# probes: per-instance outcomes and paired comparisons between rows

# Probe settings that do not change which instance sample i is (it is seeded by its index).
_NOT_PAIRING = ("samples", "kinds", "depths", "lengths", "enabled", "prefix_multiples")


def pairing_key(job: Job) -> str:
    """Jobs with equal keys probed the same instances: the same corpus and tokenizer (data fingerprint) and
    probe settings (seed, key/value lengths, filler, ...). The sample count may differ: instance i is the
    same whatever the count, so two runs share their first min(n) instances."""
    probes = {k: v for k, v in (job.setting("probes") or {}).items() if k not in _NOT_PAIRING}
    fp = ((job.summary.get("data") or {}).get("fingerprint") or {}).get("key")
    return json.dumps([fp, probes], sort_keys=True, default=str)


def probe_outcomes(job: Job, kind: str) -> dict[tuple[float, int], str]:
    """{(depth, length): outcome bits} of one job and kind (a kind with the offset layout, e.g. mqar_offset:
    (prefix multiple, length), read from the summary's "offset" rows)."""
    offset = kind in offset_kinds_of(job)
    return {
        (as_float(r["prefix" if offset else "depth"]), int(r["length"])): str(r["outcomes"])
        for r in job.probes.get("offset" if offset else "rows") or []
        if r.get("kind") == kind and r.get("outcomes")
    }


def offset_kinds_of(job: Job) -> list[str]:
    """The kinds one job probed with the offset layout (the kinds of its summary's "offset" rows)."""
    return list(dict.fromkeys(str(r.get("kind")) for r in job.probes.get("offset") or []))


def offset_kinds(rows: Sequence[Row]) -> list[str]:
    """The kinds probed with the offset layout by any job of ``rows``, in order."""
    return list(dict.fromkeys(k for r in rows for j in r.jobs for k in offset_kinds_of(j)))


def kind_title(kind: str) -> str:
    """A kind's subtitle in the report (its probe-kind entry's ``title``; "" for a kind not registered here)."""
    entry = PROBE_KINDS.get(kind)
    return entry.title if entry is not None else ""


def outcome_matrix(job: Job, kind: str, length: int) -> tuple[list[float], np.ndarray]:
    """One run's probe outcomes at one length as (depths, matrix): the depths (mqar_offset: prefixes) in order and
    a 0/1 float matrix (depths, instances), instance i the same at every depth; cut to the shortest bit string.
    ([], an empty (0, 0) matrix) where the run has no outcomes at that length."""
    cells = {d: bits for (d, L), bits in probe_outcomes(job, kind).items() if L == length}
    depths = sorted(cells)
    n = min((len(b) for b in cells.values()), default=0)
    x = np.array([[c == "1" for c in cells[d][:n]] for d in depths], dtype=float).reshape(len(depths), n)
    return depths, x  # (depths, instances)


def paired_outcomes(a: Row, b: Row, kind: str, seed: Any = None) -> dict[int, tuple[list[bool], list[bool]]]:
    """By length: the outcomes of rows a and b on the same instances. Jobs are paired by seed (seeds both
    rows ran) when they probed the same instances (``pairing_key``); per (seed, depth) cell the common
    prefix of the two bit strings. Lengths without a common cell are left out. `seed`: that seed's jobs only."""
    out: dict[int, tuple[list[bool], list[bool]]] = {}
    b_by_seed = {j.setting("seed"): j for j in b.jobs}
    for ja in a.jobs if seed is None else [j for j in a.jobs if j.setting("seed") == seed]:
        jb = b_by_seed.get(ja.setting("seed"))
        if jb is None or pairing_key(ja) != pairing_key(jb):
            continue
        oa, ob = probe_outcomes(ja, kind), probe_outcomes(jb, kind)
        for cell in sorted(set(oa) & set(ob)):
            n = min(len(oa[cell]), len(ob[cell]))
            xa, xb = out.setdefault(cell[1], ([], []))
            xa += [c == "1" for c in oa[cell][:n]]
            xb += [c == "1" for c in ob[cell][:n]]
    return out


def offset_cells(row: Row, kind: str) -> dict[int, list[dict]]:
    """{prefix multiple: the seeds' rows} of one row and offset-layout kind (mqar_offset)."""
    out: dict[int, list[dict]] = {}
    for j in row.jobs:
        for r in j.probes.get("offset") or []:
            if r.get("kind") == kind:
                out.setdefault(int(r["prefix"]), []).append(r)
    return dict(sorted(out.items()))


def budget_key(row: Row) -> str:
    """A row's label without its training budget: the setting whose budgets are compared. Runs fine-tuned from a
    parent (extend.from) count their tokens from the parent's weights, so they are a setting of their own, named
    by the parent's step: a control arm trained on from the parent is not a point of the parent's own curve."""
    key = re.sub(r"\s*trainer\.max_steps=\d+", "", row.label).strip()
    parents = {j.setting("extend.parent.step") for j in row.jobs} - {None}
    return key + (f" (from step {'/'.join(map(str, sorted(parents)))})" if parents else "")


def end_point(job: Job) -> dict:
    """A run without eval.at as its one point along training: its final metrics at the tokens it trained on
    (data.batch_size is the global batch)."""
    tokens = int(job.summary.get("global_step") or 0) * int(job.setting("data.batch_size") or 0) * (job.train_length or 0)
    return {"tokens_seen": tokens, "schedule": "end", "metrics": job.metrics}


def seed_points(row: Row, metric: str) -> dict[tuple[int, str], dict[Any, float]]:
    """{(training tokens, schedule): {seed: `metric`}} at each evaluation point of the row's runs where finite: the
    eval.at points (mid-schedule) and the end of training."""
    points: dict[tuple[int, str], dict[Any, float]] = {}
    for j in row.jobs:
        for p in j.summary.get("along_training") or [end_point(j)]:
            v = as_float((p.get("metrics") or {}).get(metric))
            if math.isfinite(v):
                points.setdefault((int(p["tokens_seen"]), str(p.get("schedule"))), {})[j.setting("seed")] = v
    return dict(sorted(points.items()))


def along_training_points(row: Row, metric: str) -> list[tuple[int, float, str]]:
    """(training tokens, mean over seeds of `metric`, schedule) at each evaluation point of the row's runs
    (`seed_points`). Perplexities and their ratios: the geometric mean."""
    log = parse_key(metric).stat.startswith("ppl")
    return [(t, float(seed_mean(list(vs.values()), log=log)), schedule)
            for (t, schedule), vs in seed_points(row, metric).items()]
