"""The steps between a study's sweep and its findings page: `collect` (the small files of its finished run folders
into the repository), `refill` (each generated block of a markdown page rebuilt from the report of the runs it
names), `cost` (what a study's runs cost, from their summaries) and `restore` (collected runs put back under a study's
root, so that a relaunch on a new machine skips them) and `progress` (how far a running sweep has got). All are
subcommands of `python -m pelab.report`:

    python -m pelab.report collect <sweep folder> <destination>
    python -m pelab.report restore <collected folder> <study root>
    python -m pelab.report refill [pages or folders ...]       (default: experiments/)
    python -m pelab.report cost <run folders ...> [--out cost.md]
    python -m pelab.report progress <sweep folders ...>

A generated block is the text between ``<!-- generated: python -m pelab.report ARGS -->`` and
``<!-- end generated -->``; each table in it sits under a ``**title**`` line and is replaced by the report's table
of that title (ARGS relative to the repository root, where `refill` runs). tests/test_findings.py checks every
page's blocks against the reports.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from pelab.errors import ReportError
from pelab.summary import SUMMARY_FILE

BLOCK = re.compile(r"(<!-- generated: python -m pelab\.report (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.DOTALL)
# a table under its bold title, with the report's caption paragraph between them or not (never another title: a
# title with nothing under it would take the next one's place); or a list under its bold title (the generated claim
# sentences); a title starts its line (a bold word inside a paragraph is no title)
TITLED = re.compile(r"(?m)^(\*\*(?P<title>[^*\n]+)\*\*[^\n]*\n\n)(?:(?!\*\*)[^|\n-][^\n]*\n\n)?"
                   r"((?:\|[^\n]*\n)+|(?:- [^\n]*\n)+)")
# a bold title at the start of a line (refill_block: one of the report's with nothing under it is an error)
TITLE_LINE = re.compile(r"(?m)^\*\*(?P<title>[^*\n]+)\*\*")
# what `collect` copies from a finished run folder: what the reports and the findings are made from
COLLECTED = (SUMMARY_FILE, "csv/metrics.csv", ".hydra/overrides.yaml")


def collect(sweep: Path, dest: Path) -> list[str]:
    """Copy the small files of every finished job (status ok) of `sweep` into `dest/<job>/`: summary.json, the CSV
    log, the overrides and the diff of a launch from a dirty tree (provenance-<launch>.diff). Unfinished jobs are
    left out (a relaunch of the sweep finishes them; collect again). `sweep` may be one finished run's folder
    (hydra.run.dir) instead: its files go into `dest` itself. Returns the jobs copied."""
    if not sweep.is_dir():
        raise ReportError(f"collect: {sweep} is not a folder; give the sweep folder (hydra.sweep.dir)")
    jobs = ([(sweep, dest)] if finished(sweep) else  # an unreadable summary: not a finished job
            [(p, dest / p.name) for p in sorted(sweep.iterdir()) if finished(p)])
    for job, to in jobs:
        for rel in [*COLLECTED, *(p.name for p in job.glob("provenance-*.diff"))]:
            if (job / rel).is_file():
                (to / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(job / rel, to / rel)
    return [job.name for job, _ in jobs]


def restore(collected: Path, root: Path) -> list[str]:
    """The reverse of `collect`, for a study that outlives the machine its sweep folders were on: put each finished
    run under `collected` whose summary.json names a folder under `root` (its `output_dir`: a job of one of the
    study's sweeps) back there, unless that folder already holds a finished run. A relaunch of the sweep then skips
    those jobs (status ok, the same settings: pelab.runs.folder.relaunch_decision) instead of training them again.
    Returns the run folders restored, relative to `root`."""
    if not collected.is_dir():
        raise ReportError(f"restore: {collected} is not a folder; give the folder the sweep's runs were collected into")
    restored = []
    for folder, record in runs_of(collected, root):
        target = Path(record["output_dir"])
        if not finished(target):
            shutil.copytree(folder, target, dirs_exist_ok=True)
            restored.append(target.resolve().relative_to(root.resolve()).as_posix())
    return restored


def runs_of(collected: Path, root: Path) -> list[tuple[Path, dict]]:
    """The finished runs under `collected` (folder, summary) whose `output_dir` lies under `root`."""
    out = []
    for summary in sorted(collected.rglob(SUMMARY_FILE)):
        try:
            record = json.loads(summary.read_text())
        except json.JSONDecodeError:
            continue  # unreadable: not a finished run
        target = Path(record.get("output_dir") or "/")
        if record.get("status") == "ok" and root.resolve() in target.resolve().parents:
            out.append((summary.parent, record))
    return out


def finished(job: Path) -> bool:
    """`job` holds a run whose summary.json says status ok."""
    try:
        return json.loads((job / SUMMARY_FILE).read_text()).get("status") == "ok"
    except (OSError, json.JSONDecodeError):  # none there (or `job` is a file), or unreadable
        return False


def cost(folders: Sequence[Path]) -> str:
    """A markdown table of what the finished runs (status ok) under each folder cost: their number, their CPU time
    (`cpu_seconds_total`: every launch, every thread of the process; runs written before the key are counted apart,
    not guessed) and their wall time (`wall_seconds_total`, or the launches' sum), in hours, and a total row."""
    rows, totals = [], [0, 0, 0.0, 0.0]
    for folder in folders:
        if not folder.is_dir():
            raise ReportError(f"{folder} is not a folder; give folders of run folders (collected or a sweep)")
        summaries = [json.loads(f.read_text()) for f in sorted(folder.rglob(SUMMARY_FILE))]
        done = [x for x in summaries if x.get("status") == "ok"]
        timed = [x["cpu_seconds_total"] for x in done if isinstance(x.get("cpu_seconds_total"), (int, float))]
        wall = sum(x.get("wall_seconds_total") or sum(la.get("wall_seconds") or 0 for la in x.get("launches", []))
                   for x in done)
        cpu = sum(timed)
        cpu_text = f"{cpu / 3600:.2f}" if timed else "n/a"  # no run of the folder recorded it
        rows.append(f"| {folder} | {len(done)} | {len(timed)} | {cpu_text} | {wall / 3600:.2f} |")
        totals = [totals[0] + len(done), totals[1] + len(timed), totals[2] + cpu, totals[3] + wall]
    head = ("| runs under | finished | with CPU time | CPU-hours | wall hours |\n"
            "|---|---:|---:|---:|---:|\n")
    total = f"| all | {totals[0]} | {totals[1]} | {totals[2] / 3600:.2f} | {totals[3] / 3600:.2f} |"
    return head + "\n".join([*rows, total]) + "\n"


def sweep_hydra(sweep: Path) -> tuple[Any, bool] | None:
    """The `hydra` node of the multirun in `sweep` and whether it is the sweep's own (the `multirun.yaml` Hydra's basic
    sweeper writes before the first job) or a job's (`.hydra/hydra.yaml`: Optuna's sweeper writes no multirun.yaml);
    None when neither is there."""
    from omegaconf import OmegaConf

    path = sweep / "multirun.yaml"
    if not path.is_file():
        path = next(iter(sorted(sweep.glob("*/.hydra/hydra.yaml"))), None)
    return None if path is None else (OmegaConf.load(path).hydra, path.name == "multirun.yaml")


def sweep_overrides(sweep: Path) -> list[frozenset[str]] | None:
    """Each job's overrides in the latest launch of the basic-sweeper multirun in `sweep`: the product of its swept
    values, the command line's over its `params` (as Hydra's BasicSweeper combines them); None for another sweeper or
    without its multirun.yaml."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = sweep_hydra(sweep)
    if found is None or not found[1] or not str(found[0].sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    hydra = found[0]
    params = [f"{k}={v}" for k, v in (hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *hydra.overrides.task])
    return [frozenset(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def sweep_jobs(sweep: Path) -> int | None:
    """How many jobs the multirun in `sweep` launches (its latest launch): the basic sweeper's `sweep_overrides`,
    Optuna's `n_trials`; None when neither can be read."""
    combos = sweep_overrides(sweep)
    if combos is not None:
        return len(combos)
    found = sweep_hydra(sweep)
    if found is not None and "optuna" in str(found[0].sweeper.get("_target_", "")).lower():
        return int(found[0].sweeper.n_trials)
    return None


def study_sweeps(folders: Sequence[Path]) -> list[Path]:
    """The sweep folders named, a study's root (no job folder of its own) standing for the sweeps inside it, at any
    depth (`<root>/sweep-*`, an arm's `<root>/<arm>/sweep-*`: each holding Hydra's multirun.yaml), and for each folder
    that holds single runs (hydra.run.dir) outside them (the context extension's `<root>/parents/s0` and
    `<root>/free/s0/yarn`: `parents`, `free/s0`)."""
    out = []
    for folder in folders:
        if not folder.is_dir():
            raise ReportError(f"progress: {folder} is not a folder; give sweep folders (hydra.sweep.dir) or a study's "
                              "root holding them")
        own = (folder / "multirun.yaml").is_file() or any(folder.glob(f"*/{SUMMARY_FILE}"))
        sweeps = {p.parent for p in folder.rglob("multirun.yaml")}
        singles = {p.parent.parent for p in folder.rglob(SUMMARY_FILE)
                   if not any(s in p.parents for s in sweeps)} - {folder}
        inside = sorted(sweeps | singles)
        out.extend(inside if inside and not own else [folder])
    return out


def progress(sweeps: Sequence[Path]) -> str:
    """How far each sweep folder (hydra.sweep.dir; for a study's root, each sweep inside it: `study_sweeps`) has got,
    from its job folders: a markdown table of its jobs (those of every launch into it), finished (status ok), running
    (its folder held by a live process), stopped (killed or preempted: a relaunch resumes them), failed and not
    started (the latest launch's jobs without a folder there, `sweep_overrides`; for Optuna, its trials less the
    folders), the CPU-hours spent, and an estimate of the CPU-hours left (the finished runs' mean CPU time for each
    job not started, and what that mean leaves of it for each running or stopped one; n/a without a finished run or
    the sweep's size); then the wall time that leaves at the jobs running now, and one line per running or stopped job
    with its step."""
    from pelab.runs.folder import LOCK, pid_alive

    rows, lines = [], []
    for sweep in study_sweeps(sweeps):
        count = dict.fromkeys(("ok", "running", "stopped", "failed"), 0)
        spent, done_cpu, unfinished_cpu = 0.0, [], []
        ran = set()  # the overrides of the jobs there, matched to the latest launch's (a sweep relaunched with other
        # seeds holds the earlier launch's jobs too)
        for job in sorted(p for p in sweep.iterdir() if (p / SUMMARY_FILE).is_file()):
            if (job / ".hydra" / "overrides.yaml").is_file():
                ran.add(frozenset(yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []))
            try:
                record = json.loads((job / SUMMARY_FILE).read_text())
            except json.JSONDecodeError:
                record = {"status": "running"}  # cut short while written: its job is not finished
            holder = (job / LOCK).read_text().split()[:1] if (job / LOCK).is_file() else []
            live = bool(holder) and holder[0].isdigit() and pid_alive(int(holder[0]))
            status = record.get("status")
            state = "ok" if status == "ok" else "running" if live else "failed" if status == "failed" else "stopped"
            count[state] += 1
            cpu = record.get("cpu_seconds_total")
            cpu = float(cpu) if isinstance(cpu, (int, float)) else 0.0
            spent += cpu
            if state == "ok":
                done_cpu.append(cpu)
            if state in ("running", "stopped"):
                unfinished_cpu.append(cpu)
                step = record.get("global_step") or 0
                total = ((record.get("config") or {}).get("trainer") or {}).get("max_steps")
                of = f" of {total}" if total else ""
                pid = f", pid {holder[0]}" if live else ""
                lines.append(f"- {job}: {state}{pid}, step {step}{of}")
        combos = sweep_overrides(sweep)  # parsed once: the basic sweeper's jobs, else Optuna's count
        jobs = len(combos) if combos is not None else sweep_jobs(sweep)
        if combos is not None:
            waiting: int | None = sum(combo not in ran for combo in combos)
        else:
            waiting = max(jobs - sum(count.values()), 0) if jobs is not None else None
        # the jobs column is the sum of the others: a folder relaunched with other seeds holds more jobs than its
        # latest launch
        total = None if waiting is None else sum(count.values()) + waiting
        mean = sum(done_cpu) / len(done_cpu) if done_cpu else None
        left = (mean * waiting + sum(max(mean - c, 0.0) for c in unfinished_cpu)) / 3600 if mean and jobs else None
        rows.append([str(sweep), total, count["ok"], count["running"], count["stopped"], count["failed"], waiting,
                     spent / 3600, left])
    if len(rows) > 1:  # a study's sweeps: what is done and left of the whole
        rows.append(["all", *(None if any(r[k] is None for r in rows) else sum(r[k] for r in rows)
                              for k in range(1, len(rows[0])))])
    cell = lambda x: "n/a" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)
    head = ("| sweep | jobs | finished | running | stopped | failed | not started | CPU-hours spent | "
            "CPU-hours left (est.) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    table = "\n".join("| " + " | ".join(map(cell, r)) + " |" for r in rows)
    running, left = rows[-1][3], rows[-1][8]
    if running and left:  # CPU-bound jobs of one thread each: their CPU time is their wall time on a core of their own
        lines.insert(0, f"At the {running} job(s) running now, each on a core of its own: about {left / running:.2f} "
                        "hours of wall time left (longer on a busier machine).\n")
    return head + table + "\n" + ("\n" + "\n".join(lines) + "\n" if lines else "")


def generated_blocks(pages: Sequence[Path]) -> list[tuple[Path, str, str]]:
    """(page, report arguments, block text) of every generated block of the markdown files under `pages`."""
    files = sorted({f for p in pages for f in ([p] if p.is_file() else p.rglob("*.md"))})
    return [(f, m["args"], m["body"]) for f in files for m in BLOCK.finditer(f.read_text())]


def report_tables(markdown: str) -> dict[str, str]:
    """title -> table (its lines, newline-terminated) of a report."""
    return {m["title"]: m.group(3) for m in TITLED.finditer(markdown)}


def refill_block(body: str, tables: dict[str, str], page: Path) -> str:
    """`body` with each titled table replaced by the report's table of that title. A report title on the page with no
    table (`| |`) or list (`- `) under it is an error: refilled as it stands, the next title would go unfilled."""
    filled = {m["title"] for m in TITLED.finditer(body)}
    bare = [t for t in (m["title"] for m in TITLE_LINE.finditer(body)) if t in tables and t not in filled]
    if bare:
        raise ReportError(f"{page}: the title {bare[0]!r} has no table ('| |') or list ('- ') under it to refill")

    def one(m: re.Match) -> str:
        if m["title"] not in tables:
            raise ReportError(f"{page}: the report has no table titled {m['title']!r}; titles: {sorted(tables)}")
        return m.group(1) + tables[m["title"]]

    return TITLED.sub(one, body)


def refill(pages: Sequence[Path], report: Callable[[list[str]], int]) -> list[Path]:
    """Rebuild every generated block of `pages` (files or folders of markdown) from `report(ARGS)` (the report
    command: it writes ARGS' --out, or <first folder>/report). Returns the pages rewritten."""
    done = []
    for page in sorted({f for f, _, _ in generated_blocks(pages)}):
        def fill(m: re.Match, page: Path = page) -> str:
            argv = shlex.split(m["args"])
            if report(argv) != 0:
                raise ReportError(f"{page}: python -m pelab.report {m['args']} failed")
            out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[0]) / "report"
            return m.group(1) + refill_block(m["body"], report_tables((out / "report.md").read_text()), page) + m.group(4)

        page.write_text(BLOCK.sub(fill, page.read_text()))
        done.append(page)
    return done
