"""The facts behind the findings prose (issue 49, point 5), recomputed from the committed run folders with numpy and
scipy only — no pelab.report — so a reader can check each sentence of the findings pages against the files:

    .venv/bin/python experiments/checks/prose_facts.py          # from the repository root; about a minute

Each line prints one fact and where it comes from. Conventions: a mean over seeds of a perplexity or a ratio is
the geometric mean (the log scale the paired tests use) unless a line says "arithmetic"; a retrieval difference
is per seed the mean over probe instances of (a's outcome - b's outcome), each instance first averaged over the
depths at which it was asked (as pelab.report pairs them), with a one-sample t test per seed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import scipy.stats

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"
LE = EXP / "length_extrapolation" / "v3"
LITM = EXP / "lost_in_the_middle"
CE = EXP / "context_extension" / "v3" / "runs"


def load(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def runs(root: Path) -> list[tuple[Path, dict]]:
    return [(p.parent, load(p.parent)) for p in sorted(root.rglob("summary.json"))]


def gmean(x) -> float:
    return float(np.exp(np.mean(np.log(x))))


def fmt(x, d=3) -> str:
    return " / ".join(f"{v:.{d}f}" for v in x)


def val_curve(folder: Path) -> dict[int, float]:
    """step -> val/ppl from the run's csv/metrics.csv (numpy only: the columns are read by header name)."""
    lines = (folder / "csv" / "metrics.csv").read_text().splitlines()
    head = lines[0].split(",")
    i_step, i_val = head.index("step"), head.index("val/ppl")
    out = {}
    for line in lines[1:]:
        cells = line.split(",")
        if cells[i_val]:
            out[int(cells[i_step])] = float(cells[i_val])
    return out


def section(title: str) -> None:
    print(f"\n## {title}")


# ------------------------------------------------------------------------------------------------------------
# length extrapolation v3
# ------------------------------------------------------------------------------------------------------------

def le_runs() -> dict[tuple[str, int, int], tuple[Path, dict]]:
    out = {}
    for folder, s in runs(LE / "runs"):
        c = s["config"]
        out[(c["pe"]["name"], c["trainer"]["max_steps"], c["seed"])] = (folder, s)
    return out


PES = ("nope", "sinusoidal", "rope", "t5_bias", "alibi", "fire")
PAIRS = (("sinusoidal", "rope"), ("nope", "rope"), ("fire", "alibi"), ("fire", "rope"), ("alibi", "rope"),
         ("t5_bias", "alibi"))


def le_counts(le) -> None:
    section("length_extrapolation/v3: committed runs and their cost")
    for budget in (1500, 6000):
        keys = sorted(k for k in le if k[1] == budget)
        print(f"runs at {budget} steps: {len(keys)} ({len({k[0] for k in keys})} schemes x seeds "
              f"{sorted({k[2] for k in keys})})")
        walls = [le[k][1]["wall_seconds_total"] / 60 for k in keys]
        print(f"  wall per job (wall_seconds_total): {min(walls):.1f}-{max(walls):.1f} min")
        multi = [(k[0], k[2], len(le[k][1]["launches"]), le[k][1]["wall_seconds_total"] / 60)
                 for k in keys if len(le[k][1]["launches"]) > 1]
        print(f"  jobs with more than one launch (pe, seed, launches, min): {multi}")
        mid, final, share, at = [], [], [], set()
        for k in keys:
            s = le[k][1]
            m = sum(a["seconds"] for a in s["along_training"] if a["schedule"] == "mid-schedule")
            mid.append(m)
            share.append(100 * m / s["wall_seconds_total"])
            final.append(s["evaluation"]["seconds"]["extrapolation"] / 60)
            at |= {(a["step"], a["fraction"]) for a in s["along_training"] if a["schedule"] == "mid-schedule"}
        print(f"  mid-schedule evaluations (both, summed per job): {min(mid):.0f}-{max(mid):.0f} s, "
              f"{min(share):.0f}-{max(share):.0f} % of the job's wall")
        print(f"  final evaluation: {min(final):.1f}-{max(final):.1f} min")
        print(f"  mid-schedule points (step, fraction as summary.json labels it): {sorted(at)}")
        for seeds in ((0,), (1, 2)):
            w = [le[k][1]["wall_seconds_total"] / 60 for k in keys if k[2] in seeds]
            m = [sum(a["seconds"] for a in le[k][1]["along_training"] if a["schedule"] == "mid-schedule")
                 for k in keys if k[2] in seeds]
            print(f"  seeds {seeds}: wall {min(w):.1f}-{max(w):.1f} min, mid-schedule evaluations "
                  f"{min(m):.0f}-{max(m):.0f} s")


