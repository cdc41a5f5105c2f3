"""The command line: `python -m pelab.report` / `pelab-report`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pelab.errors import ReportError
from pelab.report.document import build_report
from pelab.report.tables import last_line
from pelab.report.upload import upload_to_wandb


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from pelab import report

    p = argparse.ArgumentParser(prog="python -m pelab.report", description=report.__doc__.split("\n\n")[0])
    p.add_argument(
        "folders", nargs="+", help="run or multirun folders (searched recursively for summary.json)"
    )
    p.add_argument(
        "--out", default=None, help="output folder (default: <folder>/report for one folder, else ./report)"
    )
    p.add_argument("--title", default="PELab report")
    p.add_argument("--baseline", default=None,
                   help="compare every row against this row label (default: every pair of rows that differ in one "
                        "setting); its runs must share seeds and evaluation text with the others")
    p.add_argument("--compare", nargs="+", default=None, metavar="METRIC",
                   help="the metrics (without @L) of the paired comparisons, one Holm family "
                        "(default: extrap/ppl extrap/ppl_ratio)")
    p.add_argument("--compare-lengths", nargs="+", type=int, default=None, metavar="L",
                   help="compare at these lengths only (default: every length): a smaller family, more power")
    p.add_argument("--pairs", nargs="+", default=None, metavar="A/B",
                   help="compare only these pairs of rows (A, B: the first words of row labels, e.g. sinusoidal/rope, "
                        "at every value of the other settings; or two whole row labels, quoted, for one pair that "
                        "differs in several settings): the claims a study set out to test, one family")
    p.add_argument("--questions", default=None, metavar="FILE",
                   help="the study's declared questions (YAML: pair, metric@L, budgets, estimand, smallest_effect; "
                        "see pelab.report.questions): tested once each, one Holm family")
    p.add_argument("--no-figures", action="store_true",
                   help="the tables alone, no PNG figures (a quarter of the time of a large study's report)")
    p.add_argument("--plan", action="store_true",
                   help="with --questions: print the seeds each question needs for 80%% power at alpha/m for its "
                        "smallest effect, from the sd of the runs at hand (the pilot), and exit")
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


def print_plan(folders: Sequence[str], questions: str | None) -> int:
    """`--plan`: the seeds per declared question, from the runs under `folders` as the pilot."""
    from pelab.report.aggregation import group_rows
    from pelab.report.discovery import find_jobs
    from pelab.report.questions import load_questions, plan, plan_lines, split_jobs

    if not questions:
        raise ReportError("--plan needs --questions FILE: the questions to plan the seeds of")
    decl = load_questions(questions)
    ok = [j for j in find_jobs(folders) if j.status == "ok"]
    if not decl.across:
        print("\n".join(plan_lines(plan(decl, group_rows(ok).rows if ok else []))))
        return 0
    for value, jobs in split_jobs(ok, decl.across).items():  # each value's runs are their own pilot
        print("\n".join([f"{decl.across}={value}:", *plan_lines(plan(decl, group_rows(jobs).rows))]))
    return 0


SUBCOMMANDS = ("collect", "refill", "cost", "restore", "progress")  # the first word; anything else is a report's folders


def step_main(argv: Sequence[str]) -> int:
    """`collect`, `refill`, `cost`, `restore` and `progress` (pelab.report.generated): the steps between a study's
    sweep and its page."""
    from pelab.report.generated import collect, cost, progress, refill, restore

    p = argparse.ArgumentParser(prog="python -m pelab.report")
    sub = p.add_subparsers(dest="step", required=True)
    c = sub.add_parser("collect", help="copy the small files of a sweep's finished run folders into the repository")
    c.add_argument("sweep", type=Path, help="the sweep folder (hydra.sweep.dir), or one finished run's (hydra.run.dir)")
    c.add_argument("dest", type=Path, help="the destination, e.g. experiments/<study>/runs")
    s = sub.add_parser("restore", help="put collected finished runs back into their sweep folders (a relaunch skips them)")
    s.add_argument("collected", type=Path, help="the folder they were collected into, e.g. experiments/<study>/runs")
    s.add_argument("root", type=Path, help="the study's root: their summaries' output_dir under it are restored")
    r = sub.add_parser("refill", help="rebuild the generated blocks of findings pages from their reports")
    r.add_argument("pages", type=Path, nargs="*", default=[Path("experiments")],
                   help="markdown files or folders (default: experiments/), run from the repository root")
    k = sub.add_parser("cost", help="the CPU and wall hours of the finished runs under each folder")
    k.add_argument("folders", type=Path, nargs="+", help="folders of run folders (collected, or a sweep)")
    k.add_argument("--out", type=Path, help="also write the table there (markdown)")
    g = sub.add_parser("progress", help="how far each sweep has got: its jobs finished, running, stopped, failed, "
                       "not started, and the CPU-hours spent and left")
    g.add_argument("sweeps", type=Path, nargs="+", help="sweep folders (hydra.sweep.dir), or a study's root: the "
                   "sweeps inside it")
    args = p.parse_args(argv)
    try:
        if args.step == "collect":
            jobs = collect(args.sweep, args.dest)
            print(f"collected {len(jobs)} finished jobs of {args.sweep} into {args.dest}")
        elif args.step == "restore":
            jobs = restore(args.collected, args.root)
            print(f"restored {len(jobs)} finished jobs of {args.collected} under {args.root}")
        elif args.step == "cost":
            text = cost(args.folders)
            if args.out:
                args.out.write_text(text)
            print(text, end="")
        elif args.step == "progress":
            print(progress(args.sweeps), end="")
        else:
            for page in refill(args.pages, main):
                print(f"refilled {page}")
    except ReportError as err:
        print(f"pelab.report {args.step}: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return step_main(argv)
    args = parse_args(argv)
    out = (
        Path(args.out)
        if args.out
        else (Path(args.folders[0]) / "report" if len(args.folders) == 1 else Path("report"))
    )
    try:
        if args.plan:
            return print_plan(args.folders, args.questions)
        report = build_report(args.folders, out, args.title, baseline=args.baseline, compare=args.compare,
                              compare_lengths=args.compare_lengths, pairs=args.pairs, questions=args.questions,
                              figures=not args.no_figures)
    except ReportError as err:
        print(f"pelab.report: {err}", file=sys.stderr)
        return 2
    print(
        f"report: {report.path} ({len(report.ok)} finished, {len(report.failed)} failed/unfinished; "
        f"{len(report.figures)} figures)"
    )
    for j in report.failed:
        print(f"  skipped {j.folder} [{j.status}] {last_line(j.error, 200)}")
    if args.wandb:
        run = upload_to_wandb(report, args.project, args.entity, args.wandb_mode)
        if run is not None:
            print(f"W&B report run: {run.name} ({run.settings.mode})")
    return 0 if report.ok else 1
