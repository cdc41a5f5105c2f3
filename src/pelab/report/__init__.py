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
aggregated into one row. Rows follow the order the jobs ran in (the order of the folders, then of
the job folders in each).

Two subcommands hold the steps between a study's sweep and its findings page (pelab.report.generated):
`python -m pelab.report collect <sweep> <dest>` copies the small files of its finished run folders into the
repository, `python -m pelab.report refill [pages]` rebuilds the generated tables of the pages from their reports.

The steps, one module each: discovery (the jobs and their status), aggregation (rows and mean ± std
over seeds), tables, figures and document (rendering), upload (W&B), generated (collect, refill), cli.
"""

from pelab.report.aggregation import Row, aggregate, group_rows, pe_defaults
from pelab.report.cli import main
from pelab.report.discovery import Job, find_jobs
from pelab.report.document import REPORT_FILE, Report, build_report
from pelab.report.upload import upload_to_wandb

__all__ = [
    "REPORT_FILE",
    "Job",
    "Report",
    "Row",
    "aggregate",
    "build_report",
    "find_jobs",
    "group_rows",
    "main",
    "pe_defaults",
    "upload_to_wandb",
]
