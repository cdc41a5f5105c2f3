"""eval.at (pelab.training.callbacks.along_training): the extrapolation evaluation at fractions of training, logged along it,
and kept across a kill and relaunch.

The end-to-end test moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import signal

import pytest

from helpers.runs import FAST, compose, csv_rows, finish, launch, load_checkpoint, summary_of, wait_until
from pelab.tasks.train import train


@pytest.mark.slow
def test_eval_at_logs_along_training_and_a_kill_between_points_keeps_the_first(tmp_path):
    """eval.at=[0.5, 1.0] on 60 steps (validation every 20): a point at step 40 (mid-schedule) and the end at 60.
    SIGKILL after the first point's checkpoint; the resumed run keeps it and adds the end."""
    out = tmp_path / "run"
    args = [*FAST, "logger=csv", "trainer.max_steps=60", "trainer.val_check_interval=20",
            "callbacks.checkpoint.every_n_steps=10", "callbacks.throughput=false", "probes.enabled=false",
            "eval.lengths=[1,2]", "eval.tokens=512", "eval.at=[0.5,1.0]", "eval.at_tokens=256", f"paths.output_dir={out}"]
    proc = launch(args, tmp_path)
    wait_until(lambda: (out / "checkpoints" / "last.ckpt").exists() and load_checkpoint(out / "checkpoints" / "last.ckpt")[
        "global_step"] >= 50, proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    killed = summary_of(out)
    assert [p["step"] for p in killed["along_training"]] == [40]
    first = killed["along_training"][0]
    # asked for half of 60 steps; run at the nearest validation step, 40 (validation every 20)
    assert first["schedule"] == "mid-schedule" and first["asked"] == 0.5 and first["fraction"] == pytest.approx(2 / 3)
    assert first["blocks"] == 4
    # The relaunch in this process (one thread, as the killed one ran: the same numbers as a subprocess, see
    # conftest's `reference`); the kill needed the real process, a CLI relaunch is tests/test_signals.py's.
    assert train(compose([*args, "ckpt_path=auto"]))["status"] == "ok"
    s = summary_of(out)
    assert [(p["step"], p["schedule"]) for p in s["along_training"]] == [(40, "mid-schedule"), (60, "end")]
    assert s["along_training"][0] == first  # kept as measured before the kill
    assert s["along_training"][1]["metrics"]["extrap/ppl@64"] == s["metrics"]["extrap/ppl@64"]
    assert s["along_training"][1]["tokens_seen"] == 60 * 8 * 32
    logged = [int(r["step"]) for r in csv_rows(out) if r.get("extrap/ppl@64")]
    validations = sorted({int(r["step"]) for r in csv_rows(out) if r.get("val/ppl")})
    assert logged == [validations[1]]  # the mid-schedule point, logged with the validation at step 40


def test_eval_at_probes_runs_the_probes_at_each_point_beside_the_perplexity(tmp_path):
    """eval.at_probes: the point at step 40 of 60 carries the probes' metrics as the end's evaluation does (the same
    keys: every kind and length, the effective length), logged with that validation; the end point is the run's own
    final metrics. The gold answer's log-probability at 40 steps is not the end's (the model moved in between). The
    points do not perturb training: the same run without them ends with the same numbers to the digit (so an arm
    with eval.at replays the runs without it)."""
    out = tmp_path / "run"
    args = [*FAST, "trainer.max_steps=60", "trainer.val_check_interval=20", "callbacks.throughput=false",
            "eval.lengths=[1,2]", "eval.tokens=512", "eval.at=[0.5]", "eval.at_probes=true", "probes.enabled=true",
            "probes.kinds=[kv]", "probes.lengths=[2,4]", "probes.depths=[0.0,1.0]", "probes.samples=8",
            f"paths.output_dir={out}"]
    assert train(compose(args))["status"] == "ok"
    s = summary_of(out)
    mid, end = s["along_training"]
    assert (mid["step"], mid["schedule"], end["schedule"]) == (40, "mid-schedule", "end")
    probe_keys = {k for k in s["metrics"] if k.startswith("probe/")}
    assert {"probe/kv/acc@64", "probe/kv/acc@128"} <= probe_keys
    assert {k for k in mid["metrics"] if k.startswith("probe/")} == probe_keys
    assert all(0.0 <= mid["metrics"][f"probe/kv/acc@{n}"] <= 1.0 for n in (64, 128))
    assert {k: end["metrics"][k] for k in probe_keys} == {k: s["metrics"][k] for k in probe_keys}
    assert all(mid["metrics"][f"probe/kv/logprob@{n}"] != s["metrics"][f"probe/kv/logprob@{n}"] for n in (64, 128))
    logged = [int(r["step"]) for r in csv_rows(out) if r.get("probe/kv/acc@64")]
    assert logged[:1] == [39]  # CSV steps count from 0: the validation that ends step 40
    plain = tmp_path / "plain"
    assert train(compose([*[a for a in args if not a.startswith(("eval.at", "paths."))],
                          f"paths.output_dir={plain}"]))["status"] == "ok"
    assert summary_of(plain)["metrics"] == s["metrics"]

def test_steps_at_puts_each_fraction_at_the_nearest_validation_before_the_end():
    """{step: fraction}: fraction x max_steps rounded to a validation step (every `every`), at least the first
    validation; 1.0 and anything landing on the last step are the end-of-training evaluation's, not a point."""
    from pelab.training.callbacks.along_training import steps_at

    assert steps_at([], 100, 10) == {} and steps_at([1.0], 100, 10) == {}
    assert steps_at([0.9, 0.1, 0.5, 1.0], 100, 10) == {10: 0.1, 50: 0.5, 90: 0.9}
    assert steps_at([0.5], 60, 20) == {40: 0.5}  # 30 is no validation step; 20 and 40 tie: 40 (the e2e test above)
    assert steps_at([0.5], 100, 20) == {60: 0.5}  # a tie goes to the later step whatever the count (round(): 40)
    assert steps_at([0.25], 1500, 250) == {500: 0.25}  # v3's quarter: 375 ties 250 / 500, run at a third
    assert steps_at([0.01], 100, 10) == {10: 0.01}  # never before the first validation
    assert steps_at([0.97], 100, 10) == {}  # rounds to the last step: that is the end evaluation
    assert steps_at([0.52, 0.5], 100, 10) == {50: 0.5}  # two fractions on one step: the smaller one names it
    assert steps_at([0.5], 10, 20) == {}  # validation only at the end
