"""Context extension study v3 (experiments/context_extension/v3/README.md): per seed, a rope parent at L = 128
(experiment=context_extension, the default run), then from its weights

  - the four scalings (none / linear = PI / ntk / yarn, factor 4) fine-tuned at 512 tokens for each of --steps
    fine-tuning steps (separate runs: each step count is the end of its own schedule), the longest run also
    scoring the parent's weights under its scaling before the first step (the "training-free" row, step 0);
  - the control arm: the parent trained on for the same steps at its own length (no scaling).

Each seed is one stream of jobs (parent, then its children); --workers streams run side by side. A relaunch with
the same --out skips what finished and resumes what was interrupted (every job is a multirun job: the sweep's own
skip). Then the report reads the folder:

    OMP_NUM_THREADS=1 python experiments/context_extension/v3/run.py --out outputs/context_extension_v3
    python -m pelab.report outputs/context_extension_v3 --out experiments/context_extension/v3/report

Extra arguments after `--` go to every train.py command (e.g. `-- model=micro` for a smoke run).
The v2 study (one seed, text only, no control) ran with this script at commit 723b496.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCALINGS = "none,linear,ntk,yarn"
CONTROL = ["data.seq_len=128", "data.batch_size=32", "pe.scaling.type=none"]  # the parent's length and batch


def train(args: list[str], log: Path) -> None:
    """One train.py launch, its output appended to `log`; raises on failure (the stream stops, the others go on)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *args]
    with log.open("a") as fh:
        fh.write("+ " + " ".join(cmd[1:]) + "\n")
        fh.flush()
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT)


def stream(out: Path, seed: int, steps: list[int], extra: list[str]) -> str:
    """Parent, the scalings at the longest budget (with the training-free evaluation), the shorter budgets, the
    control arm: one seed's jobs in order."""
    t0 = time.time()
    log = out / f"s{seed}.log"
    parent = out / "parents" / f"s{seed}"
    # a one-job multirun into that folder: a relaunch skips it once finished, as it skips the children
    train(["-m", "experiment=context_extension", f"seed={seed}", f"hydra.sweep.dir={parent.parent}",
           f"hydra.sweep.subdir={parent.name}", *extra], log)
    child = ["experiment=context_extension_child", f"extend.from={parent}", f"seed={seed}"]
    longest, shorter = max(steps), sorted(set(steps) - {max(steps)})
    train([*child, f"trainer.max_steps={longest}", f"hydra.sweep.dir={out / 'children' / f's{seed}'}", *extra], log)
    if shorter:
        train([*child, "trainer.max_steps=" + ",".join(map(str, shorter)), "extend.eval_before=false",
               f"hydra.sweep.dir={out / 'curve' / f's{seed}'}", *extra], log)
    train([*child, *CONTROL, "trainer.max_steps=" + ",".join(map(str, sorted(set(steps)))),
           "extend.eval_before=false", f"hydra.sweep.dir={out / 'control' / f's{seed}'}", *extra], log)
    return f"seed {seed}: {time.time() - t0:.0f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "context_extension_v3")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, nargs="+", default=[50, 100, 200, 400])
    p.add_argument("--workers", type=int, default=2, help="seeds run side by side (one thread each: OMP_NUM_THREADS)")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with cf.ThreadPoolExecutor(args.workers) as pool:
        futures = {pool.submit(stream, out, s, args.steps, extra): s for s in args.seeds}
        for f in cf.as_completed(futures):
            try:
                print(f.result(), flush=True)
            except subprocess.CalledProcessError as err:
                failed += 1
                print(f"seed {futures[f]}: {' '.join(err.cmd[1:3])} failed (exit {err.returncode}); "
                      f"see {out / f's{futures[f]}.log'}", flush=True)
    print(f"report: python -m pelab.report {out} --out <report folder>")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
