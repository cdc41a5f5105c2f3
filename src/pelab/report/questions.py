"""Declared questions: what a study set out to test, each tested once (`python -m pelab.report --questions FILE`).

A study declares its questions in a small YAML file in its folder, before its runs (or says they were written after
them: then every verdict is labelled post hoc)::

    declared: before the runs          # or: after the runs (post hoc)
    budget: trainer.max_steps          # the setting that is the training budget (default)
    alpha: 0.05
    questions:
      - pair: sinusoidal/rope          # A/B: row labels without the budget (or one label: below)
        metric: extrap/ppl@1024        # one metric at one length: ratio@L and ppl@L are not two questions
        budgets: [1500, 6000]          # default: every budget both rows have
        estimand: averaged             # at (one budget) | averaged (over the budgets) | every (at every budget)
        smallest_effect: 1.05          # the smallest effect of interest: a ratio A / B (log-scale metrics) or an
                                       # accuracy difference (probe/...), for --plan and the equivalence reading
        expected: higher               # optional: A higher / lower than B
    retrieval_runs: acquired           # optional: acquired (default) | all, below; a question may set its own
    across: data.source                # optional: ask every question of each value of this setting, below
    criterion: {threshold: 0.95}       # optional: the in-window retrieval criterion every run must have used
    rates: ../lr_grid/choice.json      # optional: each scheme's learning rate, chosen before the runs, below
    retests:                           # optional: earlier claims these questions retest, judged by a fixed rule, below
      - {claim: ALiBi below RoPE at 8 x L, page: ../v3/README.md, question: 1, direction: lower, judged_on: stdlib}

Each question is a contrast per seed (log(A / B), or A - B for an accuracy; runs of one seed at several budgets
share initialisation and data order, so the seed is the unit), tested by a one-sample t over the seeds
(``pelab.evaluation.stats.seed_test``):

* *at*: the contrast at the one declared budget;
* *averaged*: each seed's mean contrast over the declared budgets, then the t over seeds (df = seeds - 1);
* *every*: the intersection-union test (p = the largest per-budget p; 1 where the budgets disagree in sign).

A question of one row (``pair: rope``) tests the row's own value against 0 over its seeds: a difference-scale metric
only (e.g. probe/mqar/lim_gap@128, the edges' accuracy minus the middle's: is retrieval U-shaped?).

A retrieval (probe) question compares the seeds whose runs acquired the task in-window (their in-window criterion
met), and names the others; ``retrieval_runs: all`` compares every finished run instead (declared before the runs,
for a criterion that runs which learned the task may miss, e.g. induction heads' 1.000 at 0.98), the ones that did not
acquire it still named.

``criterion`` fixes the in-window retrieval criterion in the file (keys of callbacks.retrieval_criterion: kind,
threshold, every_n_steps, samples): a run made with another is refused, in one line, before any question is asked.

``rates: <file>`` (JSON, relative to the questions file) names each scheme's learning rate as chosen before the runs
(``{scheme: lr}``, ``{scheme: {"lr": lr}}`` or ``{scheme: {data.source: lr}}``; the scheme is pe.name, or the layout
preset a model.name ``tiny-<preset>`` names): a run of a listed scheme at another rate is refused in one line, and the
report says which rows ran at their chosen rate instead of warning that one rate was used untuned.

``across: <setting>`` (e.g. data.source: each corpus) asks every question of the runs at each value of the setting
on their own (rows labelled within that value, one Holm family per value), and a question *holds on every value*
when it is resolved at each, in one direction: the intersection-union test, p = the largest of the values' Holm p.

``retests`` lists the claims of earlier studies that these questions retest, each judged by one rule fixed before the
runs: ``question`` (its place in ``questions``, from 1) and ``direction`` (the earlier claim's, A vs B of that
question); with ``across``, ``judged_on`` names the value whose verdict judges it (the earlier study's corpus; the other
values' verdicts are shown beside it). **confirmed**: resolved in the claim's direction; **reversed**: resolved in the
other; **withdrawn**: not resolved at seeds whose power for the declared smallest effect is at least 80 % (the power
table's); **not confirmed (underpowered)**: not resolved, below that power; a claim without ``question`` is **not
retested**.

The budget interaction (does the contrast move with the budget? a t on each seed's between-budget difference) is
reported on its own line, outside the family. Holm over the declared questions only; the interval beside each
verdict is the Bonferroni interval at 1 - alpha / m. ``plan`` gives, per question, the seeds needed for 80 % power
at alpha / m for the declared smallest effect.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pelab.errors import ReportError
from pelab.evaluation.stats import (
    MIN_SEEDS,
    SeedTest,
    bonferroni_level,
    budget_interaction,
    holm,
    intersection_union,
    pooled_sd,
    sd_upper,
    seed_test,
    seeds_for_power,
    t_power,
)
from pelab.metric_keys import parse_key
from pelab.report.aggregation import Row, acquired_rows, group_rows, seed_points
from pelab.report.comparisons import contrast, contrasts, log_scale, seed_values, unpaired_because
from pelab.report.discovery import Job

ESTIMANDS = {"at": "at one budget", "averaged": "averaged over the budgets", "every": "at every budget"}
EXPECTED = ("higher", "lower")
POWER = 0.8
RETRIEVAL_RUNS = ("acquired", "all")
CRITERION_KEYS = {"kind", "threshold", "every_n_steps", "samples"}
RETEST_KEYS = {"claim", "page", "question", "direction", "judged_on"}
QUESTION_KEYS = {"pair", "metric", "budgets", "estimand", "smallest_effect", "expected", "name", "retrieval_runs"}


@dataclass(frozen=True)
class Question:
    a: str
    b: str  # "" for a question of one row: its value against 0
    metric: str  # name@L
    estimand: str
    smallest_effect: float  # a ratio (> 1) on the log scale, an accuracy difference (> 0) otherwise
    budgets: tuple[Any, ...] = ()  # () = every budget both rows have
    expected: str | None = None
    name: str = ""
    retrieval_runs: str | None = None  # RETRIEVAL_RUNS, this question's own (None: the file's)

    @property
    def log(self) -> bool:
        return log_scale(self.metric)

    @property
    def title(self) -> str:
        return self.name or (f"{self.a} vs {self.b}, {self.metric}" if self.b else f"{self.a}, {self.metric} vs 0")

    def effect(self) -> float:
        """The smallest effect of interest as a contrast (log ratio, or difference)."""
        return math.log(self.smallest_effect) if self.log else self.smallest_effect


@dataclass(frozen=True)
class Retest:
    """An earlier study's claim that a declared question retests (module doc: ``retests``)."""

    claim: str
    page: str = ""  # where the claim was made (a path relative to the questions file, or any reference)
    question: int | None = None  # 0-based index into the declaration's questions; None: not retested
    direction: str | None = None  # EXPECTED: the claim's direction, A vs B of that question
    judged_on: str | None = None  # the ``across`` value whose verdict judges it (not `on`: YAML reads it as true)


