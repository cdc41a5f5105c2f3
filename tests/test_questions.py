"""Declared questions (pelab.report.questions): each tested once over seeds, with its estimand across budgets, Holm
over the declared ones, Bonferroni intervals, the budget interaction outside the family, and the seeds a study needs
(--plan). Every number is recomputed here by hand with scipy.stats (t, nct), never by calling the module's own
helpers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from pelab import report
from pelab.errors import ReportError
from pelab.report.aggregation import group_rows
from pelab.report.cli import main as report_main
from pelab.report.discovery import find_jobs
from pelab.report.generated import report_tables
from pelab.report.questions import answer_all, load_questions, plan
from pelab.summary import write_summary

SEEDS = (0, 1, 2)
BASE = {100: [5.0, 5.5, 4.8], 400: [4.0, 4.2, 3.9]}  # ppl@1024 of the reference row per budget and seed
# log(a / ref) per budget and seed: the same sign in all six seed-runs, a size that depends on the budget
STEADY = {100: [0.30, 0.23, 0.31], 400: [0.02, 0.10, 0.01]}
MIXED = {100: [0.20, 0.25, 0.18], 400: [-0.10, -0.05, -0.12]}  # the sign flips with the budget


def run(folder: Path, pe: str, seed: int, steps: int, ppl: float, lr: float = 2e-3) -> None:
    cfg = {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed,
           "trainer": {"max_steps": steps}, "optim": {"lr": lr}}
    write_summary(folder, {"status": "ok", "config": cfg, "data": {"fingerprint": {"key": "corpus"}},
                           "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}},
                           "metrics": {"extrap/ppl@1024": ppl, "extrap/ppl@128": ppl / 2}})


@pytest.fixture
def study(tmp_path):
    for steps, base in BASE.items():
        for s in SEEDS:
            run(tmp_path / f"ref_{steps}_s{s}", "ref", s, steps, base[s])
            run(tmp_path / f"steady_{steps}_s{s}", "steady", s, steps, base[s] * math.exp(STEADY[steps][s]))
            run(tmp_path / f"mixed_{steps}_s{s}", "mixed", s, steps, base[s] * math.exp(MIXED[steps][s]))
    return tmp_path


def questions(folder: Path, body: str, declared: str = "before the runs") -> Path:
    path = folder / "questions.yaml"
    path.write_text(f"declared: {declared}\nquestions:\n{body}")
    return path


def answered(folder: Path, body: str):
    g = group_rows([j for j in find_jobs([folder]) if j.status == "ok"])
    return answer_all(load_questions(questions(folder, body)), g.rows)


def t_interval(x, level):
    x = np.asarray(x, dtype=float)
    half = scipy.stats.t.ppf(1 - (1 - level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean() - half, x.mean() + half


def test_each_estimand_is_a_t_over_seeds_with_bonferroni_intervals_and_holm(study):
    body = (
        "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: averaged, smallest_effect: 1.05}\n"
        "  - {pair: steady/ref, metric: extrap/ppl@128, budgets: [100, 400], estimand: every, smallest_effect: 1.05}\n"
        "  - {pair: mixed/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: every, smallest_effect: 1.05}\n"
        "  - {pair: mixed/ref, metric: extrap/ppl@128, budgets: [400], estimand: at, smallest_effect: 1.05}"
    )
    avg, every, flip, at = answered(study, body)
    per_seed_mean = [(STEADY[100][s] + STEADY[400][s]) / 2 for s in SEEDS]
    p = [scipy.stats.ttest_1samp(per_seed_mean, 0).pvalue,
         max(scipy.stats.ttest_1samp(STEADY[b], 0).pvalue for b in (100, 400)),  # intersection-union
         1.0,  # the budgets disagree in sign: no "at every budget" claim
         scipy.stats.ttest_1samp(MIXED[400], 0).pvalue]
    assert [a.p for a in (avg, every, flip, at)] == pytest.approx(p)
    # Holm by hand over the 4 declared questions
    order = np.argsort(p)
    adj, running = [0.0] * 4, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * p[i]))
        adj[i] = running
    assert [a.p_adj for a in (avg, every, flip, at)] == pytest.approx(adj)
    # the interval beside each verdict: a t interval over the seeds at 1 - 0.05 / 4 (per budget for `every`)
    lo, hi = t_interval(per_seed_mean, 1 - 0.05 / 4)
    assert (avg.test.lo, avg.test.hi) == pytest.approx((lo, hi))
    assert (every.per_budget[400].lo, every.per_budget[400].hi) == pytest.approx(t_interval(STEADY[400], 1 - 0.05 / 4))
    assert avg.resolved and avg.verdict().startswith("resolved: steady higher than ref")
    assert flip.verdict() == "not resolved at 3 seeds"
    # the interaction, outside the family: a t over seeds of each seed's 400-minus-100 contrast
    assert avg.interaction.p == pytest.approx(
        scipy.stats.ttest_1samp([STEADY[400][s] - STEADY[100][s] for s in SEEDS], 0).pvalue)
    assert avg.sentence().startswith(f"steady vs ref, extrap/ppl@1024 (averaged over budgets 100, 400): steady / ref "
                                     f"= {math.exp(np.mean(per_seed_mean)):.3f} [{math.exp(lo):.3f}, "
                                     f"{math.exp(hi):.3f}] (98.8% Bonferroni interval), Holm p = {adj[0]:.3g}, n = 3 "
                                     "seeds: resolved")
    # what each verdict is worth for its smallest effect: statsmodels' power of the one-sample t at alpha / 4
    from statsmodels.stats.power import TTestPower

    sd = float(np.std(per_seed_mean, ddof=1))
    want = TTestPower().power(effect_size=math.log(1.05) / sd, nobs=3, alpha=0.05 / 4, alternative="two-sided")
    got_sd, got_power, need = avg.power()
    assert (got_sd, got_power) == pytest.approx((sd, want), rel=1e-6)
    assert need == next(n for n in range(3, 10_000) if TTestPower().power(
        effect_size=math.log(1.05) / sd, nobs=n, alpha=0.05 / 4, alternative="two-sided") >= 0.8)
    per_budget = [TTestPower().power(effect_size=math.log(1.05) / np.std(STEADY[b], ddof=1), nobs=3, alpha=0.05 / 4,
                                     alternative="two-sided") for b in (100, 400)]
    assert every.power()[1] == pytest.approx(min(per_budget), rel=1e-6)  # `every`: at most its weakest budget's


def test_an_effect_of_one_sign_in_every_seed_run_is_not_called_budget_dependent(study):
    """The wave-3 rule said "depends on budget" where one budget did not resolve: here the small budget-400 gap
    alone is not resolved, but averaged over the budgets (the seed as the unit, 3 units not 6) it is, and the
    interaction says the size, not the direction, moves with the budget."""
    (avg,) = answered(study, "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], "
                             "estimand: averaged, smallest_effect: 1.05}")
    assert scipy.stats.ttest_1samp(STEADY[400], 0).pvalue > 0.05  # at 400 alone: not resolved
    assert avg.resolved and avg.interaction.tested and avg.interaction.p < 0.05


def test_too_few_seeds_and_no_spread_give_no_verdict_and_no_nan_p(tmp_path):
    for s in (0, 1):
        run(tmp_path / f"ref_s{s}", "ref", s, 100, 5.0 + s)
        run(tmp_path / f"two_s{s}", "two", s, 100, 6.0 + s)
    for s in (0, 1, 2):
        run(tmp_path / f"same_s{s}", "same", s, 100, 5.0 + s)
        run(tmp_path / f"ref_s{s}", "ref", s, 100, 5.0 + s)
    two, same = answered(tmp_path, "  - {pair: two/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1}\n"
                                   "  - {pair: same/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1}")
    assert two.verdict() == "2 paired seed(s): no between-setting verdict below 3" and not two.tested
    assert same.verdict() == "no measurable difference (the same value in both rows in every seed)"
    assert math.isnan(two.p_adj) and math.isnan(same.p_adj)
    # with nothing tested the table's caption says so, with no Holm family of 0 and no Bonferroni level to state
    from pelab.report.tables import question_table
    caption = question_table([two, same]).caption
    assert "No question could be tested here: each row says why." in caption and "Holm over" not in caption


ONE = "  - {pair: steady/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1}\nretests:\n"  # + an entry


@pytest.mark.parametrize(("body", "names"), [
    ("  - {pair: steady, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1}", "questions[0].pair"),
    ("  - {pair: steady/ref, metric: extrap/ppl, estimand: at, smallest_effect: 1.1}", "questions[0].metric"),
    ("  - {pair: steady/ref, metric: extrap/ppl@1024, estimand: mean, smallest_effect: 1.1}", "questions[0].estimand"),
    ("  - {pair: steady/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 0.9}",
     "questions[0].smallest_effect"),
    ("  - {pair: steady/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1, alpah: 1}",
     "questions[0].alpah"),
    (("  - {pair: steady/ref, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.1}\n"
     "  - {pair: ref/steady, metric: extrap/ppl_ratio@1024, estimand: at, smallest_effect: 1.1}"), "questions[1]"),
    (ONE + "  - {claim: steady below ref, question: 2, direction: lower}", "retests[0].question"),
    (ONE + "  - {claim: steady below ref, question: 1, direction: below}", "retests[0].direction"),
    (ONE + "  - {claim: steady below ref, question: 1, direction: lower, judged_on: stdlib}", "retests[0].judged_on"),
    (ONE + "  - {claim: steady below ref, direction: lower}", "retests[0].question"),
    (ONE + "  - {page: v3.md}", "retests[0].claim"),
    (ONE + "  - {claim: steady below ref, question: 1, direction: lower, on: stdlib}", "retests[0].on"),
])
def test_a_bad_questions_file_is_one_line_naming_the_key(study, capsys, body, names):
    path = questions(study, body)
    with pytest.raises(ReportError, match=rf"questions.yaml: {re.escape(names)}: "):
        load_questions(path)
    assert report_main([str(study), "--questions", str(path), "--out", str(study / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and names in err and not (study / "out").exists()  # before any reading


def test_plan_gives_the_seeds_of_the_noncentral_t_from_the_pooled_sd(study, capsys):
    """--plan: per question the seeds for 80 % power at alpha / m for the declared smallest effect, from the sd of
    per-seed contrasts pooled over every pair and budget of the metric; checked against a power computed here from
    scipy's noncentral t."""
    body = (
        "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: averaged, smallest_effect: 1.1}\n"
        "  - {pair: mixed/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: averaged, smallest_effect: 1.02}"
    )
    path = questions(study, body)
    g = group_rows(find_jobs([study]))
    p1, p2 = plan(load_questions(path), g.rows)
    groups = [STEADY[100], STEADY[400], MIXED[100], MIXED[400]]
    df = sum(len(x) - 1 for x in groups)
    sd = math.sqrt(sum(((np.asarray(x) - np.mean(x)) ** 2).sum() for x in groups) / df)
    assert (p1.sd, p1.df) == pytest.approx((sd, df))

    def power(n, effect, sd, alpha):  # two-sided one-sample t, by the noncentral t
        crit = scipy.stats.t.ppf(1 - alpha / 2, n - 1)
        nc = effect / sd * math.sqrt(n)
        return scipy.stats.nct.sf(crit, n - 1, nc) + scipy.stats.nct.cdf(-crit, n - 1, nc)

    for p, effect in ((p1, math.log(1.1)), (p2, math.log(1.02))):
        n = next(n for n in range(2, 10_000) if power(n, effect, sd, 0.05 / 2) >= 0.8)
        assert p.seeds == max(3, n)
        up = sd * math.sqrt(df / scipy.stats.chi2.ppf(0.2, df))
        assert p.seeds_up == max(3, next(n for n in range(2, 10_000) if power(n, effect, up, 0.05 / 2) >= 0.8))
    assert p2.seeds_up > p2.seeds > p1.seeds  # a smaller effect, a larger sd: more seeds
    assert report_main([str(study), "--questions", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    assert f"| {p2.seeds} | {p2.seeds_up} |" in out and "internal pilot" in out
    # an effect hundreds of sds wide: the fewest seeds already have the power (statsmodels' root search gives NaN)
    from pelab.evaluation.stats import MIN_SEEDS, seeds_for_power

    assert power(MIN_SEEDS, 0.1, 0.0007, 0.05 / 5) >= 0.8 and seeds_for_power(0.1, 0.0007, 0.05 / 5) == MIN_SEEDS
    # 6.1 sds at alpha 0.01: 3 seeds give 0.68, 4 give 0.99 (statsmodels' solver said 2, then 3 was planned); here
    # scipy's opposite tail is NaN at n = 3, so the near tail alone, within Phi(-nc) < 1e-20 of the power
    def near(n, effect, sd, alpha):
        nc = effect / sd * math.sqrt(n)
        assert scipy.stats.norm.cdf(-nc) < 1e-20
        return scipy.stats.nct.sf(scipy.stats.t.ppf(1 - alpha / 2, n - 1), n - 1, nc)

    assert near(3, 0.1, 0.01626, 0.01) < 0.8 <= near(4, 0.1, 0.01626, 0.01)
    assert seeds_for_power(0.1, 0.01626, 0.01) == 4


def test_the_report_tests_the_declared_questions_labels_post_hoc_and_warns_of_one_untuned_rate(study):
    path = questions(study, "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], "
                            "estimand: averaged, smallest_effect: 1.05}", declared="after the runs (post hoc)")
    rep = report.build_report([study], study / "out", questions=path)
    md = rep.markdown
    assert "## Declared questions" in md and "**The questions were declared after the runs (post hoc).**" in md
    assert "Declared after the runs (post hoc)." in md  # in the generated claim sentence
    assert "## Paired comparisons" not in md  # the declared questions are the family; no exploratory one beside it
    assert "every encoding trained at one learning rate (optim.lr=0.002)" in md
    table = next(t for t in rep.tables if t.title == "Budget interaction")
    assert table.rows[0][0] == "steady vs ref, extrap/ppl@1024"



def test_a_seed_missing_at_one_budget_is_left_out_of_the_average_and_said(study):
    """The seed is the unit: a seed run at 100 but not at 400 steps is left out of the averaged question, and the
    verdict says so (a mixed model over the unbalanced runs does not converge at a handful of seeds)."""
    run(study / "steady_100_s3", "steady", 3, 100, 5.0 * math.exp(0.3))
    run(study / "ref_100_s3", "ref", 3, 100, 5.0)
    (avg,) = answered(study, "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], "
                             "estimand: averaged, smallest_effect: 1.05}")
    assert avg.seeds == [0, 1, 2] and avg.verdict().endswith(
        "; left out: seed 3 (not run at every declared budget)")
    assert avg.p == pytest.approx(scipy.stats.ttest_1samp([(STEADY[100][s] + STEADY[400][s]) / 2 for s in SEEDS],
                                                          0).pvalue)


def test_retrieval_runs_all_compares_the_runs_that_missed_the_criterion_and_names_them(tmp_path):
    """A probe question compares the acquired seeds only (the others left out, named); `retrieval_runs: all` compares
    every finished run and names the ones that did not acquire the task in-window (induction heads: 0.98 in-window is
    learned, and misses the criterion of 1.000)."""
    acc = {"a": [0.70, 0.60, 0.75], "b": [0.40, 0.45, 0.30]}
    for pe, accs in acc.items():
        for s in SEEDS:
            reached = not (pe == "b" and s == 1)  # seed 1 of b never met its criterion
            cfg = {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": s,
                   "trainer": {"max_steps": 100}, "optim": {"lr": 2e-3}}
            metrics = {"probe/mqar/acc@512": accs[s], "train/retrieval_acc": 1.0 if reached else 0.98,
                       "train/steps_to_criterion": 50.0 if reached else float("nan")}
            write_summary(tmp_path / f"{pe}_s{s}", {"status": "ok", "config": cfg, "metrics": metrics,
                                                    "data": {"fingerprint": {"key": "c"}}})
    body = "  - {pair: a/b, metric: probe/mqar/acc@512, estimand: at, smallest_effect: 0.1}\n"
    g = group_rows([j for j in find_jobs([tmp_path]) if j.status == "ok"])
    acquired = answer_all(load_questions(questions(tmp_path, body)), g.rows)[0]
    assert acquired.seeds == [0, 2] and "b seed 1 (retrieval not acquired in-window)" in acquired.verdict()
    path = tmp_path / "all.yaml"
    path.write_text(f"declared: before the runs\nretrieval_runs: all\nquestions:\n{body}")
    every = answer_all(load_questions(path), g.rows)[0]
    assert every.seeds == [0, 1, 2] and not every.left_out
    np.testing.assert_allclose(every.contrasts[:, 0], np.subtract(acc["a"], acc["b"]))
    assert "not acquired in-window (retrieval_runs: all): b seed 1" in every.verdict()
    from pelab.report.figures import question_rows  # its figure: a difference of accuracies, on a linear axis

    (_, band, by), = question_rows({"": [every]})[False]
    lo, hi = t_interval(np.subtract(acc["a"], acc["b"]), 0.95)
    assert band == pytest.approx((-0.1, 0.1)) and by[""][:3] == pytest.approx((0.30, lo, hi))
    # a question's own setting overrides the file's
    path.write_text(f"declared: before the runs\nretrieval_runs: all\nquestions:\n{body[:-2]}, retrieval_runs: acquired}}\n")
    assert answer_all(load_questions(path), g.rows)[0].seeds == [0, 2]
    path.write_text(f"declared: before the runs\nretrieval_runs: some\nquestions:\n{body}")
    with pytest.raises(ReportError, match="all.yaml: retrieval_runs: one of acquired, all"):
        load_questions(path)
    # no seed of b acquired the task: no estimate, said in words in the claim (not "nan")
    for f in tmp_path.glob("b_s*/summary.json"):
        summary = json.loads(f.read_text())
        summary["metrics"].update({"train/retrieval_acc": 0.98, "train/steps_to_criterion": float("nan")})
        f.write_text(json.dumps(summary))
    path.write_text(f"declared: before the runs\nquestions:\n{body}")
    g = group_rows([j for j in find_jobs([tmp_path]) if j.status == "ok"])
    (empty,) = answer_all(load_questions(path), g.rows)
    assert empty.n == 0 and "a − b = no estimate, n = 0 seeds" in empty.sentence()


def test_a_question_of_one_row_tests_its_value_against_zero(tmp_path):
    """`pair: rope` on a difference (lim_gap: is retrieval U-shaped?): a one-sample t over its seeds, by hand with
    scipy; the same label on a perplexity is refused in one line (a ratio against 0 means nothing)."""
    gaps = [0.12, 0.20, 0.15, 0.09]
    for s, g in enumerate(gaps):
        cfg = {"pe": {"name": "rope"}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": s,
               "trainer": {"max_steps": 100}, "optim": {"lr": 2e-3}}
        write_summary(tmp_path / f"rope_s{s}", {"status": "ok", "config": cfg, "data": {"fingerprint": {"key": "c"}},
                                                "metrics": {"probe/mqar/lim_gap@128": g, "probe/mqar/acc@128": 0.9}})
    (u,) = answered(tmp_path, "  - {pair: rope, metric: probe/mqar/lim_gap@128, estimand: at, smallest_effect: 0.05, "
                              "expected: higher}")
    assert u.seeds == [0, 1, 2, 3] and u.p == pytest.approx(scipy.stats.ttest_1samp(gaps, 0).pvalue)
    assert (u.test.lo, u.test.hi) == pytest.approx(t_interval(gaps, 0.95))
    assert u.verdict() == "resolved: rope higher than 0"
    assert u.sentence().startswith("rope, probe/mqar/lim_gap@128 vs 0 (at 100): rope = +0.140")
    with pytest.raises(ReportError, match=r"questions\[0\].pair: .*one label tests that row against 0"):
        load_questions(questions(tmp_path, "  - {pair: rope, metric: extrap/ppl@1024, estimand: at, "
                                           "smallest_effect: 1.1}"))


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "experiments").rglob("questions.yaml")))
def test_every_committed_question_file_loads(path):
    """A study's declared questions are read by the tool that answers them (a file it cannot read would be found only
    when its runs are done)."""
    decl = load_questions(REPO / path)
    assert decl.questions and decl.declared


