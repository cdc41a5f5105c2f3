"""One run per folder (pelab.runs.folder): a folder held by a live job refuses a second launch naming the
holder, a dead holder's lock and its killed writes are cleared, a fresh launch over a finished run is refused;
which checkpoint ckpt_path names (auto, a run folder, a file).

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
    from pelab.runs.folder import LOCK, claim

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


@pytest.mark.slow
def test_an_evaluation_holds_its_folder_as_a_training_run_does(tmp_path, trained_run, monkeypatch):
    """eval.py into a folder a live job holds is refused naming the holder, before it writes anything; while it runs
    the folder is its own (so `report progress` counts it running, not stopped), and it lets go when done."""
    from pelab.errors import ConfigError
    from pelab.runs.folder import LOCK
    from pelab.tasks.evaluate import evaluate

    run, _ = trained_run
    args = [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "logger=csv", "eval.lengths=[1]", "eval.tokens=512",
            "probes.lengths=[1]"]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(f"{sleeper.pid}\n")
        with pytest.raises(ConfigError, match=rf"in use by a running job \(pid {sleeper.pid}\)"):
            evaluate(compose(args, tmp_path, config_name="eval"))
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # nothing written beside the holder's lock
    finally:
        sleeper.kill()
        sleeper.wait()
    import pelab.tasks.evaluate as ev

    held, real = [], ev.run_task

    def watching(folder, **kw):  # what the folder holds while the evaluation runs
        held.append((folder / LOCK).read_text().split()[0])
        return real(folder, **kw)

    monkeypatch.setattr(ev, "run_task", watching)
    assert evaluate(compose(args, tmp_path, config_name="eval"))["status"] == "ok"
    assert held == [str(os.getpid())] and not (tmp_path / LOCK).exists()


@pytest.mark.slow
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


# -- the decisions, unit by unit (milliseconds: a real composed config, files on disk, real processes) --------
@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    """A resolved training config (FAST), as summary.json records it and a relaunch compares it."""
    import pelab.tasks.names  # noqa: F401  the resolver of the run name
    from pelab.tasks.task import resolved_config

    return resolved_config(compose(FAST, tmp_path_factory.mktemp("config")))


def finished_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_pid_alive_is_true_for_a_live_process_and_false_for_an_ended_one():
    from pelab.runs.folder import pid_alive

    assert pid_alive(os.getpid())
    assert not pid_alive(finished_pid())


def test_remove_stale_temp_files_removes_the_writes_of_dead_processes_only(tmp_path):
    from pelab.runs.folder import remove_stale_temp_files

    assert remove_stale_temp_files(tmp_path / "no-such-folder") == []
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    dead = ckpts / f".last.ckpt.tmp-{finished_pid()}"  # a killed writer's half checkpoint
    unnamed = ckpts / ".best.ckpt.tmp-x"  # no pid: nobody can be writing it
    summary_tmp = tmp_path / "summary.json.tmp"  # a killed summary write
    live = ckpts / f".last.ckpt.tmp-{os.getpid()}"  # a write under way (this process)
    kept = [ckpts / "last.ckpt", tmp_path / "summary.json", live]
    for path in (dead, unnamed, summary_tmp, *kept):
        path.write_bytes(b"x")
    assert sorted(remove_stale_temp_files(tmp_path)) == sorted([dead, unnamed, summary_tmp])
    assert all(p.exists() for p in kept) and not any(p.exists() for p in (dead, unnamed, summary_tmp))
    assert remove_stale_temp_files(tmp_path) == []  # nothing left to remove


@pytest.mark.slow
def test_a_run_recorded_before_optim_named_its_target_resumes(tmp_path):
    """optim._target_ is a key the committed runs and their checkpoints lack: a relaunch with ckpt_path=auto into
    such a run's folder continues it (a key only one side has is no changed setting)."""
    import json

    import torch

    args = [*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.val_check_interval=10"]
    train(compose([*args, "trainer.max_steps=10"], tmp_path))
    summary = tmp_path / "summary.json"
    record = json.loads(summary.read_text())
    del record["config"]["optim"]["_target_"]
    summary.write_text(json.dumps(record))
    for path in (tmp_path / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        del ckpt["hyper_parameters"]["cfg"]["optim"]["_target_"]
        torch.save(ckpt, path)
    resumed = train(compose([*args, "trainer.max_steps=12", "ckpt_path=auto"], tmp_path))
    assert resumed["status"] == "ok" and resumed["global_step"] == 12 and resumed["resumed_from"]["step"] == 10


def test_changed_settings_lists_the_defining_differences_only(config):
    import copy

    from pelab.runs.folder import changed_settings

    assert changed_settings(config, config) == []
    now = copy.deepcopy(config)
    now["optim"]["lr"] = 0.01
    now["data"]["seq_len"] = 64
    now["seed"] = 3
    now["tokenizer"]["kind"] = "bpe"
    # not defining: how long to train, how to validate, dropout / the attention kernel, data loading, new keys
    now["trainer"]["max_steps"] = 999
    now["data"]["val_windows"] = 4
    now["model"]["dropout"] = 0.3
    now["model"]["attn_backend"] = "flex"
    now["data"]["recall_kinds"] = ["mqar"]  # no recall rows on either side (recall_mix 0): acts on nothing
    now["model"]["added_since"] = 1
    assert changed_settings(config, now) == [
        "tokenizer.kind='byte' before but 'bpe' now", "data.seq_len=32 before but 64 now",
        "optim.lr=0.002 before but 0.01 now", "seed=0 before but 3 now"]  # group order, then key order
    # with recall rows, their settings define the run
    before, after = copy.deepcopy(config), copy.deepcopy(config)
    before["data"]["recall_mix"] = after["data"]["recall_mix"] = 0.25
    after["data"]["recall_kinds"] = ["mqar"]
    assert changed_settings(before, after) == ["data.recall_kinds=['kv', 'passkey'] before but ['mqar'] now"]


def test_an_extension_childs_train_length_filled_from_its_parent_is_no_change(config):
    import copy

    from pelab.runs.folder import changed_settings, filled_from_parent

    ran = copy.deepcopy(config)  # what the child recorded: null filled with the parent's 32
    ran["extend"]["parent"] = {"train_length": 32}
    ran["pe"]["train_length"] = 32
    relaunch = copy.deepcopy(config)  # the same command again: null
    relaunch["pe"]["train_length"] = None
    assert filled_from_parent(ran, relaunch) == {("pe", "train_length")}
    assert changed_settings(ran, relaunch) == []
    relaunch["pe"]["train_length"] = 64  # set by hand: a change
    assert filled_from_parent(ran, relaunch) == set()
    assert changed_settings(ran, relaunch) == ["pe.train_length=32 before but 64 now"]
    no_parent = copy.deepcopy(ran)
    no_parent["extend"]["parent"] = None
    relaunch["pe"]["train_length"] = None
    assert changed_settings(no_parent, relaunch) == ["pe.train_length=32 before but None now"]


def test_relaunch_decision(config, tmp_path):
    """new / continue / skip, and the two refusals, from the folder's summary and checkpoints."""
    import copy

    from pelab.errors import ConfigError
    from pelab.runs.folder import relaunch_decision

    def decide(earlier: dict, ckpt_path: str | None = None, multirun: bool = False, now: dict = config) -> str:
        return relaunch_decision(tmp_path, now, earlier, ckpt_path, multirun)

    ok = {"status": "ok", "global_step": 10, "config": config}
    # nothing trained there: a fresh run, whatever the launch says
    assert decide({}) == decide({}, "auto", True) == "new"
    assert decide({"status": "failed", "config": config}) == "new"  # e.g. stopped on a bad setting
    # the same settings: a multirun skips a finished job and continues an unfinished one
    assert decide(ok, multirun=True) == "skip"
    assert decide({**ok, "status": "running"}, multirun=True) == "continue"
    # a single run continues only when asked to; a fresh start would overwrite it
    assert decide(ok, "auto") == "continue"
    for fresh in (None, "", "null"):
        with pytest.raises(ConfigError, match=r"holds a run \(ok, step 10\): relaunch with ckpt_path=auto"):
            decide(ok, fresh)
    # a killed run that left only a checkpoint (no step recorded) is still a run
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    killed = {"status": "running", "config": config}
    assert decide(killed, "auto") == "continue"
    with pytest.raises(ConfigError, match=r"holds a run \(running, step 0\)"):
        decide(killed)
    # other defining settings: refused, the first three named
    other = copy.deepcopy(config)
    other["optim"]["lr"], other["optim"]["weight_decay"], other["seed"] = 0.01, 0.0, 1
    other["model"]["d_model"], other["data"]["seq_len"] = 64, 16
    with pytest.raises(ConfigError, match=r"holds a run with other settings: model\.d_model=32 before but 64 now; "
                                          r"data\.seq_len=32 before but 16 now; optim\.lr=0\.002 before but 0\.01 now "
                                          r"\(\+2 more\)\."):
        decide(ok, "auto", True, now=other)


# -- checkpoints in a run folder (ckpt_path=auto, a run folder, a file) ------------------------------------------
def test_newest_checkpoint_is_the_newest_of_last_ckpt_and_the_requeue_checkpoints(tmp_path):
    from pelab.runs.folder import newest_checkpoint

    assert newest_checkpoint(tmp_path / "no-such-run") is None
    (tmp_path / "checkpoints").mkdir()
    assert newest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / "last.ckpt").mkdir()  # not a file
    assert newest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / "last.ckpt").rmdir()
    (tmp_path / "checkpoints" / "best.ckpt").write_bytes(b"x")  # resumed from only without last.ckpt (below)
    last, old, new = tmp_path / "checkpoints" / "last.ckpt", tmp_path / "hpc_ckpt_1.ckpt", tmp_path / "hpc_ckpt_2.ckpt"
    for path, mtime in ((last, 2_000_000), (old, 1_000_000), (new, 3_000_000)):
        path.write_bytes(b"x")
        os.utime(path, (mtime, mtime))
    assert newest_checkpoint(tmp_path) == new  # Lightning's SLURM requeue checkpoint, newer than last.ckpt
    os.utime(last, (4_000_000, 4_000_000))  # last.ckpt written after the requeue checkpoints
    assert newest_checkpoint(tmp_path) == last