@dataclass(frozen=True)
class Declaration:
    questions: list[Question]
    declared: str  # "before the runs" / "after the runs (post hoc)"
    budget: str = "trainer.max_steps"
    alpha: float = 0.05
    path: str = ""
    retrieval_runs: str = "acquired"  # RETRIEVAL_RUNS: which runs a retrieval question compares
    across: str | None = None  # a setting: every question asked of the runs at each of its values (module doc)
    criterion: dict[str, Any] = field(default_factory=dict)  # callbacks.retrieval_criterion's declared keys
    rates: dict[str, Any] = field(default_factory=dict)  # {scheme: the rate chosen before the runs} (module doc)
    rates_file: str = ""
    retests: list[Retest] = field(default_factory=list)

    @property
    def post_hoc(self) -> bool:
        return "post hoc" in self.declared or "after" in self.declared


def _bad(path: Path, where: str, fix: str) -> ReportError:
    return ReportError(f"{path}: {where}: {fix}")


def load_questions(path: str | Path) -> Declaration:
    """Read and check a questions file; every mistake is one line naming the key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"--questions {path}: no such file; write the study's questions first (see "
                          "`pelab.report.questions` for the format)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ReportError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("questions"), list) or not raw["questions"]:
        raise _bad(path, "questions", "give a list of questions (pair, metric, estimand, smallest_effect)")
    declared = str(raw.get("declared") or "")
    if not declared:
        raise _bad(path, "declared", "say when the questions were written: 'before the runs' or "
                   "'after the runs (post hoc)'")
    alpha = raw.get("alpha", 0.05)
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise _bad(path, "alpha", f"a level in (0, 1), got {alpha!r}")
    runs = str(raw.get("retrieval_runs", "acquired"))
    if runs not in RETRIEVAL_RUNS:
        raise _bad(path, "retrieval_runs", f"one of {', '.join(RETRIEVAL_RUNS)}, got {runs!r}")
    questions = [_question(path, i, q) for i, q in enumerate(raw["questions"])]
    seen: dict[tuple, int] = {}
    for i, q in enumerate(questions):
        # ppl_ratio@L between two settings is ppl@L's contrast minus ppl@train_length's: the same question
        name = parse_key(q.metric).name.replace("extrap/ppl_ratio", "extrap/ppl")
        key = (frozenset((q.a, q.b)), name, parse_key(q.metric).length, frozenset(q.budgets))
        if key in seen:
            raise _bad(path, f"questions[{i}]", f"asks what questions[{seen[key]}] asks ({q.metric} of {q.a}/{q.b}; "
                       "ppl@L and ppl_ratio@L are one question): a question is tested once, with one estimand")
        seen[key] = i
    across = raw.get("across")
    if across is not None and not (isinstance(across, str) and across.strip()):
        raise _bad(path, "across", f"a setting whose values split the runs, e.g. data.source; got {across!r}")
    criterion = raw.get("criterion") or {}
    if not isinstance(criterion, dict) or set(criterion) - CRITERION_KEYS:
        raise _bad(path, "criterion", f"a mapping of {', '.join(sorted(CRITERION_KEYS))} (callbacks.retrieval_criterion's "
                   f"keys); got {criterion!r}")
    rates_file, rates = raw.get("rates"), {}
    if rates_file is not None:
        rates_path = path.parent / str(rates_file)
        try:
            rates = json.loads(rates_path.read_text())
        except (OSError, ValueError) as err:
            raise _bad(path, "rates", f"a JSON file of each scheme's chosen rate, relative to this file; {rates_path}: "
                       f"{type(err).__name__}") from None
        if not isinstance(rates, dict):
            raise _bad(path, "rates", f"{rates_path} holds {type(rates).__name__}, not {{scheme: rate}}")
    retests = [_retest(path, i, r, len(questions), across) for i, r in enumerate(raw.get("retests") or [])]
    return Declaration(questions, declared, str(raw.get("budget") or "trainer.max_steps"), float(alpha), str(path),
                       runs, across, criterion, rates, str(rates_file or ""), retests)


def _retest(path: Path, i: int, r: Any, m: int, across: str | None) -> Retest:
    """One ``retests`` entry, checked: a retested claim names its question (from 1), its direction, and with
    ``across`` the value that judges it; a claim not retested names none of them."""
    where = f"retests[{i}]"
    if not isinstance(r, dict) or not str(r.get("claim") or "").strip():
        raise _bad(path, f"{where}.claim", "each entry is a mapping with the earlier claim's words (claim) and, "
                   "where a question retests it, question, direction and (with across) judged_on")
    if True in r:  # YAML 1.1 reads a bare `on` key as true
        raise _bad(path, f"{where}.on", "YAML reads the key on as true: name the judging value judged_on")
    if unknown := sorted(set(map(str, r)) - RETEST_KEYS):
        raise _bad(path, f"{where}.{unknown[0]}", f"unknown key; the keys are {', '.join(sorted(RETEST_KEYS))}")
    q, direction, on = r.get("question"), r.get("direction"), r.get("judged_on")
    if q is None:
        if direction is not None or on is not None:
            raise _bad(path, f"{where}.question", "direction and judged_on judge a retested claim: name its question (from "
                       "1), or leave all three out for a claim not retested")
        return Retest(str(r["claim"]).strip(), str(r.get("page") or ""))
    if not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= m:
        raise _bad(path, f"{where}.question", f"the retesting question's place in questions, 1 to {m} (got {q!r})")
    if direction not in EXPECTED:
        raise _bad(path, f"{where}.direction", f"the earlier claim's direction, A vs B of question {q}: higher or "
                   f"lower (got {direction!r})")
    if across and on is None:
        raise _bad(path, f"{where}.judged_on", f"the {across} value whose verdict judges the claim (the earlier study's)")
    if on is not None and not across:
        raise _bad(path, f"{where}.judged_on", "names a value of across, which this file does not set: leave it out")
    return Retest(str(r["claim"]).strip(), str(r.get("page") or ""), q - 1, str(direction),
                  None if on is None else str(on))


def scheme(job: Job) -> str:
    """A run's scheme: pe.name, or the layout preset its model.name tiny-<preset> names (experiments/layouts)."""
    name = str(job.setting("model.name") or "")
    return name.removeprefix("tiny-") if name.startswith("tiny-") else str(job.setting("pe.name"))


