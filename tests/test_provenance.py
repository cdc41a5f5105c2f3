"""pelab.provenance: the commit a run records, in a git checkout and outside one, and the machine; a study run
from a dirty tree refused (README "Bad inputs"), a dirty launch's diff kept in the run folder, and the state the
report shows (clean / dirty-verified / dirty-with-diff / dirty-unverified).

The dirty-tree tests run the real `python train.py` from a git repository of their own in tmp_path (a copy of
this checkout's code, committed, then edited): `python -S` with PYTHONPATH=<repo>/src, so that the venv's
editable install of this checkout (a .pth finder) is not loaded and the copy is the code that runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from helpers.runs import FAST, ROOT


def test_summary_carries_the_commit_in_a_git_checkout_and_says_so_outside_one(tmp_path, monkeypatch):
    import pelab
    from pelab import provenance

    provenance.code_state.cache_clear()
    here = provenance.code_version()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert here["git"] == head and isinstance(here["dirty"], bool)
    fake = tmp_path / "site-packages" / "pelab"  # an installed copy: no git around it
    fake.mkdir(parents=True)
    monkeypatch.setattr(pelab, "__file__", str(fake / "__init__.py"))
    provenance.code_state.cache_clear()
    try:
        assert provenance.code_version()["git"] == "not a git checkout"
        assert provenance.store_diff(tmp_path, 1) is None  # nothing to tie to a commit, nothing written
    finally:
        provenance.code_state.cache_clear()
    m = provenance.machine()
    assert m["cpu_count"] >= 1 and m["torch_threads"] >= 1 and m["gpu_count"] == torch.cuda.device_count()


# -- a study run from a dirty tree --------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, check=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository holding this checkout's code (src/, conf/, train.py), committed: a clean tree."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src", repo / "src", ignore=skip)
    shutil.copytree(ROOT / "conf", repo / "conf", ignore=skip)
    shutil.copy(ROOT / "train.py", repo / "train.py")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the code")
    return repo


def _train(repo: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python train.py args` running the repository's own code (no site processing: no editable install)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), sysconfig.get_paths()["purelib"]]),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-S", str(repo / "train.py"), *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False)


# A study cell made small: its experiment config, the fast settings, a few steps, no evaluation.
STUDY = ["experiment=length_extrapolation", "hydra.mode=RUN", *FAST, "pe=rope", "seed=0", "trainer.max_steps=4",
         "trainer.val_check_interval=2", "eval.at=[]", "evaluate_after_fit=false"]


@pytest.mark.slow
def test_a_study_run_from_a_dirty_tree_is_refused_and_an_allowed_launch_stores_its_diff(repo, tmp_path):
    run = tmp_path / "run"
    args = [*STUDY, f"hydra.run.dir={run}", "ckpt_path=auto"]
    assert _train(repo, args, tmp_path).returncode == 0  # a clean tree: the study runs
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# an uncommitted change\n")

    out = _train(repo, [*args, "trainer.max_steps=6"], tmp_path)  # the same study, resumed from the edited tree
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "provenance.allow_dirty=true" in last and "train.py" in last, last
    assert "Traceback" not in out.stderr
    assert len(json.loads((run / "summary.json").read_text())["launches"]) == 1  # refused before the job started
    sweep = tmp_path / "sweep"  # the study as it is launched, a multirun: refused once, before any job
    out = _train(repo, ["experiment=length_extrapolation", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert out.returncode == 1 and "provenance.allow_dirty=true" in out.stderr.strip().splitlines()[-1]
    assert not sweep.exists()

    out = _train(repo, [*args, "trainer.max_steps=6", "provenance.allow_dirty=true"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    first, second = summary["launches"]
    assert first["dirty"] is False and "diff" not in first and summary["global_step"] == 6
    diff = _git(repo, "diff", "HEAD", "--binary")
    assert second["dirty"] is True and second["diff"] == summary["provenance"]["code"]["diff"] == {
        "file": "provenance-2.diff", "sha256": hashlib.sha256(diff).hexdigest(), "bytes": len(diff)}
    assert (run / "provenance-2.diff").read_bytes() == diff and b"an uncommitted change" in diff
    from pelab.provenance import provenance_state

    assert provenance_state(summary, run) == "dirty-with-diff"


@pytest.mark.slow
def test_a_plain_run_from_a_dirty_tree_runs_and_keeps_its_diff(repo, tmp_path):
    (repo / "conf" / "train.yaml").write_text((repo / "conf" / "train.yaml").read_text() + "# edited\n")
    run = tmp_path / "run"
    out = _train(repo, [*FAST, "logger=csv", "trainer.max_steps=2", "trainer.val_check_interval=2",
                        "evaluate_after_fit=false", f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["provenance"]["code"]["dirty"] is True
    assert (run / "provenance-1.diff").read_bytes() == _git(repo, "diff", "HEAD", "--binary")


def _record(tmp_path: Path, name: str, launches: list[dict]) -> tuple[dict, Path]:
    folder = tmp_path / name
    folder.mkdir()
    code = {"git": "a" * 40, "dirty": launches[-1]["dirty"], "version": "0.1.0"}
    return {"provenance": {"code": code}, "launches": launches}, folder


def test_provenance_state_tells_clean_dirty_verified_with_diff_and_unverified(tmp_path):
    from pelab.provenance import VERIFIED_FILE, provenance_state

    clean = {"dirty": False}
    summary, folder = _record(tmp_path, "clean", [clean, clean])
    assert provenance_state(summary, folder) == "clean"
    summary, folder = _record(tmp_path, "flag", [clean, {"dirty": True}])  # resumed dirty, only the flag (v3)
    assert provenance_state(summary, folder) == "dirty-unverified"
    (folder / VERIFIED_FILE).write_text(json.dumps({"verified": False, "n_mismatches": 3}))
    assert provenance_state(summary, folder) == "dirty-unverified"  # a rerun that differs verifies nothing
    (folder / VERIFIED_FILE).write_text(json.dumps({"verified": True}))
    assert provenance_state(summary, folder) == "dirty-verified"
    diff = b"--- a/x\n+++ b/x\n"
    stored = {"file": "provenance-2.diff", "sha256": hashlib.sha256(diff).hexdigest(), "bytes": len(diff)}
    summary, folder = _record(tmp_path, "diff", [clean, {"dirty": True, "diff": stored}])
    assert provenance_state(summary, folder) == "dirty-unverified"  # recorded, but not in the folder
    (folder / "provenance-2.diff").write_bytes(diff)
    assert provenance_state(summary, folder) == "dirty-with-diff"
    (folder / "provenance-2.diff").write_bytes(diff + b"+changed since\n")
    assert provenance_state(summary, folder) == "dirty-unverified"
    assert provenance_state({"provenance": {"code": {"git": "not a git checkout"}}}, folder) == "unknown"


def test_verify_reruns_a_frozen_study_preset_from_the_checkouts_own_folder(tmp_path):
    """A run launched as `python train.py -cd experiments/<study>/conf experiment=<study>_v2`: the rerun adds the
    same folder of the clean checkout, and the folder is no override."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify", ROOT / "experiments" / "provenance" / "verify.py")
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    tree = tmp_path / "verify-abc"
    summary = {"command": "train.py -cd experiments/length_extrapolation/v2/conf experiment=length_extrapolation_v2 "
                          "pe=rope hydra.mode=RUN hydra.run.dir=x"}
    assert verify.config_dirs(summary, tree) == ["-cd", str(tree / "experiments/length_extrapolation/v2/conf")]
    assert verify.job_overrides(tmp_path, summary) == ["experiment=length_extrapolation_v2", "pe=rope"]
    absolute = {"command": f"train.py --config-dir={ROOT}/experiments/lost_in_the_middle/v2/conf -m "
                           "experiment=lost_in_the_middle_v2"}
    assert verify.config_dirs(absolute, tree) == ["-cd", str(tree / "experiments/lost_in_the_middle/v2/conf")]
    assert verify.config_dirs({"command": "train.py experiment=length_extrapolation pe=rope"}, tree) == []