def le_convergence(le) -> None:
    section("length_extrapolation/v3: validation perplexity late in training (csv/metrics.csv, per run)")
    for budget in (1500, 6000):
        last = budget - 1
        at80 = max(s for s in val_curve(le[next(k for k in le if k[1] == budget)][0]) if s <= 0.8 * last)
        print(f"{budget} steps: the last val step <= 0.8 x {last} is step {at80}, the last "
              f"{100 * (last - at80) / budget:.0f} % of the steps (the report's Convergence table compared the end "
              f"with it before issue 49)")
        for lo_step, what in ((at80, f"step {at80} -> {last}"),):
            ch = [100 * (val_curve(le[k][0])[last] / val_curve(le[k][0])[lo_step] - 1)
                  for k in sorted(le) if k[1] == budget]
            print(f"  change {what}: {min(ch):.1f} to {max(ch):.1f} %")
        if budget == 1500:
            # the true last fifth starts at step 1200; the log has val at 999 and 1249: the nearest logged point
            # inside the last fifth is 1249 (the last 250 steps), and the value at 1199 interpolated on the log scale
            ch_1249 = [100 * (val_curve(le[k][0])[last] / val_curve(le[k][0])[1249] - 1)
                       for k in sorted(le) if k[1] == budget]
            print(f"  change step 1249 -> 1499 (the last 250 steps, inside the last fifth): "
                  f"{min(ch_1249):.1f} to {max(ch_1249):.1f} %")
            ch_int = []
            for k in sorted(le):
                if k[1] != budget:
                    continue
                c = val_curve(le[k][0])
                w = (1199 - 999) / (1249 - 999)
                v1199 = math.exp((1 - w) * math.log(c[999]) + w * math.log(c[1249]))
                ch_int.append(100 * (c[last] / v1199 - 1))
            print(f"  change step 1199 (log-interpolated between 999 and 1249) -> 1499 (the last fifth): "
                  f"{min(ch_int):.1f} to {max(ch_int):.1f} %")
    # in-window at the end of each budget (geometric means over seeds of extrap/ppl@128)
    drops = []
    for pe in PES:
        a = gmean([le[(pe, 1500, s)][1]["metrics"]["extrap/ppl@128"] for s in range(3)])
        b = gmean([le[(pe, 6000, s)][1]["metrics"]["extrap/ppl@128"] for s in range(3)])
        drops.append((pe, b, 100 * (1 - b / a)))
    print("in-window ppl@128 at 6,000 steps (geometric mean over seeds) and its fall from 1,500: "
          + ", ".join(f"{pe} {b:.2f} (-{d:.0f} %)" for pe, b, d in drops))


def le_ratios(le) -> None:
    section("length_extrapolation/v3: ppl_ratio@1024 (8 x) per seed, arithmetic vs geometric mean over seeds")
    for pe in PES:
        for budget in (1500, 6000):
            r = [le[(pe, budget, s)][1]["metrics"]["extrap/ppl_ratio@1024"] for s in range(3)]
            print(f"{pe:10s} {budget}: seeds 0/1/2 {fmt(r, 2)}; arithmetic {np.mean(r):.3f}, geometric {gmean(r):.3f}")
    section("length_extrapolation/v3: ppl_ratio@1024 along training, geometric mean over seeds "
            "(the report's 'Along training' table is the arithmetic mean)")
    for pe in PES:
        pts = defaultdict(list)
        for budget in (1500, 6000):
            for s in range(3):
                for a in le[(pe, budget, s)][1]["along_training"]:
                    pts[(a["tokens_seen"], a["schedule"] == "end")].append(a["metrics"]["extrap/ppl_ratio@1024"])
        print(f"{pe:10s} " + "; ".join(f"{t / 1e6:.2f}M{' end' if end else ''}: {gmean(v):.2f}"
                                        for (t, end), v in sorted(pts.items())))


def power_n(m: float, sd: float, alpha: float, power: float = 0.8, n_max: int = 10_000) -> int:
    """Seeds needed for a paired t test (two-sided, level alpha) to reach `power` at mean difference m and sd."""
    for n in range(2, n_max):
        df, nc = n - 1, abs(m) / sd * math.sqrt(n)
        t = scipy.stats.t.ppf(1 - alpha / 2, df)
        if scipy.stats.nct.sf(t, df, nc) + scipy.stats.nct.cdf(-t, df, nc) >= power:
            return n
    return n_max