def chosen_rate(decl: Declaration, job: Job) -> float | None:
    """The rate ``rates`` chose for the run's scheme (on its data.source where chosen per corpus); None: not listed."""
    v = decl.rates.get(scheme(job))
    if isinstance(v, dict) and "lr" not in v:  # chosen per corpus: the run's corpus must be among them
        source = str(job.setting("data.source"))
        if source not in v:
            raise ReportError(f"{decl.path}: rates: {decl.rates_file} chose {scheme(job)}'s rate for data.source in "
                              f"{', '.join(sorted(v))}, not {source} ({job.folder.name}); choose it there first")
        v = v[source]
    return None if v is None else float(v["lr"] if isinstance(v, dict) else v)


def check_rates(decl: Declaration, jobs: Sequence[Job]) -> str:
    """Every run of a listed scheme at its chosen rate, or one line naming the first that was not; then the sentence
    the report carries in place of the one-rate warning (which rows ran at their chosen rate, which are not listed)."""
    if not decl.rates:
        return ""
    listed, unlisted = set(), {}
    for j in jobs:
        want, used = chosen_rate(decl, j), float(j.setting("optim.lr"))
        if want is None:
            unlisted[scheme(j)] = used
        elif not math.isclose(used, want, rel_tol=1e-9):
            raise ReportError(f"{decl.path}: rates: {j.folder.name} ran at optim.lr={used:g}, {decl.rates_file} "
                              f"chose {want:g} for {scheme(j)}; compare runs made at the chosen rates")
        else:
            listed.add(scheme(j))
    out = (f"Each of {', '.join(sorted(listed))} trained at the learning rate chosen for it before these runs "
           f"(`{decl.rates_file}`, named by `{decl.path}`)")
    if unlisted:
        out += "; not chosen there: " + ", ".join(f"{k} (optim.lr={v:g})" for k, v in sorted(unlisted.items()))
    return out + "."