def test_across_asks_each_question_of_each_corpus_and_holds_only_where_every_corpus_resolves_it(tmp_path, capsys):
    """`across: data.source`: every question asked of each corpus's runs on their own (row labels without the
    corpus, one Holm family each); it holds on every corpus when each resolves it in one direction, with p the larger
    of the two Holm p (the intersection-union test)."""
    rng = np.random.default_rng(0)
    base = {s: 5.0 + 0.3 * s for s in range(4)}
    # log(alibi / rope): clearly below 0 on both corpora; log(nope / rope): below 0 on code only
    effects = {"stdlib": {"alibi": -0.3, "nope": -0.2}, "django_docs": {"alibi": -0.25, "nope": 0.0}}
    for corpus, eff in effects.items():
        for s in range(4):
            for pe, e in [("rope", 0.0), *eff.items()]:
                noise = 0.0 if pe == "rope" else rng.normal(0, 0.02 if e else 0.3)
                cfg = {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128, "source": corpus},
                       "seed": s, "trainer": {"max_steps": 1500}, "optim": {"lr": 2e-3}}
                write_summary(tmp_path / "runs" / f"{corpus}_{pe}_s{s}", {
                    "status": "ok", "config": cfg, "data": {"fingerprint": {"key": corpus}},
                    "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}},
                    "metrics": {"extrap/ppl@1024": base[s] * math.exp(e + noise)}})
    q = tmp_path / "questions.yaml"
    q.write_text("declared: before the runs\nacross: data.source\nquestions:\n"
                 "  - {pair: alibi/rope, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.2, expected: lower}\n"
                 "  - {pair: nope/rope, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.2}\n")
    built = report.build_report([tmp_path / "runs"], tmp_path / "out", questions=q, figures=False)
    md = built.markdown
    for corpus in effects:  # each corpus its own family, rows labelled without the corpus
        assert f"**Declared questions: verdicts (data.source={corpus})**" in md
        assert f"**Declared questions: power (data.source={corpus})**" in md
    per = {c: answer_all(load_questions(q), group_rows([j for j in find_jobs([tmp_path / "runs"])
                                                         if j.setting("data.source") == c]).rows) for c in effects}
    assert all(a.n == 4 for a in per["stdlib"]) and per["stdlib"][0].resolved and per["django_docs"][0].resolved
    assert per["stdlib"][1].resolved and not per["django_docs"][1].resolved
    table = md.split("**Declared questions: on every data.source**")[1]
    lines = [line for line in table.splitlines() if line.startswith(("| alibi", "| nope"))]
    p_both = max(per["stdlib"][0].p_adj, per["django_docs"][0].p_adj)
    assert lines[0].endswith(f"| {p_both:.3g} | holds on every data.source: alibi lower than rope |")
    assert lines[1].endswith("| not resolved on every data.source: not at django_docs |")
    claims = md.split("**Claims**")[1]
    assert "holds on every data.source: alibi lower than rope." in claims and "not at django_docs." in claims
    # --plan: each corpus's runs are their own pilot
    assert report_main([str(tmp_path / "runs"), "--questions", str(q), "--plan"]) == 0
    out = capsys.readouterr().out
    assert {line for line in out.splitlines() if line.startswith("data.source=")} == {
        "data.source=stdlib:", "data.source=django_docs:"}


