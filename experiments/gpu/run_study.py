"""The studies' GPU versions: each study's own settings, trained to >= 20 tokens per parameter for all its
schemes and seeds, several runs sharing one H200 at once, sized to finish in --minutes (default 8).

    python experiments/gpu/run_study.py length_extrapolation --out outputs/gpu   # 6 schemes x 3 seeds
    python experiments/gpu/run_study.py lost_in_the_middle --out outputs/gpu     # 9 schemes x 2 seeds, fixed budget
    python experiments/gpu/run_study.py context_extension --out outputs/gpu      # parents + 4 scalings x 2 seeds
    python experiments/gpu/run_study.py <study> --plan                           # print the commands and the sizing
    python experiments/gpu/run_study.py <study> --cpu-smoke --out /tmp/smoke     # the same machinery, tiny, on CPU

Sizing: a first short run measures this GPU's step rate for the study's model alone (--calibrate-steps), then the
step count per run is max(the study's CPU budget, 20 tokens per parameter), the runs are spread over --parallel
concurrent processes, and the plan is refused if its estimate exceeds --minutes (the concurrent runs' slowdown is
taken as --share-slowdown, 1.5 unless measured). Status: unrun (no GPU has been lent to this project yet); the
CPU smoke test runs in tests/test_benchmarks.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS_PER_PARAM = 20


@dataclass
class Study:
    name: str
    experiment: str
    schemes: list[str]
    seeds: list[int]
    cpu_steps: int  # the CPU study's budget
    params: int  # the study model's parameters (non-embedding + embedding), for the tokens-per-parameter budget
    tokens_per_step: int  # batch x length of the study's own settings
    extra: list[str] = field(default_factory=list)
    # context extension: after the parents, children fine-tuned from each at 4 x its length with each scaling, and
    # the control arm (the parent trained on at its own length for the same steps)
    child_steps: int = 0


STUDIES = {
    # d = 128, 4 layers, byte level: 0.8 M parameters; batch 16 x 128
    "length_extrapolation": Study("length_extrapolation", "length_extrapolation",
                                  ["nope", "sinusoidal", "rope", "t5_bias", "alibi", "fire"], [0, 1, 2], 6000,
                                  800_000, 16 * 128, ["probes.enabled=false", "eval.at=[0.25,0.5]"]),
    # model=recall (d = 128, 2 layers, 2 heads of 64): 0.4 M parameters; batch 32 x 128; a fixed budget, no stop
    "lost_in_the_middle": Study("lost_in_the_middle", "lost_in_the_middle",
                                ["rope", "alibi", "nope", "sinusoidal", "learned", "t5_bias", "xpos", "kerple", "fire"], [0, 1],
                                1000, 400_000, 32 * 128, ["callbacks.retrieval_criterion.stop=false"]),
    # v3: a rope parent at 128 tokens (the default run: model=recall, text + mqar rows, 900 steps) and its children
    # at 512 (none / linear / ntk / yarn, experiment=context_extension_child) plus the control arm
    "context_extension": Study("context_extension", "context_extension", ["rope"], [0, 1], 900, 400_000,
                               32 * 128, [], child_steps=400),
}


def steps_for(study: Study) -> int:
    """The larger of the CPU budget and 20 tokens per parameter."""
    return max(study.cpu_steps, math.ceil(TOKENS_PER_PARAM * study.params / study.tokens_per_step))


def commands(study: Study, steps: int, out: Path, smoke: bool) -> list[list[str]]:
    """One train.py command per (scheme, seed)."""
    # the smoke run checks the machinery, not a result: it runs from a work-in-progress tree too
    device = (["trainer=cpu", "model=micro", "data.seq_len=32", "eval.lengths=[1,2]", "eval.tokens=256",
               "eval.at=[]", "probes.enabled=false", "data.val_windows=4", "provenance.allow_dirty=true"] if smoke
              else ["trainer=gpu", "trainer.precision=bf16-mixed"])
    out_cmds = []
    for seed in study.seeds:
        for pe in study.schemes:
            folder = out / study.name / f"{pe}_s{seed}"
            out_cmds.append([sys.executable, str(ROOT / "train.py"), f"experiment={study.experiment}",
                             "hydra.mode=RUN", f"pe={pe}", f"seed={seed}", f"trainer.max_steps={steps}",
                             f"trainer.val_check_interval={max(1, steps // 4)}", "logger=csv",
                             f"hydra.run.dir={folder}", *study.extra, *device])
    return out_cmds


def child_commands(study: Study, out: Path, smoke: bool) -> list[list[str]]:
    """Context extension's second stage (experiment=context_extension_child): from each parent, none / linear /
    ntk / yarn at 4 x its length, and the control (its own length, no scaling), the same steps each."""
    steps = 3 if smoke else study.child_steps
    arms = [("control", ["data.seq_len=32" if smoke else "data.seq_len=128",
                         "data.batch_size=32", "pe.scaling.type=none", "extend.eval_before=false"])]
    for scaling in ("none", "linear", "ntk", "yarn"):
        arms.append((scaling, ["data.seq_len=128" if smoke else "data.seq_len=512", f"pe.scaling.type={scaling}"]))
    cmds = []
    for seed in study.seeds:
        parent = out / study.name / f"rope_s{seed}"
        for arm, overrides in arms:
            base = commands(study, steps, out, smoke)[0]
            base = [x for x in base if not x.startswith(("hydra.run.dir=", "seed=", "data.seq_len=", "experiment="))]
            cmds.append([*base, "experiment=context_extension_child", f"seed={seed}", f"extend.from={parent}",
                         *overrides, f"hydra.run.dir={out / study.name / 'children' / f'{arm}_s{seed}'}"])
    return cmds


def run_all(cmds: list[list[str]], parallel: int, env_threads: int) -> list[tuple[list[str], int, float]]:
    """Run the commands, `parallel` at a time; (command, exit code, seconds) each."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": str(env_threads)}

    def one(cmd: list[str]) -> tuple[list[str], int, float]:
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False).returncode
        return cmd, rc, time.perf_counter() - t0

    with cf.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, cmds))