def test_same_ends_pairs_each_along_run_with_the_run_it_repeats_and_names_what_differs(tmp_path):
    """experiments/provenance/same_ends.py (issue 59's along-training arms): a run that repeats a committed one with
    evaluations during training added ends on the same numbers, whatever its settings and along-training points; a
    changed metric, or a run with no pair, fails with its row saying so."""
    ref = ROOT / "experiments/lost_in_the_middle/v4/lr1e-3/runs/stdlib"
    name = "0_rope-recall-L128-s0"
    summary = json.loads((ref / name / "summary.json").read_text())
    along = tmp_path / "along" / name
    along.mkdir(parents=True)

    def check(s: dict) -> tuple[int, str]:
        (along / "summary.json").write_text(json.dumps(s))
        proc = subprocess.run([sys.executable, str(ROOT / "experiments/provenance/same_ends.py"), str(tmp_path / "along"),
                               str(ref)], capture_output=True, text=True, timeout=120, check=False)
        rows = [line for line in proc.stdout.splitlines() if line.startswith(f"| {name} ")]
        assert len(rows) == 1, proc.stdout + proc.stderr
        return proc.returncode, rows[0]

    s = json.loads(json.dumps(summary))
    s["config"]["eval"]["at"], s["along_training"] = [0.5, 0.75], [{"step": 500, "metrics": {"x": 1.0}}]
    rc, row = check(s)
    assert rc == 0 and row.endswith("| 0 | yes |") and f"| {name} | {name} |" in row
    s["metrics"]["probe/mqar/acc@1024"] += 0.001
    rc, row = check(s)
    assert rc == 1 and row.endswith("| no |") and "`metrics.probe/mqar/acc@1024`" in row
    s = json.loads(json.dumps(summary))
    s["config"]["seed"] = 99
    rc, row = check(s)
    assert rc == 1 and "| 0 runs match |" in row