def le_power(le) -> None:
    section("length_extrapolation/v3: seeds needed to resolve the in-window gaps (paired t, alpha 0.05/36, 80 % power)")
    print("pair @budget: per-seed ratio at 128; seeds needed at the observed sd of the log ratios (3 seeds) and at "
          "the upper end of that sd's 95 % interval (chi-square, 2 df)")
    for a, b in PAIRS:
        for budget in (1500, 6000):
            d = np.log([le[(a, budget, s)][1]["metrics"]["extrap/ppl@128"] / le[(b, budget, s)][1]["metrics"]
                        ["extrap/ppl@128"] for s in range(3)])
            sd = float(np.std(d, ddof=1))
            up = sd * math.sqrt(2 / scipy.stats.chi2.ppf(0.025, 2))
            same = "same sign in every seed" if (np.all(d > 0) or np.all(d < 0)) else "seeds differ in sign"
            print(f"{a}/{b} @{budget}: ratios {fmt(np.exp(d))} ({same}); n at sd {power_n(d.mean(), sd, 0.05 / 36)}, "
                  f"at the upper end {power_n(d.mean(), up, 0.05 / 36)}")


def le_checks() -> None:
    section("length_extrapolation/v3: the learning-rate check (seed 0, 1,500 steps; lr/ and runs/)")
    le = le_runs()
    rows = {(pe, 0.002): le[(pe, 1500, 0)][1] for pe in PES}
    for folder, s in runs(LE / "lr"):
        rows[(s["config"]["pe"]["name"], s["config"]["optim"]["lr"])] = s
    for pe in PES:
        print(f"{pe:10s} lr 1e-3 / 2e-3 / 4e-3: ppl@128 "
              + fmt([rows[(pe, lr)]["metrics"]["extrap/ppl@128"] for lr in (0.001, 0.002, 0.004)], 2)
              + "; ratio@1024 " + fmt([rows[(pe, lr)]["metrics"]["extrap/ppl_ratio@1024"] for lr in (0.001, 0.002, 0.004)], 2)
              + " (one seed each)")
    section("length_extrapolation/v3: the model.init check (kaiming / gpt2, per seed)")
    for sub, budget in (("init", 1500), ("init6000", 6000)):
        for folder, s in runs(LE / sub):
            pe, seed = s["config"]["pe"]["name"], s["config"]["seed"]
            g = le[(pe, budget, seed)][1]["metrics"]
            k = s["metrics"]
            print(f"{pe} s{seed} @{budget}: ppl@128 kaiming/gpt2 {k['extrap/ppl@128'] / g['extrap/ppl@128']:.3f}; "
                  f"ratio@1024 kaiming {k['extrap/ppl_ratio@1024']:.2f} vs gpt2 {g['extrap/ppl_ratio@1024']:.2f}")


# ------------------------------------------------------------------------------------------------------------
# retrieval outcomes (lost in the middle, context extension)
# ------------------------------------------------------------------------------------------------------------

def outcomes(probes: dict, length: int) -> np.ndarray:
    """(depths, instances) 0/1 outcomes of mqar at one length, cut to the shortest bit string."""
    cells = {r["depth"]: r["outcomes"] for r in probes["rows"] if r["kind"] == "mqar" and r["length"] == length}
    n = min(len(b) for b in cells.values())
    return np.array([[c == "1" for c in cells[d][:n]] for d in sorted(cells)], dtype=float)


def per_seed(pa: dict, pb: dict, length: int) -> tuple[float, float]:
    xa, xb = outcomes(pa, length), outcomes(pb, length)
    n = min(xa.shape[1], xb.shape[1])
    d = (xa[:, :n] - xb[:, :n]).mean(axis=0)
    return float(d.mean()), float(scipy.stats.ttest_1samp(d, 0.0).pvalue)


def show_pair(name: str, pairs: list[tuple[int, dict, dict]], length: int) -> None:
    res = [(s, *per_seed(a, b, length)) for s, a, b in pairs]
    print(f"{name} @{length}: " + "; ".join(f"seed {s} {m:+.3f} (p {p:.2g})" for s, m, p in res))


