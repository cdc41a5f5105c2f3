"""Rendering, tables: the markdown tables of the report (metrics by length, probes, runs, failures)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pelab.report.aggregation import Row, aggregate, by_length, probe_panel
from pelab.report.discovery import Job


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
    pattern: str,
    title: str,
    digits: int = 2,
    caption: str = "",
    protocol: str | None = None,
) -> Table | None:
    """rows x lengths of `pattern` (mean ± std over seeds); the training-length cell in bold.
    `protocol` picks the notes (why a cell is n/a) from the extrapolation rows."""
    cells = by_length(rows, pattern, lambda v: aggregate(v, digits))
    if cells.columns.empty:
        return None
    lengths = [int(L) for L in cells.columns]
    seeds = "seeds" if any(len(r.jobs) > 1 for r in rows) else "seed"
    table = Table(title, ["encoding", seeds] + [str(L) for L in lengths], [], caption)
    for r, (_, line) in zip(rows, cells.fillna("—").iterrows()):
        marked = [
            f"**{c}**" if L == r.train_len and c not in ("—", "n/a") else c for L, c in zip(lengths, line)
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
        rows,
        f"probe/{kind}/logprob@{{L}}",
        f"{kind}: mean log-probability of the gold answer tokens (mean over depths)",
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
                str(j.setting("pe.name")),
                str(j.setting("seed")),
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
        v = shared(lambda j, key=key: j.setting(key))
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
        t.rows.append([f"`{j.folder}`", j.status, last_line(j.error, 300).replace("|", "\\|")])
    return t


def last_line(text: str, width: int) -> str:
    """The last line of an error (the exception itself, after any traceback), cut to `width`."""
    return (text.strip().splitlines() or [""])[-1][:width]
