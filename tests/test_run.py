"""pelab.runs.training: the step a run ended at (the in-process trainer's, or under ddp_spawn, where this process's
trainer never stepped, the step of the checkpoint the ranks wrote). End to end: tests/test_ddp.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def test_final_step_is_the_trainers_or_else_the_last_checkpoints(tmp_path):
    from pelab.runs.training import final_step

    assert final_step(SimpleNamespace(global_step=12), tmp_path) == 12  # the loop ran here
    assert final_step(SimpleNamespace(global_step=0), tmp_path) == 0  # no step, no checkpoint
    (tmp_path / "checkpoints").mkdir()
    torch.save({"global_step": 40, "state_dict": {}}, tmp_path / "checkpoints" / "last.ckpt")  # what the ranks wrote
    assert final_step(SimpleNamespace(global_step=0), tmp_path) == 40
    assert final_step(SimpleNamespace(global_step=7), tmp_path) == 7  # this process's own count wins when it has one
