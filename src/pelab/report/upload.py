"""W&B upload: the report's figures, tables and markdown as a run of its own (job_type=report) in the
sweep's group."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from pelab.report.discovery import Job
from pelab.report.document import Report


def wandb_group(jobs: Sequence[Job]) -> str | None:
    """The jobs' W&B group: `logger.wandb.group` if set, else what pelab.tasks.task.sweep_group() gives a
    multirun job (`sweep-<date>-<time>` of its sweep folder, the folder holding `multirun.yaml`)."""
    for j in jobs:
        if g := j.setting("logger.wandb.group"):
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
    group. Online with credentials, offline otherwise (pelab.runs.loggers.init_wandb)."""
    import wandb

    from pelab.runs.loggers import finish_wandb, init_wandb

    jobs = report.ok + report.failed
    wcfg = next((w for j in jobs if (w := j.setting("logger.wandb"))), {})
    wcfg = {**wcfg, "job_type": "report"}
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
        data["report/markdown"] = wandb.Html(f"<pre>{html.escape(report.markdown, quote=False)}</pre>")
        run.log(data)
        run.summary.update({"report/n_ok": len(report.ok), "report/n_failed": len(report.failed)})
        run.save(str(report.path), base_path=str(out), policy="now")
    finally:
        finish_wandb(run, exit_code=0)
    return run