def test_a_run_made_under_another_criterion_than_the_declared_one_is_refused_in_one_line(tmp_path, capsys):
    for s, threshold in [(0, 0.95), (1, 0.95), (2, 0.9)]:
        cfg = {"pe": {"name": "rope"}, "model": {"name": "recall"}, "data": {"seq_len": 128}, "seed": s,
               "trainer": {"max_steps": 1000}, "optim": {"lr": 1e-3},
               "callbacks": {"retrieval_criterion": {"kind": "mqar", "threshold": threshold, "stop": False}}}
        write_summary(tmp_path / "runs" / f"rope_s{s}", {"status": "ok", "config": cfg,
                                                          "metrics": {"probe/mqar/acc@128": 0.9}})
    body = "  - {pair: rope, metric: probe/mqar/lim_gap@128, estimand: at, smallest_effect: 0.1}\n"
    path = tmp_path / "questions.yaml"
    path.write_text("declared: before the runs\ncriterion: {kind: mqar, threshold: 0.95}\nquestions:\n" + body)
    assert load_questions(path).criterion == {"kind": "mqar", "threshold": 0.95}
    out = tmp_path / "out"
    assert report_main([str(tmp_path / "runs"), "--questions", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"pelab.report: {path}: criterion.threshold: rope_s2 ran with 0.9, the questions declare 0.95; "
                   "compare runs made under the declared criterion") and not out.exists()
    path.write_text("declared: before the runs\ncriterion: {threshold: 0.95, patience: 3}\nquestions:\n" + body)
    with pytest.raises(ReportError, match=r"questions.yaml: criterion: a mapping of every_n_steps, kind, samples, "):
        load_questions(path)


def test_rates_chosen_per_scheme_replace_the_one_rate_warning_and_a_run_at_another_rate_is_refused(study, capsys):
    """rates: each scheme's rate as chosen before the runs (here all three chose 2e-3, the fixture's rate, and one row
    is not listed): the report says so instead of warning of one untuned rate; a listed scheme's run at another rate
    is refused in one line before anything is written; a missing file names the key."""
    import json

    body = "  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [400], estimand: at, smallest_effect: 1.05}\n"
    (study / "choice.json").write_text(json.dumps({"ref": {"lr": 2e-3}, "steady": 2e-3, "other": 1e-3}))
    path = study / "questions.yaml"
    path.write_text("declared: before the runs\nrates: choice.json\nquestions:\n" + body)
    md = report.build_report([study], study / "out", questions=path, figures=False).markdown
    assert "every encoding trained at one learning rate" not in md
    assert (f"Each of ref, steady trained at the learning rate chosen for it before these runs (`choice.json`, named "
            f"by `{path}`); not chosen there: mixed (optim.lr=0.002).") in md
    (study / "choice.json").write_text(json.dumps({"ref": 1e-3, "steady": 2e-3}))
    with pytest.raises(ReportError, match=r"rates: ref_100_s0 ran at optim.lr=0.002, choice.json chose 0.001 for ref; "):
        report.build_report([study], study / "out2", questions=path)
    (study / "choice.json").write_text(json.dumps({"ref": {"stdlib": 2e-3, "django_docs": 1e-3}}))  # per corpus
    with pytest.raises(ReportError, match=r"rates: choice.json chose ref's rate for data.source in django_docs, stdlib, "
                                          r"not None \(ref_100_s0\); choose it there first"):
        report.build_report([study], study / "out2", questions=path)
    assert not (study / "out2").exists()
    path.write_text("declared: before the runs\nrates: absent.json\nquestions:\n" + body)
    assert report_main([str(study), "--questions", str(path), "--out", str(study / "out3")]) == 2
    err = capsys.readouterr().err.strip()
    assert "questions.yaml: rates: a JSON file of each scheme's chosen rate" in err and len(err.splitlines()) == 1


def test_earlier_claims_are_judged_by_the_declared_rule_at_their_corpus_with_the_power_of_its_seeds(tmp_path):
    """retests: an earlier claim is confirmed where its question resolves it in its direction, reversed where it
    resolves the other, withdrawn where it is not resolved at seeds with at least 80 % power for the declared smallest
    effect, not confirmed (underpowered) below that, not retested without a question; judged on the corpus `on`
    names, the other corpus's verdict beside it. The powers are recomputed here with scipy's noncentral t."""
    base = [5.0, 5.4, 4.7, 5.2]
    # log(row / rope) per seed on the judging corpus (stdlib); django_docs: every row 0.3 above rope, steadily
    code = {"alibi": [-0.30, -0.28, -0.33, -0.31], "nope": [0.30, 0.28, 0.33, 0.31],
            "fire": [0.030, -0.035, 0.020, -0.015], "t5_bias": [0.30, -0.25, 0.28, -0.32]}
    for corpus in ("stdlib", "django_docs"):
        for s in range(4):
            for pe, c in [("rope", [0.0] * 4), *code.items()]:
                e = c[s] if corpus == "stdlib" else (0.0 if pe == "rope" else 0.3 + 0.01 * s)
                cfg = {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128, "source": corpus},
                       "seed": s, "trainer": {"max_steps": 1500}, "optim": {"lr": 2e-3}}
                write_summary(tmp_path / "runs" / f"{corpus}_{pe}_s{s}", {
                    "status": "ok", "config": cfg, "data": {"fingerprint": {"key": corpus}},
                    "evaluation": {"extrapolation": {"split": "test", "seed": 0, "blocks": 8}},
                    "metrics": {"extrap/ppl@1024": base[s] * math.exp(e)}})
    q = tmp_path / "questions.yaml"
    q.write_text("declared: before the runs\nacross: data.source\nquestions:\n" + "".join(
        f"  - {{pair: {pe}/rope, metric: extrap/ppl@1024, estimand: at, smallest_effect: 1.2}}\n" for pe in code)
        + "retests:\n"
        "  - {claim: ALiBi below RoPE, page: v3.md, question: 1, direction: lower, judged_on: stdlib}\n"
        "  - {claim: NoPE below RoPE, page: v3.md, question: 2, direction: lower, judged_on: stdlib}\n"
        "  - {claim: FIRE above RoPE, page: v3.md, question: 3, direction: higher, judged_on: stdlib}\n"
        "  - {claim: T5 above RoPE, page: v3.md, question: 4, direction: higher, judged_on: stdlib}\n"
        "  - {claim: sinusoidal above RoPE at L, page: v3.md}\n")

    def power(contrasts, m=4, alpha=0.05):  # two-sided one-sample t at alpha / m, the smallest effect log 1.2
        x = np.asarray(contrasts)
        df, ncp = x.size - 1, math.log(1.2) / x.std(ddof=1) * math.sqrt(x.size)
        crit = scipy.stats.t.ppf(1 - alpha / m / 2, df)
        # the far tail: negligible here, and NaN from scipy this far from the effect
        return scipy.stats.nct.sf(crit, df, ncp) + np.nan_to_num(scipy.stats.nct.cdf(-crit, df, ncp))

    assert power(code["fire"]) > 0.8 > power(code["t5_bias"])
    md = report.build_report([tmp_path / "runs"], tmp_path / "out", questions=q, figures=False).markdown
    table = [line for line in md.split("## Earlier claims, judged")[1].split("\n## ")[0].splitlines()
             if line.startswith("| ")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[1:]]
    assert [r[0] for r in rows] == ["ALiBi below RoPE", "NoPE below RoPE", "FIRE above RoPE", "T5 above RoPE",
                                    "sinusoidal above RoPE at L"]
    assert [r[-1] for r in rows] == ["confirmed", "reversed", "withdrawn", "not confirmed (underpowered)",
                                     "not retested"]
    assert rows[0][2] == "1 (data.source=stdlib)" and rows[0][3] == "resolved: alibi lower than rope (4 seeds)"
    assert rows[2][4] == f"{power(code['fire']):.0%}" and rows[3][4] == f"{power(code['t5_bias']):.0%}"
    # the other corpus beside it: there every row is resolved above rope (FIRE's claim would hold there)
    assert rows[2][5] == "resolved: fire higher than rope (4 seeds)" and rows[4][5] == "—"
    judged = md.split("**Judgements**")[1]
    assert ("- NoPE below RoPE (v3.md): **reversed**. Question 2 (nope vs rope, extrap/ppl@1024) at "
            "data.source=stdlib: resolved: nope higher than rope, n = 4 seeds, power ") in judged
    assert "- sinusoidal above RoPE at L (v3.md): not retested." in judged
    # a findings page's generated block can quote both (pelab.report.generated refills titled tables and lists)
    assert {"Earlier claims, judged by the declared rule", "Judgements"} <= set(report_tables(md))
    # a judging corpus without runs is said, not judged
    q.write_text(q.read_text().replace("judged_on: stdlib}\n  - {claim: NoPE", "judged_on: wikitext}\n  - {claim: NoPE"))
    md = report.build_report([tmp_path / "runs"], tmp_path / "out2", questions=q, figures=False).markdown
    assert ("ALiBi below RoPE (v3.md): not judged: no runs at data.source=wikitext (the runs: "
            "django_docs, stdlib).") in md


