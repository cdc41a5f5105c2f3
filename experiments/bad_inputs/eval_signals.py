"""A stop during the end-of-training evaluation, measured with real signals: issue 58's 1 M-token case
(`python train.py model=micro trainer=cpu logger=none trainer.max_steps=20 'eval.lengths=[1000000]'`) signalled in
each phase of its evaluation, SIGTERM and Ctrl-C (SIGINT to the process group, as a terminal sends it). Records the
seconds from the signal to the process's exit, the exit code, summary.json's status and whether the training
metrics were kept; then a relaunch with `ckpt_path=auto` and a short evaluation, which must train nothing and end ok.

    python experiments/bad_inputs/eval_signals.py [--out experiments/bad_inputs/eval_signals.md]

Phases (the signal `delay` seconds after the line that opens them):
  short windows   the 7,813 windows of 128 tokens before the long one (1 s after "extrapolation:")
  1 M forward     inside the single 1 M-token forward (25 s after "extrapolation:": the short ones take ~5 s)
  1 M probe       inside a probe instance of 1 M tokens (`eval.lengths=[1] 'probes.lengths=[1000000]'`, 20 s
                  after "probes:")
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ["model=micro", "trainer=cpu", "logger=none", "trainer.max_steps=20", "callbacks.progress_bar=false"]
LONG_PROBE = ["eval.lengths=[1]", "probes.kinds=[passkey]", "probes.depths=[0.5]", "probes.samples=1",
              "probes.lengths=[1000000]"]
# (phase, overrides, the line that opens the phase, seconds after it)
PHASES = [
    ("short windows", ["eval.lengths=[1000000]"], "extrapolation:", 1.0),
    ("1 M forward", ["eval.lengths=[1000000]"], "extrapolation:", 25.0),
    ("1 M probe", LONG_PROBE, "probes:", 20.0),
]
SIGNALS = {"SIGTERM": (signal.SIGTERM, 75, "preempted"), "Ctrl-C": (signal.SIGINT, 130, "interrupted")}


def read_until(proc: subprocess.Popen, text: str, timeout: float = 600.0) -> None:
    t0, seen = time.monotonic(), []
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        seen.append(line)
        if not line and proc.poll() is not None:
            raise RuntimeError(f"the run ended (rc={proc.returncode}) before {text!r}:\n{''.join(seen)[-2000:]}")
        if text in line:
            return
    raise RuntimeError(f"no {text!r} in {timeout} s")


def run(phase: str, overrides: list[str], marker: str, delay: float, sig_name: str, folder: Path) -> dict:
    sig, code, status = SIGNALS[sig_name]
    out = folder / f"{phase.replace(' ', '_')}-{sig_name}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / "train.py"), *BASE, *overrides, f"hydra.run.dir={out}", "ckpt_path=auto"]
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        read_until(proc, marker)
        time.sleep(delay)
        sent = time.monotonic()
        os.killpg(proc.pid, sig)  # to the process group, as a terminal (Ctrl-C) or a scheduler sends it
        proc.communicate(timeout=300)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    kept = "val/ppl" in summary.get("metrics", {})
    # the relaunch: nothing left to train, a short evaluation, ok
    again = subprocess.run([sys.executable, str(ROOT / "train.py"), *BASE, "eval.lengths=[1]", "probes.lengths=[1]",
                            f"hydra.run.dir={out}", "ckpt_path=auto"], cwd=folder, env=env, capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
    after = json.loads((out / "summary.json").read_text())
    resumed = (again.returncode == 0 and after["status"] == "ok"
               and after.get("start_step") == after.get("global_step") == summary.get("global_step"))
    ok = proc.returncode == code and summary["status"] == status and kept and resumed
    return {"phase": phase, "signal": sig_name, "seconds": seconds, "rc": proc.returncode,
            "status": summary["status"], "kept": kept, "resumed": resumed, "verdict": "ok" if ok else "FAILED"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "experiments" / "bad_inputs" / "eval_signals.md"))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for phase, overrides, marker, delay in PHASES:
            for sig_name in SIGNALS:
                r = run(phase, overrides, marker, delay, sig_name, Path(tmp))
                rows.append(r)
                print(f"{r['verdict']:6} {r['phase']:14} {r['signal']:7} exit {r['rc']} in {r['seconds']:.2f} s, "
                      f"{r['status']}, metrics kept {r['kept']}, relaunch ok {r['resumed']}", flush=True)
    lines = ["| phase | signal | seconds to exit | exit | summary.json | training metrics kept | relaunch resumes | verdict |",
             "|---|---|---:|---:|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['signal']} | {r['seconds']:.2f} | {r['rc']} | {r['status']} | {r['kept']} | "
              f"{r['resumed']} | {r['verdict']} |" for r in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
