"""`python -m pelab.report <run or multirun folder(s)> [--out DIR] [--wandb]`: summaries -> report.

Reads every `summary.json` under the given folders (not W&B: works offline, on a laptop, after the
fact) and writes `report.md` with

* perplexity vs evaluation length per encoding (mean ± std over seeds), ppl ratios, sliding-window
  ppl and bits per byte,
* probe accuracy by depth and length per probe kind,
* run metadata (steps, parameters, wall time, corpus fingerprint, versions),
* a "Failed / unfinished jobs" section (a failed, interrupted or still-running job is listed, never
  crashed on),

plus PNG figures next to it: ppl vs eval length, loss by position, a grid of probe heatmaps.
`--wandb` also uploads the figures and tables as a W&B run of its own (job_type=report) in the
sweep's group.

Rows are the settings that vary across the finished jobs (always the encoding; the training length,
the model and any other swept key only when they vary); jobs that differ only in `seed` are
aggregated into one row.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pelab.summary import SUMMARY_FILE, as_float

log = logging.getLogger("pelab.report")

REPORT_FILE = "report.md"
# Display order of the encodings (others follow alphabetically).
PE_ORDER = [
    "sinusoidal", "learned", "rope", "xpos", "t5_bias", "alibi", "kerple", "sandwich", "fire", "cope", "nope"
]
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
    "compile",
    "evaluate_after_fit",
)
UNFINISHED = "no summary.json (still running, or killed before it could write one)"


class ReportError(ValueError):
    """Nothing to report (no summary.json under the given folders)."""


# ---------------------------------------------------------------------------------------------
# jobs: one per summary.json (or per Hydra job folder without one)


@dataclass
class Job:
    folder: Path
    status: str  # ok | failed | interrupted | running | unfinished | unreadable
    summary: dict = field(default_factory=dict)
    error: str = ""

    @property
    def config(self) -> dict:
        return self.summary.get("config") or {}

    @property
    def name(self) -> str:
        return str(self.summary.get("name") or self.folder.name)

    @cached_property
    def metrics(self) -> dict[str, float]:
        return {k: as_float(v) for k, v in (self.summary.get("metrics") or {}).items() if _numeric(v)}

    @property
    def train_len(self) -> int | None:
        value = get_path(self.config, "data.seq_len")
        return int(value) if value is not None else None

    @property
    def extrapolation(self) -> dict:
        return (self.summary.get("evaluation") or {}).get("extrapolation") or {}

    @property
    def probes(self) -> dict:
        return (self.summary.get("evaluation") or {}).get("probes") or {}


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or v in ("nan", "inf", "-inf")


def find_jobs(folders: Iterable[str | Path]) -> list[Job]:
    """Every job under `folders`: a `summary.json` (any status), or a Hydra job folder (`.hydra/`)
    without one (unfinished). A folder may also be a `summary.json` file itself."""
    jobs: dict[Path, Job] = {}
    for folder in map(Path, folders):
        if not folder.exists():
            raise ReportError(f"{folder} does not exist")
        paths = [folder] if folder.is_file() else sorted(folder.rglob(SUMMARY_FILE))
        for path in paths:
            job_dir = path.parent.resolve()
            jobs.setdefault(job_dir, read_job(path))
        for hydra_dir in [] if folder.is_file() else sorted(folder.rglob(".hydra")):
            job_dir = hydra_dir.parent.resolve()
            if job_dir not in jobs and (hydra_dir / "config.yaml").exists():
                jobs[job_dir] = Job(job_dir, "unfinished", error=UNFINISHED)
    if not jobs:
        raise ReportError(f"no {SUMMARY_FILE} (and no Hydra job folder) under {', '.join(map(str, folders))}")
    return sorted(jobs.values(), key=lambda j: str(j.folder))


def read_job(path: Path) -> Job:
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        return Job(path.parent, "unreadable", error=f"cannot read {path.name}: {err}")
    status = str(summary.get("status") or "unknown")
    error = summary.get("error") or ""
    if status == "ok" and not summary.get("metrics"):
        status, error = "failed", "status ok but no metrics in summary.json"
    return Job(path.parent, status, summary, str(error))


# ---------------------------------------------------------------------------------------------
# rows: jobs grouped by every varying setting except the seed


def get_path(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become their JSON text (hashable, comparable)."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(d) if isinstance(d, list) else d}


@functools.cache
def pe_defaults(name: Any) -> dict[str, Any]:
    """Flattened ``pe.*`` defaults of an encoding, from its constructors' signatures (scalar knobs only)
    plus ``pe.randomized.max_position`` = None: what a run made before a knob existed ran with.
    Cached (called per job and per label): treat the dict as read-only."""
    import inspect

    from pelab.encodings import ENCODINGS

    defaults: dict[str, Any] = {"pe.randomized.max_position": None}
    cls = ENCODINGS.get(name) if isinstance(name, str) else None
    for klass in reversed(cls.__mro__ if cls else ()):  # subclasses (XPos) override parents (RoPE)
        if "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.default is not p.empty and isinstance(p.default, (int, float, str, bool)):
                defaults[f"pe.{p.name}"] = p.default
    return defaults


def settings(job: Job) -> dict[str, Any]:
    """The job's flattened config, with ``pe.*`` knobs it lacks filled by their defaults (runs made by
    older code compare equal to new runs that leave those knobs alone)."""
    flat = flatten(job.config)
    return {**pe_defaults(flat.get("pe.name")), **flat} if "pe.name" in flat else flat


@dataclass
class Row:
    """One table row: the jobs (seeds) of one setting."""

    label: str
    key: tuple
    train_len: int | None
    jobs: list[Job]

    def values(self, metric: str) -> list[float]:
        return [j.metrics[metric] for j in self.jobs if metric in j.metrics]

    @property
    def seeds(self) -> list[Any]:
        return sorted(get_path(j.config, "seed") for j in self.jobs)


def varying_keys(jobs: Sequence[Job]) -> list[str]:
    """Config keys (flattened) with more than one value across `jobs`, bookkeeping keys excluded."""
    flat = [settings(j) for j in jobs]
    keys = sorted(set().union(*flat)) if flat else []
    return [k for k in keys if not _ignored(k) and len({repr(f.get(k)) for f in flat}) > 1]


def _ignored(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in IGNORED_KEYS)


BASE_KEYS = ["pe.name", "data.seq_len", "model.name"]


def row_keys(jobs: Sequence[Job]) -> tuple[list[str], list[str]]:
    """(extra, label_keys): the varying keys besides BASE_KEYS that define rows (those not already
    determined by BASE_KEYS, e.g. pe.base follows pe.name), and the fewest of them that tell the rows
    apart (keys that vary together, like the settings of two different sweeps, are named once)."""
    flat = [settings(j) for j in jobs]

    def n_groups(keys: Sequence[str]) -> int:
        return len({tuple(repr(f.get(k)) for k in keys) for f in flat})

    base = BASE_KEYS
    extra = [k for k in varying_keys(jobs) if k not in base and n_groups(base + [k]) > n_groups(base)]
    target = n_groups(base + extra)
    label_keys: list[str] = []
    for k in sorted(extra, key=lambda k: (-n_groups([k]), k)):  # most distinct values first
        if n_groups(base + label_keys) == target:
            break
        if n_groups(base + label_keys + [k]) > n_groups(base + label_keys):
            label_keys.append(k)
    return extra, label_keys


def group_rows(jobs: Sequence[Job]) -> tuple[list[Row], list[str]]:
    """Finished jobs -> rows (one per setting, seeds aggregated) and the keys that label the rows:
    a row per distinct value of BASE_KEYS and of the other row-defining keys (`row_keys`)."""
    extra, label_keys = row_keys(jobs)
    varying = varying_keys(jobs)
    shown = ["pe.name"] + [k for k in BASE_KEYS[1:] if k in varying] + label_keys
    rows: dict[tuple, Row] = {}
    variant: dict[tuple, bool] = {}  # does the label name an encoding knob (a variant of the scheme)?
    for job in jobs:
        f = settings(job)
        key = tuple(f.get(k) for k in BASE_KEYS + extra)
        if key not in rows:
            rows[key] = Row(_label(f, shown), key, job.train_len, [])
            variant[key] = rows[key].label != _label(f, [k for k in shown if not k.startswith("pe.")])
        rows[key].jobs.append(job)

    def order(row: Row) -> tuple:
        pe = row.key[0]
        rank = PE_ORDER.index(pe) if pe in PE_ORDER else len(PE_ORDER)
        # the plain scheme before its variants
        return (str(row.key[2]), row.train_len or 0, rank, str(pe), variant[row.key], *map(_sortable, row.key[3:]))

    return sorted(rows.values(), key=order), shown


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
# cells: mean ± std over seeds, "n/a" (not applicable), "inf" (diverged)


def fmt_number(x: float, digits: int) -> str:
    if abs(x) >= 10_000:
        return f"{x:.4g}"
    return f"{x:.{digits}f}"


def aggregate(values: Sequence[float], digits: int = 2) -> str:
    """One table cell from the seeds' values: "12.34 ± 0.56" (sample std), "n/a" when not applicable
    (NaN), "inf" when diverged, "—" when not evaluated. Partial cases say how many seeds."""
    if not values:
        return "—"
    n = len(values)
    finite = [v for v in values if math.isfinite(v)]
    n_inf = sum(1 for v in values if math.isinf(v))
    if n_inf == n:
        return "inf"
    if not finite:
        return "n/a" if n_inf == 0 else f"inf ({n_inf}/{n})"
    cell = fmt_number(statistics.fmean(finite), digits)
    if len(finite) > 1:
        cell += f" ± {fmt_number(statistics.stdev(finite), digits)}"
    if len(finite) < n:
        cell += f" ({len(finite)}/{n} seeds" + (f", {n_inf} inf" if n_inf else "") + ")"
    return cell


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


def lengths_of(rows: Sequence[Row], pattern: str) -> list[int]:
    """Sorted lengths L for which some job logged `pattern.format(L=...)` (e.g. "extrap/ppl@{L}")."""
    rx = re.compile("^" + re.escape(pattern).replace(r"\{L\}", r"(\d+)") + "$")
    found = {int(m.group(1)) for r in rows for j in r.jobs for k in j.metrics if (m := rx.match(k))}
    return sorted(found)


def metric_table(
    rows: Sequence[Row],
    pattern: str,
    title: str,
    digits: int = 2,
    caption: str = "",
    protocol: str | None = None,
) -> Table | None:
    """rows x lengths of `pattern` (mean ± std over seeds); the training-length cell in bold.
    `protocol` picks the notes (why a cell is n/a) from the extrapolation rows."""
    lengths = lengths_of(rows, pattern)
    if not lengths:
        return None
    seeds = "seeds" if any(len(r.jobs) > 1 for r in rows) else "seed"
    table = Table(title, ["encoding", f"{seeds}"] + [str(L) for L in lengths], [], caption)
    for r in rows:
        cells = []
        for L in lengths:
            cell = aggregate(r.values(pattern.format(L=L)), digits)
            cells.append(f"**{cell}**" if L == r.train_len and cell not in ("—", "n/a") else cell)
        table.rows.append([r.label, ",".join(map(str, r.seeds))] + cells)
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


# ---------------------------------------------------------------------------------------------
# probes: mean accuracy over seeds of the depth x length grids


def probe_kinds(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for j in r.jobs for k in j.probes.get("kinds") or []))


def mean_grid(grids: Sequence[Sequence[Sequence[Any]]]) -> list[list[float]]:
    """Cell-wise mean of equally shaped grids ("nan" strings -> NaN; NaN in any seed -> NaN)."""
    out = []
    for cells in zip(*grids):
        out.append([_mean([as_float(v) for v in vals]) for vals in zip(*cells)])
    return out


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs and all(math.isfinite(x) for x in xs) else float("nan")


def probe_panel(row: Row, kind: str) -> dict | None:
    """{grid, depths, lengths, train_len, chance, n} for one row and kind (mean over its seeds)."""
    ps = [j.probes for j in row.jobs if kind in (j.probes.get("grids") or {})]
    if not ps:
        return None
    shape = (tuple(ps[0]["depths"]), tuple(ps[0]["lengths"]))
    ps = [p for p in ps if (tuple(p["depths"]), tuple(p["lengths"])) == shape]
    return {
        "grid": mean_grid([p["grids"][kind]["acc"] for p in ps]),
        "depths": [float(d) for d in shape[0]],
        "lengths": [int(L) for L in shape[1]],
        "train_len": row.train_len,
        "chance": _mean([as_float((p.get("chance") or {}).get(kind)) for p in ps]),
        "n": len(ps),
    }


def probe_notes(rows: Sequence[Row], kind: str) -> list[str]:
    """Why probe cells are n/a ("kv needs at least 37 tokens ..."), once per (row, length)."""
    notes: dict[tuple[str, int], str] = {}
    for r in rows:
        for j in r.jobs:
            for rec in j.probes.get("rows") or []:
                if rec.get("kind") == kind and rec.get("note"):
                    notes.setdefault((r.label, int(rec["length"])), str(rec["note"]))
    return [f"{label} @ {L}: {n}" for (label, L), n in notes.items()]


def probe_tables(rows: Sequence[Row], kind: str) -> list[Table]:
    """Per kind: mean accuracy over depths by length, the lost-in-the-middle gap by length, and one
    depth x length table per row."""
    out = []
    acc = metric_table(rows, f"probe/{kind}/acc@{{L}}", f"{kind}: accuracy (mean over depths)")
    if acc is not None:
        acc.notes += probe_notes(rows, kind)
    gap = metric_table(
        rows, f"probe/{kind}/lim_gap@{{L}}", f"{kind}: lost-in-the-middle gap (edges − middle)"
    )
    # informative where accuracy sits at chance: how much probability the gold answer gets
    logprob = metric_table(
        rows, f"probe/{kind}/logprob@{{L}}", f"{kind}: mean log-probability of the gold answer tokens (mean over depths)"
    )
    out += [t for t in (acc, gap, logprob) if t is not None]
    for r in rows:
        p = probe_panel(r, kind)
        if p is None:
            continue
        t = Table(
            f"{kind} — {r.label}: accuracy by depth × length (mean over {p['n']} seed(s))",
            ["depth"] + [f"{L}" + ("*" if L == r.train_len else "") for L in p["lengths"]],
            [],
            collapsed=True,
        )
        for d, line in zip(p["depths"], p["grid"]):
            t.rows.append(
                [f"{100 * d:.0f}%"] + [("n/a" if not math.isfinite(v) else f"{v:.2f}") for v in line]
            )
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# figures (drawn by pelab.evaluation.plots)


def mean_curve(curves: Sequence[Sequence[Any]]) -> list[float]:
    """Position-wise mean of the seeds' loss-by-position curves (the common prefix)."""
    curves = [[as_float(v) for v in c] for c in curves if c]
    n = min((len(c) for c in curves), default=0)
    return [_mean([c[i] for c in curves]) for i in range(n)]