def check_criterion(decl: Declaration, jobs: Sequence[Job]) -> None:
    """Every run made with the declared in-window criterion (``criterion``), or one line naming the first that was
    not."""
    for j in jobs:
        used = j.setting("callbacks.retrieval_criterion") or {}
        for key, value in decl.criterion.items():
            if used.get(key) != value:
                raise ReportError(f"{decl.path}: criterion.{key}: {j.folder.name} ran with {used.get(key)!r}, the "
                                  f"questions declare {value!r}; compare runs made under the declared criterion")


def _question(path: Path, i: int, q: Any) -> Question:
    where = f"questions[{i}]"
    if not isinstance(q, dict):
        raise _bad(path, where, "each question is a mapping with pair, metric, estimand, smallest_effect")
    if unknown := sorted(set(q) - QUESTION_KEYS):
        raise _bad(path, f"{where}.{unknown[0]}", f"unknown key; the keys are {', '.join(sorted(QUESTION_KEYS))}")
    a, sep, b = str(q.get("pair") or "").partition("/")
    metric = str(q.get("metric") or "")
    if parse_key(metric).length is None:
        raise _bad(path, f"{where}.metric", f"name one metric at one length, e.g. extrap/ppl@1024 (got {metric!r})")
    if not (a.strip() and (b.strip() if sep else not log_scale(metric))):
        raise _bad(path, f"{where}.pair", "write A/B, two row labels without the budget (e.g. sinusoidal/rope); one "
                   "label tests that row against 0, for a difference such as probe/mqar/lim_gap@128 only")
    estimand = q.get("estimand")
    if estimand not in ESTIMANDS:
        raise _bad(path, f"{where}.estimand", f"one of {', '.join(ESTIMANDS)} (got {estimand!r})")
    budgets = q.get("budgets") or []
    if not isinstance(budgets, list):
        raise _bad(path, f"{where}.budgets", "a list of budget values, e.g. [1500, 6000]")
    if estimand == "at" and len(budgets) > 1:
        raise _bad(path, f"{where}.budgets", "estimand 'at' is one budget: give one, or use averaged / every")
    if estimand != "at" and len(budgets) == 1:
        raise _bad(path, f"{where}.estimand", "one budget declared: use 'at' (or declare several budgets)")
    effect = q.get("smallest_effect")
    log = log_scale(metric)
    if not isinstance(effect, (int, float)) or (effect <= 1 if log else not 0 < effect <= 1):
        raise _bad(path, f"{where}.smallest_effect", "the smallest effect of interest: a ratio above 1 (e.g. 1.05) "
                   "for a perplexity, an accuracy difference in (0, 1] for a probe")
    expected = q.get("expected")
    if expected is not None and expected not in EXPECTED:
        raise _bad(path, f"{where}.expected", f"higher or lower (A vs B), or leave it out (got {expected!r})")
    runs = q.get("retrieval_runs")
    if runs is not None and runs not in RETRIEVAL_RUNS:
        raise _bad(path, f"{where}.retrieval_runs", f"one of {', '.join(RETRIEVAL_RUNS)}, got {runs!r}")
    return Question(a.strip(), b.strip(), metric, estimand, float(effect), tuple(budgets), expected,
                    str(q.get("name") or ""), runs)


# ---------------------------------------------------------------------------------------------
# the rows of a question


def setting_name(row: Row, budget: str) -> str:
    """A row's label without its budget (`budget`=value), the name a question uses."""
    return re.sub(rf"\s*{re.escape(budget)}=\S+", "", row.label).strip()


def row_budget(row: Row, budget: str) -> Any:
    values = {j.setting(budget) for j in row.jobs}
    return values.pop() if len(values) == 1 else None


def rows_at(rows: Sequence[Row], name: str, budget: str) -> dict[Any, Row]:
    """{budget value: the row named `name` at it}."""
    return {row_budget(r, budget): r for r in rows if setting_name(r, budget) == name}


