"""A stop inside one long forward of the end-of-training evaluation, with real signals to a real `python train.py`
(issue 58): SIGTERM inside a 150,000-token extrapolation window, then Ctrl-C (SIGINT to the process group) inside a
150,000-token probe instance of the relaunch. Each forward lasts tens of seconds on one CPU thread (the micro model,
about 5.8 TFLOP of attention); each stop must end the process within 10 s, with summary.json saying preempted /
interrupted and the training metrics kept, and the relaunch (`ckpt_path=auto`) resumes the evaluation without
training again. Before issue 58 a stop waited for the forward to return: minutes for the 1 M-token case
(experiments/bad_inputs/eval_signals.md measures that case by hand, every phase of its evaluation).
"""

from __future__ import annotations

import signal
import time

import pytest

from helpers.runs import FAST, ctrl_c, finish, launch, read_until, summary_of
from pelab.tasks.task import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE

LONG = 150_000  # tokens of the long forward
GRACE = 10.0  # seconds a stop may take (issue 58's target)
INSIDE = 3.0  # seconds after the phase's first line: past the short windows, inside the long forward


@pytest.mark.slow
def test_a_stop_inside_a_long_evaluation_forward_ends_the_run_within_seconds(tmp_path):
    out = tmp_path / "run"
    common = [*FAST, "logger=csv", "trainer.max_steps=10", "trainer.val_check_interval=10",
              f"paths.output_dir={out}", "ckpt_path=auto"]

    # SIGTERM inside the long extrapolation window (the 32-token windows before it take well under a second)
    proc = launch([*common, f"eval.lengths=[{LONG}]", "eval.protocols=[nonoverlap]", "probes.enabled=false"],
                  tmp_path)
    read_until(proc, "extrapolation:")
    time.sleep(INSIDE)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, log = finish(proc, timeout=120)
    took = time.monotonic() - sent
    print(f"SIGTERM inside a {LONG}-token window: exit {rc} in {took:.2f} s")
    assert rc == PREEMPTED_EXIT_CODE and took < GRACE, (took, log[-3000:])
    first = summary_of(out)
    assert first["status"] == "preempted" and first["global_step"] == 10
    assert first["metrics"]["val/ppl"] > 1 and "train/loss" in first["metrics"]  # the training metrics kept
    assert "Traceback" not in log and "terminate called" not in log

    # the relaunch resumes the evaluation (no step left to train); Ctrl-C inside a long probe instance
    proc = launch([*common, "eval.lengths=[1]", "probes.kinds=[passkey]", "probes.depths=[0.5]",
                   "probes.samples=1", f"probes.lengths=[{LONG}]"], tmp_path)
    read_until(proc, "probes:")
    time.sleep(INSIDE)
    sent = ctrl_c(proc)
    rc, log = finish(proc, timeout=120)
    took = time.monotonic() - sent
    print(f"Ctrl-C inside a {LONG}-token probe instance: exit {rc} in {took:.2f} s")
    assert rc == INTERRUPTED_EXIT_CODE and took < GRACE, (took, log[-3000:])
    second = summary_of(out)
    assert second["status"] == "interrupted" and second["start_step"] == second["global_step"] == 10
    assert second["metrics"]["val/ppl"] == first["metrics"]["val/ppl"]  # the training metrics kept
    assert second["interrupted"]["signal"] == signal.SIGINT
    assert "Traceback" not in log and "terminate called" not in log