def calibrate(study: Study, out: Path, steps: int) -> float:
    """Seconds per training step of the study's model alone on this GPU (a short run of its first scheme)."""
    cmd = commands(study, steps, out / "calibration", smoke=False)[0]
    t0 = time.perf_counter()
    subprocess.run(cmd + ["evaluate_after_fit=false"], check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=sorted(STUDIES))
    p.add_argument("--out", type=Path, default=Path("outputs/gpu"))
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--parallel", type=int, default=6, help="runs sharing the GPU at once")
    p.add_argument("--share-slowdown", type=float, default=1.5, help="a run's slowdown when --parallel share it")
    p.add_argument("--calibrate-steps", type=int, default=300)
    p.add_argument("--plan", action="store_true", help="print the plan and stop")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny runs on the CPU: the machinery, not the numbers")
    a = p.parse_args(argv)
    study = STUDIES[a.study]
    steps = 3 if a.cpu_smoke else steps_for(study)
    cmds = commands(study, steps, a.out, a.cpu_smoke)
    if a.cpu_smoke:  # the machinery on two runs (and one seed's children), not the study
        cmds, study.seeds = cmds[:2], study.seeds[:1]
    plan = {"study": study.name, "runs": len(cmds), "steps": steps,
            "tokens_per_param": round(steps * study.tokens_per_step / study.params, 1), "parallel": a.parallel}
    if a.plan:
        print(json.dumps(plan, indent=1))
        print("\n".join(" ".join(c[1:]) for c in cmds))
        return 0
    if not a.cpu_smoke:
        per_step = calibrate(study, a.out, a.calibrate_steps)
        estimate = math.ceil(len(cmds) / a.parallel) * steps * per_step * a.share_slowdown / 60
        plan.update(seconds_per_step=round(per_step, 5), estimate_minutes=round(estimate, 1))
        print(json.dumps(plan), flush=True)
        if estimate > a.minutes:
            print(f"the plan needs about {estimate:.1f} min > --minutes {a.minutes}: raise --parallel or --minutes",
                  file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    results = run_all(cmds, 2 if a.cpu_smoke else a.parallel, 1 if a.cpu_smoke else 4)
    if study.child_steps:
        children = child_commands(study, a.out, a.cpu_smoke)
        results += run_all(children[:2] if a.cpu_smoke else children, 2 if a.cpu_smoke else a.parallel,
                           1 if a.cpu_smoke else 4)
    failed = [" ".join(c[2:]) for c, rc, _ in results if rc != 0]
    plan.update(wall_minutes=round((time.perf_counter() - t0) / 60, 2), failed=failed)
    (a.out / study.name).mkdir(parents=True, exist_ok=True)
    (a.out / study.name / "plan.json").write_text(json.dumps(plan, indent=1))
    print(json.dumps(plan), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