@dataclass
class Answer:
    """One declared question, answered."""

    q: Question
    seeds: list = field(default_factory=list)
    budgets: list = field(default_factory=list)
    contrasts: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))  # (seeds, budgets)
    per_budget: dict[Any, SeedTest] = field(default_factory=dict)  # at the family's Bonferroni level
    test: SeedTest | None = None  # the estimand's (at, averaged); None for every (see per_budget)
    p: float = math.nan
    p_adj: float = math.nan
    interaction: SeedTest | None = None
    note: str = ""  # why the question could not be tested
    left_out: list[str] = field(default_factory=list)  # runs that did not acquire retrieval in-window
    not_acquired: list[str] = field(default_factory=list)  # the same, compared all the same (retrieval_runs: all)
    alpha: float = 0.05
    post_hoc: bool = False
    m: int = 0  # the tested questions of its family (Holm's m)
    # estimand `at`: {(training tokens, schedule): 95 % test of the verdict's seeds' contrasts at that evaluation
    # point} along training (eval.at), where its runs have two points or more: descriptive, outside the family
    along: dict[tuple[int, str], SeedTest] = field(default_factory=dict)

    @property
    def tested(self) -> bool:
        return not self.note and math.isfinite(self.p)

    @property
    def resolved(self) -> bool:
        return self.tested and self.p_adj < self.alpha

    @property
    def n(self) -> int:
        return len(self.seeds)

    def natural(self, x: float) -> float:
        return math.exp(x) if self.q.log and math.isfinite(x) else x

    def direction(self) -> int:
        est = (self.test.estimate if self.test else
               float(np.mean([t.estimate for t in self.per_budget.values()])) if self.per_budget else math.nan)
        return 0 if not math.isfinite(est) or est == 0 else (1 if est > 0 else -1)

    def intervals(self) -> list[tuple[str, SeedTest]]:
        """(label, test) of the interval(s) beside the verdict: the estimand's, or one per budget for `every`."""
        if self.test is not None:
            return [("", self.test)]
        return [(f"{b}: ", t) for b, t in self.per_budget.items()]

    def power(self) -> tuple[float, float, int | None]:
        """What a verdict at these seeds is worth for the declared smallest effect: (the sd of the per-seed contrasts,
        the power of the test at its n seeds and alpha / m at that sd, the seeds that would give 80 %). For `every`,
        the smallest of the budgets' powers (the intersection-union test has at most that). NaN / None below
        MIN_SEEDS or with no spread."""
        if not self.tested or self.n < MIN_SEEDS:
            return math.nan, math.nan, None
        columns = [self.contrasts[:, k] for k in range(len(self.budgets))] if self.q.estimand == "every" else [
            self.contrasts.mean(axis=1)]
        sds = [float(np.std(x, ddof=1)) for x in columns]
        if not all(sd > 0 for sd in sds):
            return math.nan, math.nan, None
        alpha, d = self.alpha / max(self.m, 1), self.q.effect()
        powers = [t_power(abs(d) / sd, self.n, alpha) for sd in sds]
        k = int(np.argmin(powers))
        return sds[k], powers[k], seeds_for_power(d, sds[k], alpha)

    def test_text(self, t: SeedTest) -> str:
        """A test's estimate and interval on the question's scale (a ratio, or a difference of accuracies)."""
        if not math.isfinite(t.estimate):
            return "no estimate"  # no seed of either row to compare (e.g. none acquired the task)
        if self.q.log:
            e, lo, hi = self.natural(t.estimate), self.natural(t.lo), self.natural(t.hi)
            return f"{e:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else "")
        lo, hi = max(-1.0, t.lo), min(1.0, t.hi)  # a difference of accuracies lies in [-1, 1]
        return f"{t.estimate:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if math.isfinite(t.lo) else "")

    def estimate_text(self) -> str:
        return "; ".join(label + self.test_text(t) for label, t in self.intervals())

    def verdict(self) -> str:
        return (self._verdict() + (f"; left out: {', '.join(self.left_out)}" if self.left_out else "")
                + (f"; compared though retrieval was not acquired in-window (retrieval_runs: all): "
                   f"{', '.join(self.not_acquired)}" if self.not_acquired else ""))

    def _verdict(self) -> str:
        if self.note:
            return self.note
        if not self.tested:
            notes = [t.note for _, t in self.intervals() if t.note]
            return notes[0] if notes else f"{self.n} paired seed(s): no between-setting verdict below {MIN_SEEDS}"
        if not self.resolved:
            out = f"not resolved at {self.n} seeds"
            d = self.q.effect()
            if all(t.tested and -d < t.lo and t.hi < d for _, t in self.intervals()):
                out += "; smaller than the smallest effect of interest"
            return out
        word = "higher" if self.direction() > 0 else "lower"
        out = f"resolved: {self.q.a} {word} than {self.q.b or 0}"
        if self.q.expected and self.q.expected != word:
            out += " (opposite to the declared expectation)"
        if any(t.lo <= 0 <= t.hi for _, t in self.intervals()):
            out += " (by Holm's p; its Bonferroni interval still contains the null)"
        return out

    def sentence(self) -> str:
        """The claim sentence a findings page carries (generated, never typed by hand)."""
        q = self.q
        what = f"{q.a} / {q.b}" if q.log else (f"{q.a} − {q.b}" if q.b else q.a)
        where = (f"at {self.budgets[0]}" if q.estimand == "at" and self.budgets else
                 f"{ESTIMANDS[q.estimand].replace('the budgets', 'budgets')} {', '.join(map(str, self.budgets))}")
        if self.note:
            return f"{q.title} ({where}): {self.note}."
        level = next((t.level for _, t in self.intervals() if t.tested), math.nan)
        p = f"Holm p = {self.p_adj:.3g}, " if self.tested else ""
        text = (f"{q.title} ({where}): {what} = {self.estimate_text()}"
                + (f" ({level:.1%} Bonferroni interval)" if math.isfinite(level) else "")
                + f", {p}n = {self.n} seeds: {self.verdict()}.")
        return text + (" Declared after the runs (post hoc)." if self.post_hoc else "")