def make_figures(rows: Sequence[Row], out: Path) -> dict[str, Path]:
    """ppl vs length and loss by position (one figure per training length), probe heatmap grid."""
    from pelab.evaluation.plots import (
        plot_loss_by_position,
        plot_ppl_vs_length,
        plot_probe_heatmap_grid,
        save_figure,
    )

    paths: dict[str, Path] = {}
    train_lens = sorted({r.train_len for r in rows if r.train_len})
    for train_len in train_lens:
        sub = [r for r in rows if r.train_len == train_len]
        suffix = f"_L{train_len}" if len(train_lens) > 1 else ""
        lengths = lengths_of(sub, "extrap/ppl@{L}")
        curves = {
            r.label: {L: _mean(v) if (v := r.values(f"extrap/ppl@{L}")) else float("nan") for L in lengths}
            for r in sub
        }
        if any(math.isfinite(p) for c in curves.values() for p in c.values()):
            fig = plot_ppl_vs_length(
                curves, train_len, title=f"Perplexity vs evaluation length (train {train_len})"
            )
            paths[f"ppl_vs_length{suffix}"] = save_figure(fig, out / f"ppl_vs_length{suffix}.png")
        losses = {
            r.label: mean_curve([j.extrapolation.get("loss_by_position") or [] for j in r.jobs]) for r in sub
        }
        losses = {k: v for k, v in losses.items() if v}
        if losses:
            fig = plot_loss_by_position(
                losses, train_len, title=f"Loss by token position (train {train_len})"
            )
            paths[f"loss_by_position{suffix}"] = save_figure(fig, out / f"loss_by_position{suffix}.png")
    panels = {r.label: {k: p for k in probe_kinds(rows) if (p := probe_panel(r, k))} for r in rows}
    panels = {k: v for k, v in panels.items() if v}
    if panels:
        fig = plot_probe_heatmap_grid(panels)
        paths["probe_heatmaps"] = save_figure(fig, out / "probe_heatmaps.png")
    return paths


