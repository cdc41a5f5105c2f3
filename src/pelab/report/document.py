"""Rendering, the document: `report.md` (sections of tables and figures) from the jobs under some folders."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pelab.evaluation.registry import EVALUATIONS
from pelab.evaluation.stats import MIN_SEEDS
from pelab.metric_keys import metric_key
from pelab.provenance import provenance_state
from pelab.report.aggregation import (
    Row,
    acquired_rows,
    group_rows,
    kind_title,
    metric_lengths,
    not_acquired_rows,
    offset_kinds,
    probe_kinds,
    probe_panel,
    trained_on_text,
)
from pelab.report.comparisons import COMPARED
from pelab.report.comparisons import compare as compare_rows
from pelab.report.discovery import Job, find_jobs
from pelab.report.figures import make_figures, question_figures
from pelab.report.probe_tables import (
    baselines_text,
    not_acquired_tables,
    offset_table,
    paired_table,
    probe_tables,
)
from pelab.report.questions import (
    answer_across,
    answer_all,
    check_criterion,
    check_rates,
    holds,
    judge,
    load_questions,
)
from pelab.report.tables import (
    Table,
    acquisition_table,
    along_training_table,
    budget_table,
    common_settings,
    comparison_tables,
    convergence_table,
    criterion_table,
    evaluation_text,
    failures_table,
    holds_table,
    interaction_table,
    interval_table,
    metadata_table,
    metric_table,
    power_table,
    question_along_table,
    question_table,
    retests_table,
    retrieval_curve_table,
)

REPORT_FILE = "report.md"


@dataclass
class Report:
    markdown: str
    tables: list[Table]
    figures: dict[str, Path]
    rows: list[Row]
    ok: list[Job]
    failed: list[Job]
    path: Path


def evaluated_on(jobs: Sequence[Job]) -> str:
    """One sentence naming the evaluation text of the jobs (split, blocks, seed), or saying they differ."""
    texts = sorted({evaluation_text(j) for j in jobs if j.extrapolation})
    if not texts:
        return ""
    if len(texts) == 1:
        return f"Evaluated on {texts[0]}."
    return "The runs were evaluated on different text (see the Runs table): compare across them with care."


def _newest_launch(jobs: Sequence[Job]) -> str:
    """When the newest launch ended: a date that follows from the runs, so regenerating an unchanged study
    rewrites nothing (the clock at generation time would)."""
    ends = [launch.get("ended_at") for j in jobs for launch in j.summary.get("launches") or [] if launch.get("ended_at")]
    return f"; the newest run ended {max(ends)[:16].replace('T', ' ')} UTC" if ends else ""


def one_rate_warning(rows: Sequence[Row]) -> str:
    """A warning where encodings are compared at one learning rate that no row varies: a comparison of encodings at
    one untuned rate is also a comparison of how well each suits that rate."""
    names = {r.jobs[0].setting("pe.name") for r in rows}
    rates = {j.setting("optim.lr") for r in rows for j in r.jobs}
    if len(names) < 2 or len(rates) != 1:
        return ""
    return (f"**Warning:** every encoding trained at one learning rate (optim.lr={rates.pop()}), not tuned per "
            "encoding: a difference between encodings is also a difference in how well each suits that rate.")


def comparisons_text(comparisons: Sequence) -> str:
    """The sentence above the paired comparisons: how many were tested and resolved, or why none was tested."""
    if not comparisons:
        return ""
    tested = sum(not c.note for c in comparisons)
    if not tested:
        return (f"No difference could be tested: every pair shares fewer than {MIN_SEEDS} seeds (the seed is the unit); "
                "the estimates are shown without a verdict.")
    return (f"{sum(c.resolved for c in comparisons)} of {tested} differences resolved (Holm-adjusted paired tests over "
            "seeds, 5%); the others are not resolved at their number of seeds, or not tested (the cell says why).")


def build_report(folders: Sequence[str | Path], out: str | Path, title: str = "PELab report",
                 baseline: str | None = None, compare: Sequence[str] | None = None,
                 compare_lengths: Sequence[int] | None = None, pairs: Sequence[str] | None = None,
                 questions: str | Path | None = None, figures: bool = True) -> Report:
    """Read the jobs under `folders`, write `<out>/report.md` and the PNG figures (none with `figures=False`:
    the tables alone); return the pieces.
    `baseline`, `compare`, `compare_lengths`, `pairs`: an exploratory family of paired comparisons
    (`pelab.report.comparisons`); `questions`: the study's declared questions (`pelab.report.questions`), the
    confirmatory family (then the exploratory one is made only where those options ask for it)."""
    declaration = load_questions(questions) if questions else None  # a bad file fails before any reading
    jobs = find_jobs(folders)  # first: a mistyped folder is an error, not an empty <folder>/report
    ok = [j for j in jobs if j.status == "ok"]
    failed = [j for j in jobs if j.status != "ok"]
    rates = ""
    if declaration:  # a run under another criterion or rate: refused before anything is written
        check_criterion(declaration, ok)
        rates = check_rates(declaration, ok)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, shown, also = group_rows(ok) if ok else ([], [], [])

    sources = ", ".join(f"`{f}`" for f in folders)
    md = [
        f"# {title}",
        "",
        (
            f"From {sources}: {len(jobs)} jobs, {len(ok)} finished, {len(failed)} failed or unfinished"
            f"{_newest_launch(jobs)}."
        ),
    ]
    if failed:
        md.append(
            f"**{len(failed)} job(s) left out: see [Failed / unfinished jobs](#failed--unfinished-jobs).**"
        )
    if ok:
        md += [
            "",
            "Rows: " + ", ".join(f"`{k}`" for k in shown) + "; a cell with one seed is the run's value and its 95% "
            "interval (perplexities: bootstrap over the documents of the evaluation text, approximate below 50 "
            "documents; accuracies: Wilson over instances), with "
            "several seeds the mean and its 95% t interval over the seeds (tables without intervals: mean ± std). "
            "**Bold** = the training length. `n/a` = not applicable (see the notes), `inf` = diverged, `—` = not "
            "evaluated. The Runs table says which split and text each run was evaluated on.",
            "",
        ]
        md += ["**Setup** (shared by every run; a findings page quotes it instead of typing it):", ""]
        if also:
            md.append("- also varying between rows: " + ", ".join(f"`{k}`" for k in also))
        md += [f"- {line}" for line in common_settings(ok)]
        if rates:  # the rates were chosen per scheme: say so, instead of warning they were not
            md += ["", rates]
        elif warning := one_rate_warning(rows):
            md += ["", warning]
        if unverified := [j.folder.name for j in ok if provenance_state(j.summary, j.folder) == "dirty-unverified"]:
            md += ["", f"**Warning:** {len(unverified)} run(s) were made from uncommitted changes that were not kept "
                   "and not verified by a rerun from their commit (`experiments/provenance/verify.py`): "
                   + ", ".join(f"`{n}`" for n in unverified) + "."]
    tables: list[Table] = []
    draw = bool(rows and figures)
    figures = make_figures(rows, out) if draw else {}

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

    # Perplexity is read only where a run trained on text: a retrieval-only run (data.recall_mix=1, loss on the
    # answers) has no language model to score.
    text_rows = [r for r in rows if trained_on_text(r)]
    if rows and not text_rows:
        md += ["", ("No run trained on text (data.recall_mix=1: recall rows only): the perplexity sections are "
                    "left out.")]
    section(
        "Perplexity vs evaluation length",
        [interval_table(text_rows, "extrap/ppl", "Perplexity, non-overlapping windows of L tokens",
                        protocol="nonoverlap")],
        ["ppl_vs_length"] if text_rows else [],
        "Every length scores the same tokens; a window of L tokens sees context back to its own start only. "
        + evaluated_on(ok),
    )
    section(
        "Perplexity ratio",
        [interval_table(text_rows, "extrap/ppl_ratio", "ppl@L / ppl@training length", digits=3)],
        text="A single run's interval is a paired bootstrap over the documents of its evaluation text (each "
        "document's difficulty cancels).",
    )
    across = declaration.across if declaration and rows else None
    per = answer_across(declaration, ok) if across else {}  # each value's runs on their own
    answers = answer_all(declaration, rows) if declaration and rows and not across else []
    over = holds(per, across) if across else []
    if draw and (answers or per):
        figures.update(question_figures({f"{across}={v}": a for v, a in per.items()} if across else {"": answers},
                                        out))
    section(
        "Declared questions",
        [question_table(answers), interaction_table(answers), power_table(answers), question_along_table(answers),
         *(t for v, a in per.items() for t in (question_table(a, f"{across}={v}"), interaction_table(a, f"{across}={v}"),
                                               power_table(a, f"{across}={v}"),
                                               question_along_table(a, f"{across}={v}"))),
         holds_table(over)],
        ["questions_ratio", "questions_difference"],
        (f"The questions of `{declaration.path}`, declared {declaration.declared}."
         + (f" Asked of the runs at each {across} on their own." if across else "")
         + (" The figure: each question's estimate with its Bonferroni interval" + (f" at each {across}" if across else "")
            + ", filled where resolved; the grey band is the declared smallest effect either way."
            if any(k.startswith("questions_") for k in figures) else "") if declaration else ""),
    )
    if answers or over:
        md += ["**Claims** (generated from the verdicts above):", ""] + [f"- {a.sentence()}" for a in answers or over]
    judgements = judge(declaration, answers, per) if declaration and rows else []
    section(
        "Earlier claims, judged",
        [retests_table(judgements)],
        (),
        f"The earlier claims `{declaration.path}` names (retests), each judged by the rule fixed there before the "
        "runs." if judgements else "",
    )
    if judgements:
        md += ["**Judgements** (generated from the verdicts above):", ""] + [f"- {j.sentence()}" for j in judgements]
    exploratory = not declaration or compare or pairs or baseline
    metrics = compare or (COMPARED if text_rows else [])  # no perplexity to compare where no run saw text
    comparisons = (compare_rows(rows, shown, metrics, compare_lengths, baseline, pairs)
                   if rows and metrics and exploratory else [])
    section(
        "Paired comparisons",
        [*comparison_tables(comparisons), budget_table(comparisons)],
        (),
        comparisons_text(comparisons),
    )
    longest = max(metric_lengths(text_rows, "extrap/ppl"), default=None)
    along, warnings = (along_training_table(text_rows, metric_key("extrap/ppl_ratio", longest)) if longest
                       else (None, []))
    # retrieval along training (eval.at_probes): each kind's accuracy at its longest probe length; None unless a
    # run has points carrying it
    probe_along = [t for kind in probe_kinds(rows) if (n := max(metric_lengths(rows, f"probe/{kind}/acc"), default=None))
                   and (t := along_training_table(rows, metric_key(f"probe/{kind}/acc", n))[0])]
    section(
        "Along training",
        [along, along_training_table(text_rows, metric_key("extrap/ppl", longest))[0] if along else None,
         *probe_along],
        ["along_training"] if text_rows else [],
        " ".join(["Extrapolation measured during training (eval.at) and at the end of runs of each budget."]
                 + ([("Retrieval too (eval.at_probes, or the ends of runs of several budgets): each probe kind's "
                      "accuracy at its longest probe length.")] if probe_along else [])
                 + [f"**Warning:** {w}" for w in warnings]),
    )
    section(
        "Sliding window",
        [interval_table(text_rows, "extrap/ppl_sliding",
                        "Perplexity, sliding windows of L tokens (stride = training length)", protocol="sliding")],
    )
    section(
        "Bits per byte",
        [metric_table(text_rows, "extrap/bpb", "Bits per byte, non-overlapping windows", digits=3)],
    )
    section(
        "Convergence",
        [convergence_table(text_rows)],
        ["val_curve"] if text_rows else [],
        "Is in-window perplexity flat at the end of training? (A comparison made before it is can change "
        "with more steps.)",
    )
    section(
        "Loss by position",
        [],
        ["loss_by_position"] if text_rows else [],
        "Mean NLL by position in the window at the longest evaluated length (dashed line: training length).",
    )
    for evaluation in EVALUATIONS.values():  # the sections the evaluations declare (attention diagnostics, plugins)
        for sec in evaluation.sections:
            section(sec.heading, [interval_table(rows, metric, title, digits=sec.digits) for metric, title in sec.tables],
                    sec.figures, sec.text)
    section("Retrieval training (in-window criterion)", [criterion_table(rows), retrieval_curve_table(rows),
                                                           acquisition_table(rows)])
    probed, not_acquired = acquired_rows(rows)
    if not_acquired:
        md.append("Not acquired in-window, so left out of the probe tables and figures: " + ", ".join(not_acquired)
                  + ".")
    for kind in probe_kinds(probed):
        kind_rows = [r for r in probed if probe_panel(r, kind)]  # a row that never probed the kind has none
        baselines = baselines_text(kind_rows, kind)
        section(
            f"Probe: {kind}",
            probe_tables(kind_rows, kind),
            [f"probe_{kind}_vs_length"],
            f"Retrieval accuracy with the answer at each depth of contexts of each length; {baselines}. * = training "
            "length." if baselines else "",
        )
    for kind in offset_kinds(probed):
        title = kind_title(kind)
        section(f"Probe: {kind}" + (f" ({title})" if title else ""), [offset_table(probed, kind), paired_table(probed, kind)])
    unlearned = not_acquired_rows(rows)
    section(
        "Runs that did not acquire retrieval",
        [t for kind in probe_kinds(unlearned) if kind not in offset_kinds(unlearned)
         for t in not_acquired_tables(unlearned, kind)] if unlearned else [],
        text=("Their in-window accuracy never reached the criterion, so what they retrieve past the window is not "
              "read as extrapolation; shown for what they did learn (e.g. the shape of their depth curves)."
              if unlearned else ""),
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