def finite_seed_values(row: Row, metric: str) -> dict[Any, float]:
    """{seed: the row's value of ``metric``} where finite: a one-row question's contrasts (its value against 0)."""
    return {s: v for s, v in seed_values(row, metric).items() if math.isfinite(v)}


def learned(row: Row) -> Row:
    """The row with only its runs that acquired retrieval in-window (their probes measure something learned)."""
    kept = acquired_rows([row])[0]
    return kept[0] if kept else Row(row.label, row.train_length, [])


def answer(q: Question, rows: Sequence[Row], budget: str, retrieval_runs: str = "acquired") -> Answer:
    """The per-seed contrasts of a question on its rows (the family is finished by `answer_all`)."""
    ans = Answer(q)
    retrieval_runs = q.retrieval_runs or retrieval_runs
    at_a = rows_at(rows, q.a, budget)
    at_b = rows_at(rows, q.b, budget) if q.b else at_a  # one row: against 0 (its own runs stand in for b's seeds)
    names = sorted({setting_name(r, budget) for r in rows})
    for side, found in ((q.a, at_a), (q.b or q.a, at_b)):
        if not found:
            raise ReportError(f"question {q.title!r}: no row is named {side!r} (rows without {budget}: "
                              f"{', '.join(names)})")
    budgets = list(q.budgets) or sorted(set(at_a) & set(at_b), key=str)
    missing = [b for b in budgets if b not in at_a or b not in at_b]
    if missing:
        ans.note = f"not tested: no runs of both rows at {budget}={', '.join(map(str, missing))}"
        return ans
    if q.estimand == "at" and len(budgets) != 1:
        raise ReportError(f"question {q.title!r}: estimand 'at' needs one budget, the rows have "
                          f"{', '.join(map(str, budgets))}: declare budgets: [one of them]")
    ans.budgets = budgets
    per: list[dict] = []
    a = b = None
    for bud in budgets:
        a, b = at_a[bud], at_b[bud]
        if q.b and (why := unpaired_because(a, b)):
            ans.note = f"not tested: {why}"
            return ans
        if not q.log:  # retrieval: only the seeds whose runs acquired it in-window (retrieval_runs: all: every one)
            for r in (a, b) if q.b else (a,):
                if lost := sorted(set(r.seeds) - set(learned(r).seeds), key=str):
                    said = f"{r.label} seed {', '.join(map(str, lost))}"
                    if retrieval_runs == "acquired":
                        ans.left_out.append(f"{said} (retrieval not acquired in-window)")
                    else:
                        ans.not_acquired.append(said)
            if retrieval_runs == "acquired":
                a, b = (learned(a), learned(b))
        per.append(contrasts(a, b, q.metric) if q.b else finite_seed_values(a, q.metric))
    seeds = sorted(set.intersection(*(set(d) for d in per)), key=str)
    # A seed missing at one budget is left out of every budget (the seed is the unit), and said. (A mixed model over
    # the unbalanced runs was tried: with 3-4 seeds REML put the seed variance on its boundary and did not converge.)
    if partial := sorted(set.union(*(set(d) for d in per)) - set(seeds), key=str):
        ans.left_out.append(f"seed {', '.join(map(str, partial))} (not run at every declared budget)")
    ans.seeds = seeds
    ans.contrasts = np.array([[d[s] for d in per] for s in seeds]).reshape(len(seeds), len(budgets))
    ans.interaction = budget_interaction(ans.contrasts) if len(seeds) >= MIN_SEEDS else None
    if q.estimand == "at":
        ans.along = along_training(q, a, b if q.b else None, seeds)
    return ans


def along_training(q: Question, a: Row, b: Row | None, seeds: Sequence[Any]) -> dict[tuple[int, str], SeedTest]:
    """A question's contrast at each evaluation point along training of its rows' runs (`seed_points`: eval.at and
    the end), over `seeds` (the verdict's), each with its 95 % t interval over the seeds, unadjusted: whether the
    ordering still moved when training stopped. {} with fewer than two points."""
    log = log_scale(q.metric)
    pa = seed_points(a, q.metric)
    pb = seed_points(b, q.metric) if b is not None else {}
    out = {}
    for point, va in pa.items():
        vb = pb.get(point, {})
        per_seed = [va.get(s, math.nan) if b is None else contrast(va.get(s, math.nan), vb.get(s, math.nan), log)
                    for s in seeds]
        if finite := [c for c in per_seed if math.isfinite(c)]:
            out[point] = seed_test(finite)  # at LEVEL (95 %), unadjusted
    return out if len(out) > 1 else {}


