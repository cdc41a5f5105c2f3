"""One run per folder (pelab.harness.run_folder): a folder held by a live job refuses a second launch naming the
holder, a dead holder's lock and its killed writes are cleared, a fresh launch over a finished run is refused.

The end-to-end tests moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.runs import FAST, compose, summary_of
from pelab.tasks.train import train


def test_a_second_launch_into_a_held_folder_is_refused_naming_the_holder(tmp_path):
    from pelab.errors import ConfigError
    from pelab.harness.run_folder import LOCK, claim

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(f"{sleeper.pid}\n")  # a live job holds it
        with pytest.raises(ConfigError, match=rf"in use by a running job \(pid {sleeper.pid}\)"):
            train(compose([*FAST, "logger=csv"], tmp_path))
        assert not (tmp_path / "summary.json").exists()  # refused before anything was written
    finally:
        sleeper.kill()
        sleeper.wait()
    # a dead holder's lock does not keep the folder; the killed writes it left are removed
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".last.ckpt.tmp-{sleeper.pid}"
    stale.write_bytes(b"half a checkpoint")
    with claim(tmp_path):
        assert (tmp_path / LOCK).read_text().split()[0] == str(os.getpid()) and not stale.exists()
    assert not (tmp_path / LOCK).exists()


def test_a_fresh_launch_over_a_run_is_refused_and_keeps_it(tmp_path):
    from pelab.errors import ConfigError

    args = [*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=10", "trainer.val_check_interval=10"]
    first = train(compose(args, tmp_path))
    with pytest.raises(ConfigError, match="holds a run .* relaunch with ckpt_path=auto"):
        train(compose(args, tmp_path))
    with pytest.raises(ConfigError, match="other settings: data.seq_len=32 before but 16 now"):
        train(compose([*args, "data.seq_len=16", "ckpt_path=auto"], tmp_path))
    assert summary_of(tmp_path)["metrics"] == first["metrics"]  # nothing overwritten
    # a relaunch that fails keeps what the run had measured, its failure recorded beside it
    with pytest.raises(ConfigError, match="eval.lengths"):
        train(compose([*args, "ckpt_path=auto", "eval.lengths=[0]"], tmp_path))
    failed = summary_of(tmp_path)
    assert failed["status"] == "failed" and "eval.lengths" in failed["error"] and failed["earlier_status"] == "ok"
    assert failed["metrics"] == first["metrics"] and failed["global_step"] == 10
    assert [x["status"] for x in failed["launches"]] == ["ok", "failed"]
