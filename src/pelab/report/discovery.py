"""Discovery: every job under the given folders, whether it finished, failed or never wrote a summary."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from pelab.errors import ReportError
from pelab.metric_keys import format_key, metric_key, parse_key
from pelab.summary import SUMMARY_FILE, as_float, read_summary

# Where a run keeps its Lightning CSV log (logger=csv / wandb+csv), and where a study that copies a run's
# summary.json keeps the log beside it.
CSV_LOGS = ("csv/metrics.csv", "metrics.csv")
UNFINISHED = "no summary.json (still running, or killed before it could write one)"


@dataclass
class Job:
    """One job: its folder, status (ok | failed | interrupted | running | unfinished | unreadable) and
    summary.json (empty when there is none)."""

    folder: Path
    status: str
    summary: dict = field(default_factory=dict)
    error: str = ""

    @property
    def config(self) -> dict:
        return self.summary.get("config") or {}

    def setting(self, dotted: str) -> Any:
        """config["a"]["b"] for "a.b"; None where the job has no such key."""
        d: Any = self.config
        for part in dotted.split("."):
            if not isinstance(d, dict) or part not in d:
                return None
            d = d[part]
        return d

    @cached_property
    def metrics(self) -> dict[str, float]:
        m = {k: as_float(v) for k, v in (self.summary.get("metrics") or {}).items() if _numeric(v)}
        return {**m, **probe_intervals(self.summary)}

    @property
    def train_length(self) -> int | None:
        value = self.setting("data.seq_len")
        return int(value) if value is not None else None

    @property
    def extrapolation(self) -> dict:
        return (self.summary.get("evaluation") or {}).get("extrapolation") or {}

    @property
    def probes(self) -> dict:
        return (self.summary.get("evaluation") or {}).get("probes") or {}

    @cached_property
    def csv_log(self) -> pd.DataFrame:
        """The job's Lightning CSV log (empty when it kept none: logger=none, or a summary copied without it)."""
        for name in CSV_LOGS:
            if (self.folder / name).is_file():
                return pd.read_csv(self.folder / name)
        return pd.DataFrame()

    def curve(self, column: str) -> pd.Series:
        """`column` (val/ppl, train/retrieval_acc, ...) by step from the CSV log; empty where it was not logged."""
        log = self.csv_log
        if not {"step", column} <= set(log.columns):
            return pd.Series(dtype=float)
        return log.dropna(subset=[column]).groupby("step")[column].last().astype(float)  # a resume logs a step again

    @property
    def val_curve(self) -> pd.Series:
        """val/ppl by step from the job's CSV log."""
        return self.curve("val/ppl")


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or v in ("nan", "inf", "-inf")


def _natural(path: Path) -> list:
    """Sort key comparing digit runs as numbers: Hydra's job 2 before job 10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_jobs(folders: Iterable[str | Path]) -> list[Job]:
    """Every job under `folders`: a `summary.json` (any status), or a Hydra job folder (`.hydra/`)
    without one (unfinished). A folder may also be a `summary.json` file itself.

    Jobs come in the order of `folders`, and within a folder in the order of its job folders (the
    order a sweep ran them): the report's rows follow it."""
    folders = list(folders)
    jobs: dict[Path, Job] = {}
    for folder in map(Path, folders):
        if not folder.exists():
            raise ReportError(f"{folder} does not exist")
        found: dict[Path, Path | None] = {}  # job folder -> its summary.json (None: unfinished)
        if folder.is_file():
            found[folder.parent.resolve()] = folder
        else:
            found = {p.parent.resolve(): p for p in folder.rglob(SUMMARY_FILE)}
            for hydra_dir in folder.rglob(".hydra"):
                if (hydra_dir / "config.yaml").exists():
                    found.setdefault(hydra_dir.parent.resolve(), None)
        for job_dir in sorted(found, key=_natural):
            summary = found[job_dir]
            if job_dir not in jobs:
                jobs[job_dir] = read_job(summary) if summary else Job(job_dir, "unfinished", error=UNFINISHED)
    if not jobs:
        raise ReportError(f"no {SUMMARY_FILE} (and no Hydra job folder) under {', '.join(map(str, folders))}")
    return [j for job in jobs.values() for j in (job, training_free_job(job)) if j is not None]


def training_free_job(job: Job) -> Job | None:
    """A context-extension child evaluated before its first step (extend.eval_before: metrics `extrap/step0/...`,
    `evaluation/step0`) as a job of its own: the parent's weights under the child's settings, a budget of 0
    fine-tuning steps, so every table (and the comparisons, along training) reads it like any other budget. Its
    folder is `<run>@step0` (it has no training log). None for any other job."""
    before = job.summary.get("evaluation/step0")
    if job.status != "ok" or not before:
        return None
    config = copy.deepcopy(job.config)
    config.setdefault("trainer", {})["max_steps"] = 0
    config.setdefault("extend", {})["eval_before"] = False
    metrics = {format_key(replace(k, variant="")): v for key, v in (job.summary.get("metrics") or {}).items()
               if (k := parse_key(key)) and k.variant == "step0"}
    summary = {**{k: v for k, v in job.summary.items() if not k.startswith(("evaluation", "along_training"))},
               "config": config, "metrics": metrics, "global_step": 0, "evaluation": before,
               "wall_seconds": sum((before.get("seconds") or {}).values())}
    return Job(job.folder.with_name(f"{job.folder.name}@step0"), "ok", summary)


def read_job(path: Path) -> Job:
    """The job of one summary.json; a summary that says ok but has no metrics counts as failed."""
    try:
        summary = read_summary(path)
    except (OSError, ValueError) as err:
        return Job(path.parent, "unreadable", error=f"cannot read {path.name}: {err}")
    status = str(summary.get("status") or "unknown")
    error = summary.get("error") or ""
    if status == "ok" and not summary.get("metrics"):
        status, error = "failed", "status ok but no metrics in summary.json"
    return Job(path.parent, status, summary, str(error))


def probe_intervals(summary: dict) -> dict[str, float]:
    """The probes' intervals recomputed from the per-instance outcomes a summary keeps (its evaluation's probe
    rows), by the evaluation's own rule (`stats.depth_summary`): a run scored before a fix to that rule (e.g.
    [1.00, 1.00] from instances that all passed) reads as it would today. {} where the rows have no outcomes."""
    from pelab.evaluation.stats import depth_summary, unbits

    cells: dict[tuple[str, int], list[dict]] = {}
    for row in ((summary.get("evaluation") or {}).get("probes") or {}).get("rows") or []:
        if row.get("outcomes"):
            cells.setdefault((str(row["kind"]), int(row["length"])), []).append(row)
    out: dict[str, float] = {}
    for (kind, length), rows in cells.items():
        rows = sorted(rows, key=lambda r: float(r["depth"]))
        s = depth_summary([float(r["depth"]) for r in rows], [unbits(r["outcomes"]) for r in rows])
        out.update({metric_key(f"probe/{kind}/{k}", length): v for k, v in s.items() if k not in ("acc", "lim_gap")})
    return out