def test_resolve_ckpt_path_auto_a_run_folder_or_a_file(tmp_path):
    import torch

    from pelab.errors import CheckpointError, ConfigError
    from pelab.runs.folder import resolve_ckpt_path

    run = tmp_path / "run"
    for fresh in (None, "", "null"):
        assert resolve_ckpt_path(fresh, run) is None
    assert resolve_ckpt_path("auto", run) is None  # nothing saved yet (the folder need not exist): a fresh run
    with pytest.raises(ConfigError, match="is a folder without checkpoints"):
        resolve_ckpt_path(str(tmp_path), run)
    with pytest.raises(ConfigError, match=r"ckpt_path=.*nope\.ckpt does not exist"):
        resolve_ckpt_path(str(tmp_path / "nope.ckpt"), run)
    (run / "checkpoints").mkdir(parents=True)
    last = run / "checkpoints" / "last.ckpt"
    torch.save({"global_step": 10, "state_dict": {"w": torch.zeros(64)}}, last)  # a real (zip) checkpoint
    assert resolve_ckpt_path("auto", run) == str(last)
    assert resolve_ckpt_path(str(run), tmp_path / "elsewhere") == str(last)  # a run folder: its newest checkpoint
    assert resolve_ckpt_path(str(last), tmp_path / "elsewhere") == str(last)  # a file: itself
    cut = tmp_path / "cut.ckpt"  # a copy cut short: its zip directory is missing
    cut.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"ckpt_path={cut} is not a readable checkpoint"):
        resolve_ckpt_path(str(cut), run)
    requeue = run / "hpc_ckpt_1.ckpt"
    requeue.write_bytes(last.read_bytes())
    os.utime(last, (1_000_000, 1_000_000))
    assert resolve_ckpt_path("auto", run) == str(requeue)  # the newer one