# ---------------------------------------------------------------------------------------------
# metadata and failures


def short_hash(job: Job) -> str:
    fp = (job.summary.get("data") or {}).get("fingerprint") or {}
    return str(fp.get("key") or "")[:8] or "—"


def _fmt_int(x: Any) -> str:
    return f"{int(x):,}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def metadata_table(jobs: Sequence[Job]) -> Table:
    cols = [
        "job",
        "encoding",
        "seed",
        "L",
        "steps",
        "params",
        "PE params",
        "wall time",
        "val ppl",
        "tokens/s",
        "corpus",
    ]
    t = Table("Runs", cols, [])
    for j in jobs:
        m, model = j.metrics, j.summary.get("model") or {}
        wall = j.summary.get("wall_seconds")
        t.rows.append(
            [
                f"`{j.folder.name}`",
                str(get_path(j.config, "pe.name")),
                str(get_path(j.config, "seed")),
                str(j.train_len),
                _fmt_int(j.summary.get("global_step")),
                _fmt_int(model.get("params")),
                _fmt_int(model.get("pe_params")),
                f"{wall / 60:.1f} min" if isinstance(wall, (int, float)) else "—",
                aggregate([m["val/ppl"]]) if "val/ppl" in m else "—",
                _fmt_int(m.get("train/tokens_per_sec")),
                f"`{short_hash(j)}`",
            ]
        )
    return t