def finish_answers(answers: Sequence[Answer], alpha: float) -> None:
    """Test each answer's estimand, Holm over those tested, Bonferroni intervals at 1 - alpha / m."""
    def tests(ans: Answer, level: float) -> None:
        x = ans.contrasts
        if ans.q.estimand == "every":
            ans.test = None
            ans.per_budget = {b: seed_test(x[:, k], level) for k, b in enumerate(ans.budgets)}
        else:
            ans.test = seed_test(x.mean(axis=1) if x.size else [], level)

    live = [a for a in answers if not a.note]
    for ans in live:  # the unadjusted p first (the level does not change p)
        tests(ans, 0.95)
        ans.p = (intersection_union(list(ans.per_budget.values())) if ans.q.estimand == "every" else
                 ans.test.p if ans.test is not None else math.nan)
        if ans.q.estimand == "every" and not all(t.tested for t in ans.per_budget.values()):
            ans.p = math.nan  # a budget without a test: no verdict (said by its note)
    tested = [a for a in live if math.isfinite(a.p)]
    level = bonferroni_level(len(tested), alpha)
    for ans, p in zip(tested, holm([a.p for a in tested], alpha)):
        ans.p_adj, ans.m = p, len(tested)
    for ans in live:
        tests(ans, level)


def answer_all(decl: Declaration, rows: Sequence[Row]) -> list[Answer]:
    """Every declared question answered: one family, Holm over the tested ones."""
    answers = [answer(q, rows, decl.budget, decl.retrieval_runs) for q in decl.questions]
    for a in answers:
        a.alpha, a.post_hoc = decl.alpha, decl.post_hoc
    finish_answers(answers, decl.alpha)
    return answers


def split_jobs(jobs: Sequence[Job], key: str) -> dict[str, list[Job]]:
    """The jobs by their value of the setting `key` (``across``), in the order the values first appear."""
    groups: dict[str, list[Job]] = {}
    for j in jobs:
        value = j.setting(key)
        if value is None:
            raise ReportError(f"across: {key}: {j.folder.name} has no such setting; name a setting every run has "
                              "(e.g. data.source)")
        groups.setdefault(str(value), []).append(j)
    return groups


def answer_across(decl: Declaration, jobs: Sequence[Job]) -> dict[str, list[Answer]]:
    """Every declared question answered at each value of ``decl.across``: its runs alone, one family each."""
    return {value: answer_all(decl, group_rows(js).rows) for value, js in split_jobs(jobs, decl.across).items()}


@dataclass
class Holds:
    """One question over every value of ``across``: it holds when resolved at each value in one direction (the
    intersection-union test: p = the largest of the values' Holm p)."""

    key: str
    answers: dict[str, Answer]  # value -> that value's answer

    @property
    def q(self) -> Question:
        return next(iter(self.answers.values())).q

    @property
    def p(self) -> float:
        ps = [a.p_adj for a in self.answers.values()]
        return max(ps) if all(math.isfinite(p) for p in ps) else math.nan

    def verdict(self) -> str:
        out = [v for v, a in self.answers.items() if not a.resolved]
        if out:
            return f"not resolved on every {self.key}: not at {', '.join(out)}"
        directions = {a.direction() for a in self.answers.values()}
        if len(directions) > 1:
            return f"not resolved on every {self.key}: resolved in opposite directions"
        word = "higher" if directions == {1} else "lower"
        text = f"holds on every {self.key}: {self.q.a} {word} than {self.q.b or 0}"
        return text + (" (opposite to the declared expectation)" if self.q.expected and self.q.expected != word
                       else "")

    def sentence(self) -> str:
        """The claim sentence of the question over the values (generated, never typed)."""
        parts = "; ".join(f"{self.key}={v}: {a.estimate_text()}"
                          + (f", Holm p = {a.p_adj:.3g}" if a.tested else "") + f", n = {a.n} seeds"
                          for v, a in self.answers.items())
        return f"{self.q.title}: {parts}: {self.verdict()}."


def holds(per: dict[str, list[Answer]], key: str) -> list[Holds]:
    """Question by question, its answers at every value of ``key`` (answer_across's families)."""
    values = list(per)
    return [Holds(key, {v: per[v][i] for v in values}) for i in range(len(per[values[0]]))] if values else []


# ---------------------------------------------------------------------------------------------
# earlier claims, judged


