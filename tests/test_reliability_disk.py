"""A disk that filled before a run's first last.ckpt (issue 58): the relaunch with ckpt_path=auto continues from
the newest readable checkpoint the run did write (best.ckpt of the same validation) and says so, instead of
silently starting from step 0; with no checkpoint at all it says it starts over. Real Lightning Trainer, the
fault injected at the checkpoint write (helpers.callbacks.DiskFullAtLast)."""

from __future__ import annotations

import logging

import pytest

from helpers.runs import FAST, compose, summary_of
from pelab.tasks.train import train


def test_a_run_the_disk_stopped_before_its_first_last_ckpt_resumes_from_best_ckpt_and_says_so(tmp_path, caplog):
    out = tmp_path / "run"
    args = [*FAST, "logger=csv", "evaluate_after_fit=false", "ckpt_path=auto"]
    with pytest.raises(OSError, match="No space left on device"):
        train(compose([*args, "+callbacks.full._target_=helpers.callbacks.DiskFullAtLast"], out))
    assert summary_of(out)["status"] == "failed"
    assert (out / "checkpoints" / "best.ckpt").is_file() and not (out / "checkpoints" / "last.ckpt").exists()

    with caplog.at_level(logging.WARNING):
        summary = train(compose(args, out))
    assert "has no last.ckpt (the run stopped before writing it): continuing from best.ckpt" in caplog.text
    assert summary["status"] == "ok" and summary["resumed_from"]["ckpt_path"].endswith("best.ckpt")
    assert summary["start_step"] == 15 and summary["global_step"] == 30  # the first validation's step (debug=fast)


def test_a_relaunch_of_a_run_without_any_checkpoint_says_it_starts_over(tmp_path, caplog):
    from pelab.runs.build import resume_point

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert resume_point("auto", out, {"earlier_status": "failed", "config": {}}) == (None, None)
    assert "holds no checkpoint (the run stopped before its first one); this run starts over from step 0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resume_point("auto", tmp_path / "new", {"config": {}})  # a first launch: nothing to say
    assert "starts over" not in caplog.text