def common_settings(jobs: Sequence[Job]) -> list[str]:
    """One line per shared setting worth knowing (model, tokenizer, corpus, steps, versions)."""
    lines = []

    def shared(fn: Callable[[Job], Any]) -> Any:
        vals = {json.dumps(fn(j), sort_keys=True, default=str) for j in jobs}
        return fn(jobs[0]) if len(vals) == 1 else None

    for label, key in [
        ("model", "model.name"),
        ("tokenizer", "tokenizer.kind"),
        ("corpus", "data.source"),
        ("training length", "data.seq_len"),
        ("steps", "trainer.max_steps"),
        ("batch size", "data.batch_size"),
        ("lr", "optim.lr"),
    ]:
        v = shared(lambda j, key=key: get_path(j.config, key))
        if v is not None:
            lines.append(f"{label}: `{v}`")
    fp = shared(short_hash)
    lines.append(
        f"corpus + tokenizer fingerprint: `{fp}`"
        if fp
        else "**warning: the jobs used different corpora / tokenizers (fingerprints differ; see Runs)**"
    )
    vers = shared(lambda j: j.summary.get("versions"))
    if vers:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    return lines


def failures_table(jobs: Sequence[Job]) -> Table:
    t = Table("Failed / unfinished jobs", ["job", "status", "error"], [])
    for j in jobs:
        err = (j.error.strip().splitlines() or [""])[-1][:300].replace("|", "\\|")
        t.rows.append([f"`{j.folder}`", j.status, err])
    return t