# -- a folder whose run cannot be identified: refused, never treated as empty (issue 58) ----------------------
def test_an_unreadable_summary_refuses_the_launch_and_keeps_the_file(tmp_path):
    from pelab.errors import ConfigError
    from pelab.tasks.task import earlier_summary

    cut = '{"status": "ok", "global_step": 10, "config": {"se'  # a write cut short
    (tmp_path / "summary.json").write_text(cut)
    with pytest.raises(ConfigError, match=r"summary\.json cannot be read .* refused \(nothing was changed\)\. "
                                          r"Restore the file, or move it aside .* ckpt_path=auto"):
        earlier_summary(tmp_path)
    assert (tmp_path / "summary.json").read_text() == cut  # left where it is
    assert earlier_summary(tmp_path / "new") == {}


def test_checkpoints_without_a_summary_are_a_run(config, tmp_path):
    from pelab.errors import ConfigError
    from pelab.runs.folder import relaunch_decision

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.ckpt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"holds checkpoints of a run without its summary\.json: relaunch with "
                                          r"ckpt_path=auto"):
        relaunch_decision(tmp_path, config, {}, None, False)
    assert relaunch_decision(tmp_path, config, {}, "auto", False) == "continue"
    assert relaunch_decision(tmp_path, config, {}, None, True) == "continue"