def test_a_question_at_one_budget_shows_its_contrast_at_each_point_along_training(tmp_path):
    """The along-training evidence of whether an ordering still moves: per evaluation point (eval.at and the end) the
    contrast over the verdict's seeds and its 95% t interval, recomputed here with scipy; the end column is the
    verdict's own estimate, and a question whose runs were evaluated at the end only has no row."""
    tokens = (1000, 2000, 4000)
    ref = {0: [9.0, 7.0, 5.0], 1: [9.5, 7.2, 5.5], 2: [8.8, 6.9, 4.8]}  # ppl@1024 per seed at each point
    late = {0: [0.20, 0.05, -0.15], 1: [0.25, 0.02, -0.12], 2: [0.18, 0.08, -0.20]}  # log(late / ref): a flip

    def along_run(folder: Path, pe: str, seed: int, ppls: list[float] | None) -> None:
        run(folder, pe, seed, 100, ppls[-1] if ppls else 4.0)
        if ppls:
            summary = json.loads((folder / "summary.json").read_text())
            summary["along_training"] = [
                {"tokens_seen": t, "schedule": "end" if t == tokens[-1] else "mid-schedule",
                 "metrics": {"extrap/ppl@1024": v, "extrap/ppl@128": v / 2}} for t, v in zip(tokens, ppls)]
            write_summary(folder, summary)

    for s in SEEDS:
        along_run(tmp_path / f"ref_s{s}", "ref", s, ref[s])
        along_run(tmp_path / f"late_s{s}", "late", s, [r * math.exp(c) for r, c in zip(ref[s], late[s])])
        along_run(tmp_path / f"plain_s{s}", "plain", s, None)  # no eval.at: the end only
    along_run(tmp_path / "late_s3", "late", 3, [5.0, 4.0, 3.0])  # no reference run: not one of the verdict's seeds
    body = ("  - {pair: late/ref, metric: extrap/ppl@1024, budgets: [100], estimand: at, smallest_effect: 1.05}\n"
            "  - {pair: plain/ref, metric: extrap/ppl@1024, budgets: [100], estimand: at, smallest_effect: 1.05}")
    flip, plain = answered(tmp_path, body)
    assert flip.seeds == [0, 1, 2] and plain.along == {}
    assert [p for p in flip.along] == [(1000, "mid-schedule"), (2000, "mid-schedule"), (4000, "end")]
    for k, point in enumerate(flip.along.values()):
        x = [late[s][k] for s in SEEDS]
        lo, hi = t_interval(x, 0.95)
        assert point.n == 3 and point.estimate == pytest.approx(np.mean(x))
        assert (point.lo, point.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert flip.along[(4000, "end")].estimate == pytest.approx(flip.test.estimate)  # the verdict's estimate
    rep = report.build_report([tmp_path], tmp_path / "out", questions=questions(tmp_path, body), figures=False)
    table = next(t for t in rep.tables if t.title == "Declared questions along training")
    assert table.columns == ["question", "0.001M", "0.002M", "0.004M end"]
    (row,) = table.rows
    first = math.exp(np.mean(late[0][:1] + late[1][:1] + late[2][:1]))
    assert row[0] == "late vs ref, extrap/ppl@1024" and row[1].startswith(f"{first:.3f} [") and row[1].endswith("(n = 3)")


def test_the_questions_figure_draws_each_verdicts_interval_on_the_natural_scale(study, tmp_path):
    """The forest plot beside the verdict tables: each question's estimate and Bonferroni interval as a ratio (exp of
    the log-ratio t interval), a row per budget for `every`, filled only where resolved, the smallest effect's band."""
    from pelab.evaluation.plots import plot_intervals
    from pelab.report.figures import question_rows

    body = ("  - {pair: steady/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: averaged, smallest_effect: 1.05}\n"
            "  - {pair: mixed/ref, metric: extrap/ppl@1024, budgets: [100, 400], estimand: every, smallest_effect: 1.05}\n")
    avg, flip = answered(study, body)
    rows = question_rows({"": [avg, flip]})[True]  # log-scale metrics only: no difference panel
    per_seed_mean = [(STEADY[100][s] + STEADY[400][s]) / 2 for s in SEEDS]
    lo, hi = t_interval(per_seed_mean, 1 - 0.05 / 2)
    (label, band, by), *budgets = rows
    assert label == "steady vs ref, extrap/ppl@1024" and band == pytest.approx((1 / 1.05, 1.05))
    assert by[""] == pytest.approx((math.exp(np.mean(per_seed_mean)), math.exp(lo), math.exp(hi), True))
    assert [b[0] for b in budgets] == ["mixed vs ref, extrap/ppl@1024 (100)", "mixed vs ref, extrap/ppl@1024 (400)"]
    lo400, hi400 = t_interval(MIXED[400], 1 - 0.05 / 2)
    assert budgets[1][2][""][1:] == pytest.approx((math.exp(lo400), math.exp(hi400), False))
    ax = plot_intervals(rows, "t", "x", log=True).axes[0]
    assert ax.get_xscale() == "log"
    bars = sorted(tuple(line.get_xdata()) for line in ax.lines if line.get_marker() in ("None", "", None)
                  and len(set(line.get_xdata())) == 2)  # the interval bars (the no-difference line has one x)
    want = sorted([(math.exp(lo), math.exp(hi)), (math.exp(lo400), math.exp(hi400)),
                   tuple(math.exp(x) for x in t_interval(MIXED[100], 1 - 0.05 / 2))])
    assert np.allclose(bars, want)
    faces = [line.get_markerfacecolor() for line in ax.lines if line.get_marker() not in ("None", "", None)]
    assert faces.count("white") == 2  # the two budgets of the unresolved question are hollow
    # the report draws it and says so beside the verdicts
    built = report.build_report([study], tmp_path / "out", questions=questions(tmp_path, body))
    assert "![questions_ratio](questions_ratio.png)" in built.markdown and "filled where resolved" in built.markdown
    assert (tmp_path / "out" / "questions_ratio.png").stat().st_size > 0