# ---------------------------------------------------------------------------------------------
# the report


@dataclass
class Report:
    markdown: str
    tables: list[Table]
    figures: dict[str, Path]
    rows: list[Row]
    ok: list[Job]
    failed: list[Job]
    path: Path


def build_report(folders: Sequence[str | Path], out: str | Path, title: str = "PELab report") -> Report:
    """Read the jobs under `folders`, write `<out>/report.md` and the PNG figures; return the pieces."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = find_jobs(folders)
    ok = [j for j in jobs if j.status == "ok"]
    failed = [j for j in jobs if j.status != "ok"]
    rows, shown = group_rows(ok) if ok else ([], [])

    sources = ", ".join(f"`{f}`" for f in folders)
    md = [
        f"# {title}",
        "",
        (
            f"Generated {time.strftime('%Y-%m-%d %H:%M')} from {sources}: "
            f"{len(jobs)} jobs, {len(ok)} finished, {len(failed)} failed or unfinished."
        ),
    ]
    if failed:
        md.append(
            f"**{len(failed)} job(s) left out: see [Failed / unfinished jobs](#failed--unfinished-jobs).**"
        )
    if ok:
        md += [
            "",
            "Rows: " + ", ".join(f"`{k}`" for k in shown) + "; cells are mean ± std over seeds "
            "(sample std) where a row has several. **Bold** = the training length. "
            "`n/a` = not applicable (see the notes), `inf` = diverged, `—` = not evaluated.",
            "",
        ]
        also = [k for k in row_keys(ok)[0] if k not in shown]
        if also:
            md.append("- also varying between rows: " + ", ".join(f"`{k}`" for k in also))
        md += [f"- {line}" for line in common_settings(ok)]
    tables: list[Table] = []
    figures = make_figures(rows, out) if rows else {}

    def section(
        heading: str, items: Sequence[Table | None], figure: Sequence[str] = (), text: str = ""
    ) -> None:
        items = [t for t in items if t is not None]
        figs = [k for k in figures if any(k == f or k.startswith(f + "_L") for f in figure)]
        if not items and not figs:
            return
        md.extend(["", f"## {heading}", ""] + ([text, ""] if text else []))
        for t in items:
            tables.append(t)
            if t.collapsed:
                md.extend([f"<details><summary>{t.title}</summary>", "", t.markdown(), "", "</details>", ""])
            else:
                md.extend(([f"**{t.title}**", ""] if t.title != heading else []) + [t.markdown(), ""])
        md.extend(f"![{k}]({figures[k].name})" for k in figs)

    section(
        "Perplexity vs evaluation length",
        [
            metric_table(
                rows,
                "extrap/ppl@{L}",
                "Perplexity, non-overlapping windows of L tokens",
                protocol="nonoverlap",
            ),
        ],
        ["ppl_vs_length"],
        "Every length scores the same tokens; a window of L tokens sees context back to its own start only.",
    )
    section(
        "Perplexity ratio",
        [
            metric_table(rows, "extrap/ppl_ratio@{L}", "ppl@L / ppl@training length", digits=3),
        ],
    )
    section(
        "Sliding window",
        [
            metric_table(
                rows,
                "extrap/ppl_sliding@{L}",
                "Perplexity, sliding windows of L tokens (stride = training length)",
                protocol="sliding",
            ),
        ],
    )
    section(
        "Bits per byte",
        [metric_table(rows, "extrap/bpb@{L}", "Bits per byte, non-overlapping windows", digits=3)],
    )
    section(
        "Loss by position",
        [],
        ["loss_by_position"],
        "Mean NLL by position in the window at the longest evaluated length (dashed line: training length).",
    )
    for kind in probe_kinds(rows):
        chance = [p["chance"] for r in rows if (p := probe_panel(r, kind)) and math.isfinite(p["chance"])]
        section(
            f"Probe: {kind}",
            probe_tables(rows, kind),
            (),
            f"Retrieval accuracy with the answer at each depth of contexts of each length; chance ≈ "
            f"{statistics.fmean(chance):.2g}. * = training length."
            if chance
            else "",
        )
    section("Probe heatmaps", [], ["probe_heatmaps"])
    if ok:
        section("Runs", [metadata_table(ok)])
    if failed:
        section(
            "Failed / unfinished jobs",
            [failures_table(failed)],
            (),
            "Left out of every table and figure above.",
        )
    path = out / REPORT_FILE
    path.write_text("\n".join(md).rstrip() + "\n")
    return Report("\n".join(md), tables, figures, rows, ok, failed, path)


# ---------------------------------------------------------------------------------------------
# W&B upload


def wandb_group(jobs: Sequence[Job]) -> str | None:
    """The jobs' W&B group: `logger.wandb.group` if set, else what pelab.train.sweep_group() gives a
    multirun job (`sweep-<date>-<time>` of its sweep folder, the folder holding `multirun.yaml`)."""
    for j in jobs:
        g = get_path(j.config, "logger.wandb.group")
        if g:
            return str(g)
    for j in jobs:
        sweep = j.folder.parent
        if (sweep / "multirun.yaml").exists():
            return f"sweep-{sweep.parent.name}-{sweep.name}"
    return None


def upload_to_wandb(
    report: Report, project: str | None = None, entity: str | None = None, mode: str | None = None
) -> Any:
    """Log the report's figures, tables and markdown as a W&B run (job_type=report) in the sweep's
    group. Online with credentials, offline otherwise (pelab.training.loggers.init_wandb)."""
    import wandb

    from pelab.training.loggers import finish_wandb, init_wandb

    jobs = report.ok + report.failed
    wcfg = next((get_path(j.config, "logger.wandb") for j in jobs if get_path(j.config, "logger.wandb")), {})
    wcfg = {**(wcfg or {}), "job_type": "report"}
    wcfg["project"] = project or wcfg.get("project") or "pelab"
    wcfg["entity"] = entity or wcfg.get("entity")
    if mode:
        wcfg["mode"] = mode
    group = wandb_group(jobs)
    out = report.path.parent
    run = init_wandb(
        wcfg,
        name=f"report-{group or out.name}",
        output_dir=out,
        group=group,
        config={
            "sources": sorted({str(j.folder.parent) for j in jobs}),
            "n_jobs": len(jobs),
            "n_ok": len(report.ok),
        },
        tags=["report"],
    )
    if run is None:
        return None
    try:
        data: dict[str, Any] = {f"report/{k}": wandb.Image(str(p)) for k, p in report.figures.items()}
        for i, t in enumerate(report.tables):
            key = re.sub(r"[^a-z0-9]+", "_", t.title.lower()).strip("_")[:60] or f"table_{i}"
            data[f"report/tables/{key}"] = wandb.Table(columns=t.columns, data=t.rows)
        data["report/markdown"] = wandb.Html(f"<pre>{_html_escape(report.markdown)}</pre>")
        run.log(data)
        run.summary.update({"report/n_ok": len(report.ok), "report/n_failed": len(report.failed)})
        run.save(str(report.path), base_path=str(out), policy="now")
    finally:
        finish_wandb(run, exit_code=0)
    return run


def _html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pelab.report", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "folders", nargs="+", help="run or multirun folders (searched recursively for summary.json)"
    )
    p.add_argument(
        "--out", default=None, help="output folder (default: <folder>/report for one folder, else ./report)"
    )
    p.add_argument("--title", default="PELab report")
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also upload figures + tables as a W&B run (job_type=report) in the sweep's group",
    )
    p.add_argument("--project", default=None, help="W&B project (default: the runs' logger.wandb.project)")
    p.add_argument("--entity", default=None, help="W&B entity (default: the runs' logger.wandb.entity)")
    p.add_argument(
        "--wandb-mode",
        default=None,
        choices=["online", "offline", "disabled"],
        help="default: online with credentials, else offline",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    out = (
        Path(args.out)
        if args.out
        else (Path(args.folders[0]) / "report" if len(args.folders) == 1 else Path("report"))
    )
    try:
        report = build_report(args.folders, out, args.title)
    except ReportError as err:
        print(f"pelab.report: {err}", file=sys.stderr)
        return 2
    print(
        f"report: {report.path} ({len(report.ok)} finished, {len(report.failed)} failed/unfinished; "
        f"{len(report.figures)} figures)"
    )
    for j in report.failed:
        print(f"  skipped {j.folder} [{j.status}] {(j.error.strip().splitlines() or [''])[-1][:200]}")
    if args.wandb:
        run = upload_to_wandb(report, args.project, args.entity, args.wandb_mode)
        if run is not None:
            print(f"W&B report run: {run.name} ({run.settings.mode})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