def litm() -> None:
    section("lost_in_the_middle/v3: mqar, per seed")
    by = {}
    for folder, s in runs(LITM / "v3" / "runs"):
        by[(s["config"]["pe"]["name"], s["config"]["seed"])] = s["evaluation"]["probes"]
    for length in (512, 1024):
        show_pair("xpos - rope", [(s, by[("xpos", s)], by[("rope", s)]) for s in (0, 1)], length)
        show_pair("alibi - rope", [(s, by[("alibi", s)], by[("rope", s)]) for s in (0, 1)], length)
    g = np.array(by[("t5_bias", 0)]["grids"]["mqar"]["acc"])  # (depths, lengths)
    print(f"t5_bias s0 at 1024, depths 0 ... 1 (0 = farthest from the query): {fmt(g[:, -1], 2)}")

    section("lost_in_the_middle/mixed/v3: mixed (recall_mix 0.25) vs pure text, per seed")
    mixed = {}
    for folder, s in runs(LITM / "mixed" / "v3" / "runs"):
        mixed[(s["config"]["data"]["recall_mix"], s["config"]["seed"])] = s
    for key in ("extrap/ppl@128", "extrap/ppl_ratio@1024"):
        a = [mixed[(0.25, s)]["metrics"][key] for s in range(3)]
        b = [mixed[(0, s)]["metrics"][key] for s in range(3)]
        print(f"{key}: mixed {fmt(a, 2)} (geometric {gmean(a):.2f}, arithmetic {np.mean(a):.2f}); pure text "
              f"{fmt(b, 2)} (geometric {gmean(b):.2f}, arithmetic {np.mean(b):.2f})")
    c = mixed[(0.25, 0)]["config"]
    steps, T, B = c["trainer"]["max_steps"], c["data"]["seq_len"], c["data"]["batch_size"]
    cur = sorted(c["data"]["recall_curriculum"])
    text = 0.0
    for step in range(steps):  # the share of rows that are recall, and the recall span in them (the rest is text)
        _, span, share = max((e for e in cur if e[0] <= step), key=lambda e: e[0])
        text += 1 - share * min(span, T) / T
    print(f"text tokens the mixed model trained on, relative to its pure-text twin (same batch {B} x {T}, "
          f"{steps} steps, data.recall_curriculum {cur}): {text / steps:.3f} (expected value of the rows mixed in)")