@dataclass
class Judgement:
    """An earlier claim (``retests``) and what the declared questions say of it, by the module doc's rule."""

    retest: Retest
    answer: Answer | None = None  # the retesting question's answer on the judging runs
    where: str = ""  # "data.source=stdlib" with ``across``
    elsewhere: dict[str, Answer] = field(default_factory=dict)  # the other ``across`` values' answers
    missing: str = ""  # why a retested claim has no answer to judge it by

    @property
    def power(self) -> float:
        return self.answer.power()[1] if self.answer is not None else math.nan

    @property
    def word(self) -> str:
        a = self.answer
        if self.retest.question is None:
            return "not retested"
        if a is None or a.note:
            return f"not judged: {self.missing or a.note}"
        if a.resolved:
            return "confirmed" if (a.direction() > 0) == (self.retest.direction == "higher") else "reversed"
        # not resolved: withdrawn only where its seeds had the power to find the declared smallest effect (too few
        # seeds or no spread: no power to speak of)
        return "withdrawn" if math.isfinite(self.power) and self.power >= POWER else "not confirmed (underpowered)"

    def sentence(self) -> str:
        """The judgement a findings page carries (generated, never typed by hand)."""
        r, a = self.retest, self.answer
        head = r.claim + (f" ({r.page})" if r.page else "")
        if r.question is None or a is None:
            return f"{head}: {self.word}."
        power = f", power {self.power:.0%} for its smallest effect" if math.isfinite(self.power) else ""
        where = f" at {self.where}" if self.where else ""
        text = (f"{head}: **{self.word}**. Question {r.question + 1} ({a.q.title}){where}: {a.verdict()}, "
                f"n = {a.n} seeds{power}")
        text += "".join(f"; at {k}: {b.verdict()}, n = {b.n} seeds" for k, b in self.elsewhere.items())
        return text + "."


def judge(decl: Declaration, answers: Sequence[Answer], per: dict[str, list[Answer]]) -> list[Judgement]:
    """Each ``retests`` claim judged by its question's answer (``answers``; with ``across``, ``per``'s at its ``judged_on``
    value, the other values' beside it)."""
    out = []
    for r in decl.retests:
        j = Judgement(r)
        if r.question is not None and decl.across:
            j.where = f"{decl.across}={r.judged_on}"
            j.elsewhere = {f"{decl.across}={v}": a[r.question] for v, a in per.items() if v != r.judged_on}
            if r.judged_on in per:
                j.answer = per[r.judged_on][r.question]
            else:
                j.missing = f"no runs at {j.where} (the runs: {', '.join(per) or 'none'})"
        elif r.question is not None:  # without across: the one family (answer_all answers every question)
            j.answer = answers[r.question]
        out.append(j)
    return out


# ---------------------------------------------------------------------------------------------
# planning: how many seeds


@dataclass
class Plan:
    q: Question
    sd: float  # pooled sd of per-seed contrasts of this metric
    df: int
    sd_up: float  # its one-sided 80 % upper bound
    seeds: int | None  # needed at the point estimate of sd
    seeds_up: int | None  # needed at its upper bound
    alpha: float  # per question: alpha / m


def plan(decl: Declaration, rows: Sequence[Row], power: float = POWER) -> list[Plan]:
    """Per question: the seeds needed for `power` at alpha / m (m = the declared questions) for its smallest effect,
    by the noncentral t, from the sd of per-seed contrasts pooled over every pair and budget of that metric among
    the questions (the runs at hand are the pilot). `averaged` uses that per-budget sd as is (conservative: budgets
    of one seed are correlated); `every` asks power^(1/k) at each of its k budgets."""
    answers = [answer(q, rows, decl.budget, decl.retrieval_runs) for q in decl.questions]
    m = len(decl.questions)
    alpha = decl.alpha / m
    pools: dict[str, list] = {}
    for ans in answers:
        if not ans.note and ans.contrasts.size:
            pools.setdefault(ans.q.metric, []).extend(list(ans.contrasts.T))
    out = []
    for q in decl.questions:
        sd, df = pooled_sd(pools.get(q.metric, []))
        k = len(q.budgets) if q.estimand == "every" and q.budgets else 1
        pw = power ** (1 / k)
        up = sd_upper(sd, df)
        out.append(Plan(q, sd, df, up, seeds_for_power(q.effect(), sd, alpha, pw),
                        seeds_for_power(q.effect(), up, alpha, pw), alpha))
    return out


def plan_lines(plans: Sequence[Plan], power: float = POWER) -> list[str]:
    """The plan as Markdown lines: a table and how to use it (an internal pilot)."""
    if not plans:
        return []
    lines = ["| question | smallest effect | pooled sd (df) | seeds at sd | seeds at its 80 % upper bound |",
             "|---|---|---|---|---|"]
    for p in plans:
        eff = f"{p.q.smallest_effect:g}×" if p.q.log else f"{p.q.smallest_effect:+g}"
        sd = f"{p.sd:.3g} ({p.df})" if math.isfinite(p.sd) else "— (no pilot runs)"
        lines.append(f"| {p.q.title} ({p.q.estimand}) | {eff} | {sd} | {p.seeds or '—'} | {p.seeds_up or '—'} |")
    lines += ["", (f"Seeds for {power:.0%} power at α / m = {plans[0].alpha:.3g} (two-sided one-sample t, by "
                   "scipy's noncentral t), from the sd of per-seed contrasts pooled over every pair and budget of "
                   "the metric (log ratios for perplexities). Plan it as an internal pilot: run the planned seeds, "
                   "re-estimate the pooled sd once, top up.")]
    return lines