def test_ckpt_path_auto_continues_only_the_checkpoints_own_settings(config, tmp_path):
    """The run folder's checkpoint is checked against the launch with its own record (the seed included):
    a seed-1 launch never continues (and relabels) seed 0's weights."""
    import copy

    import torch

    from pelab.errors import CheckpointError
    from pelab.runs.folder import check_resume_checkpoint

    last = tmp_path / "last.ckpt"
    torch.save({"global_step": 10, "state_dict": {"model.w": torch.zeros(2)},
                "hyper_parameters": {"cfg": config, "vocab_size": 260}}, last)
    other_seed = {**copy.deepcopy(config), "seed": 1}
    assert check_resume_checkpoint(str(last), config, same_run=True) == (10, 260)
    assert check_resume_checkpoint(str(last), other_seed) == (10, 260)  # a named checkpoint: weights to start from
    with pytest.raises(CheckpointError, match=r"ckpt_path=auto: .*last\.ckpt was trained with other settings: "
                                              r"seed=0 before but 1 now\. Relaunch with the checkpoint's settings"):
        check_resume_checkpoint(str(last), other_seed, same_run=True)


def test_a_run_that_stopped_before_its_first_last_ckpt_continues_from_its_newest_readable_one(tmp_path, caplog):
    """A full disk at the first last.ckpt write: best.ckpt of the same validation is the resume point, said in a
    warning; a checkpoint cut short is passed over; none at all: a fresh start (resume_point says so)."""
    import torch

    from pelab.runs.folder import newest_checkpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    best, cut = folder / "best.ckpt", folder / "step-60.ckpt"
    torch.save({"global_step": 50}, best)
    cut.write_bytes(best.read_bytes()[:100])  # newer, but cut short
    os.utime(best, (1_000_000, 1_000_000))
    with caplog.at_level("WARNING"):
        assert newest_checkpoint(tmp_path) == best
    assert "has no last.ckpt (the run stopped before writing it): continuing from best.ckpt" in caplog.text
    assert "step-60.ckpt is not readable" in caplog.text
    best.unlink()
    assert newest_checkpoint(tmp_path) is None