def ce() -> None:
    section("context_extension/v3: runs")
    folders = runs(CE)
    step0 = [f for f, s in folders if "evaluation/step0" in s]
    by_group = defaultdict(int)
    for f, s in folders:
        by_group[f.relative_to(CE).parts[0]] += 1
    print(f"run folders (summary.json): {len(folders)} ({dict(sorted(by_group.items()))}); training-free "
          f"evaluations inside them (evaluation/step0): {len(step0)}; in all {len(folders) + len(step0)} evaluated "
          f"settings x seeds")

    walls = defaultdict(list)
    for f, s in folders:
        walls[f.relative_to(CE).parts[0]].append((s["wall_seconds_total"] / 60, s["config"]["seed"],
                                                   s["config"]["pe"]["scaling"]["type"]))
    for group, w in sorted(walls.items()):
        long = [f"s{seed} {sc} {m:.1f} min" for m, seed, sc in w if m > 10]
        print(f"wall per run, {group}: {min(m for m, *_ in w):.1f}-{max(m for m, *_ in w):.1f} min"
              + (f" (over 10 min: {', '.join(long)}; without them "
                 f"{min(m for m, *_ in w if m <= 10):.1f}-{max(m for m, *_ in w if m <= 10):.1f})" if long else ""))

    runs_by = {}
    for f, s in folders:
        c = s["config"]
        key = (c["data"]["seq_len"], c["trainer"]["max_steps"], c["pe"]["scaling"]["type"], c["seed"])
        runs_by[key] = s
        if "evaluation/step0" in s:
            runs_by[(512, 0, c["pe"]["scaling"]["type"], c["seed"])] = {
                "evaluation": s["evaluation/step0"],
                "metrics": {k.replace("extrap/step0/", "extrap/"): v for k, v in s["metrics"].items()
                            if k.startswith("extrap/step0/")}}

    section("context_extension/v3: mqar, per seed")
    probes = lambda L, st, sc, seed: runs_by[(L, st, sc, seed)]["evaluation"]["probes"]
    for st in (50, 100):
        show_pair(f"yarn - linear, {st} steps", [(s, probes(512, st, "yarn", s), probes(512, st, "linear", s))
                                                 for s in range(3)], 2048)
    for st in (200, 400):
        show_pair(f"none - linear, {st} steps", [(s, probes(512, st, "none", s), probes(512, st, "linear", s))
                                                 for s in range(3)], 2048)

    section("context_extension/v3: perplexity, per seed (ratio first / second)")

    def ratio(a, b, L):
        r = [runs_by[a + (s,)]["metrics"][f"extrap/ppl@{L}"] / runs_by[b + (s,)]["metrics"][f"extrap/ppl@{L}"]
             for s in range(3)]
        d = np.log(r)
        t = scipy.stats.ttest_1samp(d, 0.0)
        ci = t.confidence_interval(0.95)
        return f"seeds {fmt(r)}; geometric {gmean(r):.3f} [{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}] " \
               f"(t interval over 3 seeds, unadjusted p {t.pvalue:.2g})"

    print(f"PI after 400 steps / the control after 400 steps, ppl@128: {ratio((512, 400, 'linear'), (128, 400, 'none'), 128)}")
    print(f"PI after 200 steps / the control after 200 steps, ppl@128: {ratio((512, 200, 'linear'), (128, 200, 'none'), 128)}")
    print(f"training-free PI / the unscaled parent, ppl@128: {ratio((512, 0, 'linear'), (512, 0, 'none'), 128)}")
    for st in (200, 400):
        print(f"unscaled / PI after {st} steps, ppl@512: {ratio((512, st, 'none'), (512, st, 'linear'), 512)}")
    declared = [((512, 200, "none"), (512, 200, "linear")), ((512, 400, "none"), (512, 400, "linear")),
                ((512, 50, "yarn"), (512, 50, "linear")), ((512, 100, "yarn"), (512, 100, "linear")),
                ((512, 400, "none"), (128, 400, "none")), ((512, 400, "yarn"), (128, 400, "none")),
                ((512, 0, "linear"), (512, 0, "none")), ((512, 0, "ntk"), (512, 0, "none")),
                ((512, 0, "yarn"), (512, 0, "none"))]
    same = 0
    for a, b in declared:
        for L in (128, 512, 2048):
            r = np.array([runs_by[a + (s,)]["metrics"][f"extrap/ppl@{L}"] / runs_by[b + (s,)]["metrics"][f"extrap/ppl@{L}"]
                          for s in range(3)])
            same += bool(np.all(r > 1) or np.all(r < 1))
    print(f"declared perplexity tests (9 pairs x 128/512/2048): {same} of {3 * len(declared)} have the same sign "
          f"in every seed")
    ctrl = [[runs_by[(128, st, "none", s)]["metrics"]["extrap/ppl@2048"] for s in range(3)] for st in (50, 100, 200, 400)]
    print("control ppl@2048 after 50/100/200/400 more steps (geometric over seeds): "
          + fmt([gmean(c) for c in ctrl], 2) + "; parent: "
          + f"{gmean([runs_by[(128, 900, 'none', s)]['metrics']['extrap/ppl@2048'] for s in range(3)]):.2f}")


def v2_convergence() -> None:
    section("length extrapolation v2 (peer/results/seeds/pelab_*) and the 3,000-step check: late val change")
    for root, budget in ((EXP / "peer" / "results" / "seeds", 1500),
                         (EXP / "length_extrapolation" / "v2" / "steps3000", 3000)):
        ch = []
        for p in sorted(root.glob("*/metrics.csv")) + sorted(root.glob("*/csv/metrics.csv")):
            folder = p.parent if p.parent.name != "csv" else p.parent.parent
            if root.name == "seeds" and not folder.name.startswith("pelab_"):
                continue
            lines = p.read_text().splitlines()
            head = lines[0].split(",")
            i_s, i_v = head.index("step"), head.index("val/ppl")
            c = {int(r.split(",")[i_s]): float(r.split(",")[i_v]) for r in lines[1:] if r.split(",")[i_v]}
            last = max(c)
            if last != budget - 1:
                continue
            at80 = max(s for s in c if s <= 0.8 * last)
            ch.append((folder.name, at80, 100 * (c[last] / c[at80] - 1)))
        steps80 = sorted({a for _, a, _ in ch})
        print(f"{root.relative_to(EXP)} ({budget} steps): val at step(s) {steps80} -> {budget - 1}: "
              f"{min(x for *_, x in ch):.1f} to {max(x for *_, x in ch):.1f} % over {len(ch)} runs")


if __name__ == "__main__":
    le = le_runs()
    le_counts(le)
    le_convergence(le)
    le_ratios(le)
    le_power(le)
    le_checks()
    litm()
    ce()
    v2_convergence()
