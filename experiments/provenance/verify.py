"""Verify a committed run made from a dirty tree (issue 49): rerun it from a clean checkout of its recorded commit
and compare every recorded number to the digit. The outcome goes into the run folder as `verified.json`
(`pelab.provenance.VERIFIED_FILE`; the report's `provenance_state` reads it): `verified: true` when every
compared value is equal, else the differences.

    python experiments/provenance/verify.py <run folder> ...          # these runs
    python experiments/provenance/verify.py --dirty experiments --max-steps 1500   # every dirty run, cheapest first

For each run: `git worktree add --detach /tmp/verify-<commit>` (kept for the other runs of that commit), then
`python -S <worktree>/train.py <the job's overrides>` into a scratch folder, with the recorded torch threads
(OMP_NUM_THREADS) and a token cache of its own per commit (built by that commit's code). `-S` with
PYTHONPATH=<worktree>/src:<site-packages>: the venv's editable install of the main checkout is a `.pth` meta-path
finder that maps `pelab.conf` to the main checkout's conf/ even when PYTHONPATH puts the worktree's `pelab` first;
without site processing no `.pth` runs, so pelab, its configs and train.py all come from the worktree. The record
proves it: the worktree's `pelab.__file__` and `pelab.CONF_DIR` (asked in the same environment), and the rerun's
own summary.json, whose `provenance.code` is the recorded commit, clean.

The job's overrides are its `.hydra/overrides.yaml`, or, for a single run whose folder lacks it (context_extension
v3 parents/s2), the recorded command's arguments without `hydra.*` (a RUN-mode command is the job's overrides).
A folder the command added with `-cd` (a study's frozen presets) is added again, as the checkout's same folder.
A context-extension child (`extend.from`) needs its parent's weights, which are not committed: the parent's
committed folder (found by the recorded paths: the child's output_dir and extend.from share the study folder) is
rerun and compared first, and the child starts from that rerun's checkpoint. A multirun job is rerun as a one-job
multirun (the same code path, run name and folder layout).

Compared: summary.json's metrics, along_training points, final evaluation details (per-block NLL, intervals, probe
rows), model counts, the data fingerprint and global_step; and every cell of csv/metrics.csv. Left out: wall-clock
measurements (tokens/s, MFU, seconds) and paths. A relaunch skips the runs that have an outcome (--again: redo).
Run it in the background at low priority, one run at a time:

    nohup nice -n 10 .venv/bin/python experiments/provenance/verify.py --dirty experiments --max-steps 1500 \\
        >> /tmp/provenance-verify/verify.log 2>&1 &
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
from pelab.provenance import VERIFIED_FILE, cpu_model, now

SCRATCH = Path("/tmp/provenance-verify")
# Keys whose values are wall-clock measurements or paths: never equal between two runs of the same numbers.
NOT_COMPARED = re.compile(r"seconds|tokens_per_sec|mfu|(^|[./])(path|cache_path|cache_dir|plots|figures|output_dir|"
                          r"save_dir|dirpath|started_at|ended_at)($|[./\[])")
# Settings a rerun changes on purpose: where it writes, its run name (a one-job multirun names fewer swept keys),
# the parent it starts from (the rerun of the recorded parent).
NOT_SETTINGS = ("name", "paths", "logger", "extend.from")


def log(message: str) -> None:
    print(f"[{now()}] {message}", flush=True)


# -- which runs ------------------------------------------------------------------------------------------------
def dirty_runs(root: Path) -> list[Path]:
    """Run folders under `root` with a launch from a dirty tree (or a dirty provenance.code)."""
    out = []
    for path in sorted(root.rglob("summary.json")):
        s = json.loads(path.read_text())
        code = (s.get("provenance") or {}).get("code") or {}
        if code.get("dirty") or any(launch.get("dirty") for launch in s.get("launches") or []):
            out.append(path.parent)
    return out


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


# -- how it was run ---------------------------------------------------------------------------------------------
def recorded_commit(summary: dict) -> str:
    """The one commit every launch ran at (a run resumed at another commit cannot be rerun as one launch)."""
    commits = {launch.get("commit") for launch in summary.get("launches") or []} | {summary["provenance"]["code"]["git"]}
    if len(commits) != 1 or not re.fullmatch(r"[0-9a-f]{40}", next(iter(commits)) or ""):
        raise ValueError(f"launches at several commits or none: {sorted(map(str, commits))}")
    return commits.pop()


def is_multirun(summary: dict) -> bool:
    words = shlex.split(summary["command"])
    return not any(w in ("hydra.mode=RUN",) or w.startswith("hydra.run.dir=") for w in words)


# Hydra's flags that take the next word as their value (train.py's command line)
FLAG_VALUES = ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp", "--config-dir",
               "-cd", "--info", "-i", "--experimental-rerun")


def job_overrides(folder: Path, summary: dict) -> list[str]:
    """The job's own overrides: .hydra/overrides.yaml, else a single run's command line without hydra.* and flags."""
    saved = folder / ".hydra" / "overrides.yaml"
    if saved.is_file():
        return [str(o) for o in yaml.safe_load(saved.read_text())]
    if is_multirun(summary):
        raise ValueError("a multirun job without .hydra/overrides.yaml: its own values of the sweep are unknown")
    words = shlex.split(summary["command"])[1:]
    return [w for i, w in enumerate(words) if not w.lstrip("+~").startswith("hydra.") and not w.startswith("-")
            and not (i > 0 and words[i - 1] in FLAG_VALUES)]


def config_dirs(summary: dict, tree: Path) -> list[str]:
    """The recorded command's `-cd <folder>` (Hydra's --config-dir: a study's frozen presets beside it) as the same
    folder of the clean checkout `tree`: the job's overrides may choose a preset found only there."""
    words, out = shlex.split(summary["command"]), []
    for i, w in enumerate(words):
        given = w.partition("=")[2] if w.startswith("--config-dir=") else (
            words[i + 1] if w in ("-cd", "--config-dir") and i + 1 < len(words) else None)
        if given:
            path = Path(given)
            path = path.relative_to(REPO) if path.is_absolute() and path.is_relative_to(REPO) else path
            # a relative folder is the launch folder's: a study launches from the repository root
            out += ["-cd", str(path if path.is_absolute() else tree / path)]
    return out


def committed_parent(folder: Path, summary: dict) -> Path | None:
    """The committed folder of a context-extension child's parent: the recorded output_dir and extend.from
    share the study folder, which the committed tree mirrors."""
    source = ((summary.get("config") or {}).get("extend") or {}).get("from")
    if not source:
        return None
    recorded = Path(summary["output_dir"]).parts
    here = folder.resolve().parts
    common = 0
    while common < min(len(recorded), len(here)) and recorded[-1 - common] == here[-1 - common]:
        common += 1
    study_recorded, study_here = Path(*recorded[:len(recorded) - common]), Path(*here[:len(here) - common])
    parent = study_here / Path(source).relative_to(study_recorded)
    if not (parent / "summary.json").is_file():
        raise ValueError(f"extend.from={source}: no committed parent at {parent}")
    return parent


# -- the clean checkout and its interpreter ----------------------------------------------------------------------
def worktree(commit: str) -> Path:
    """A clean checkout of `commit` (kept: the other runs of that commit use it; `git worktree remove` after)."""
    path = Path(f"/tmp/verify-{commit[:12]}")
    if not (path / ".git").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)
    status = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if status or head != commit:
        raise RuntimeError(f"{path} is not a clean checkout of {commit}")
    return path


def environment(tree: Path, commit: str, threads: int) -> dict[str, str]:
    """No site processing (`python -S`: no editable-install finder), the worktree's src first, then the venv's
    packages; the recorded thread count; a token cache of this commit's own; no W&B."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "PELAB_", "PYTHON"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(tree / "src"), sysconfig.get_paths()["purelib"]]),
            "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "WANDB_MODE": "disabled",
            "PELAB_CACHE_DIR": str(SCRATCH / "cache" / commit[:12]), "PYTHONUNBUFFERED": "1"}


def code_that_runs(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """Where pelab and its configs come from in that environment: both must be inside the worktree."""
    probe = "import json, pelab; print(json.dumps({'pelab': pelab.__file__, 'conf': pelab.CONF_DIR}))"
    out = json.loads(subprocess.run([sys.executable, "-S", "-c", probe], env=env, cwd=tree, capture_output=True,
                                    text=True, check=True).stdout)
    if not all(Path(v).resolve().is_relative_to(tree) for v in out.values()):
        raise RuntimeError(f"the rerun would not run the worktree's code: {out}")
    return out


# -- the rerun ---------------------------------------------------------------------------------------------------
def rerun(folder: Path, summary: dict, replace: dict[str, str]) -> tuple[Path, dict]:
    """Run the job again from its commit into a scratch folder (reused if a rerun finished there), with the
    overrides in `replace` (key -> value) in place of the recorded ones; returns the rerun's folder and what ran
    (command, environment, code)."""
    commit = recorded_commit(summary)
    tree = worktree(commit)
    threads = int(summary["provenance"]["machine"]["torch_threads"])
    env = environment(tree, commit, threads)
    code = code_that_runs(tree, env)
    out = SCRATCH / "runs" / folder.resolve().relative_to(REPO)
    multirun = is_multirun(summary)
    # quoted: a job folder's name holds '=' (trainer.max_steps=1500), which Hydra's override grammar refuses bare
    where = [f"hydra.mode={'MULTIRUN' if multirun else 'RUN'}", f"hydra.{'sweep' if multirun else 'run'}.dir='{out}'"]
    overrides = [o for o in job_overrides(folder, summary) if o.split("=", 1)[0] not in replace]
    overrides += [f"{k}='{v}'" for k, v in replace.items()]
    cmd = [sys.executable, "-S", str(tree / "train.py"), *config_dirs(summary, tree), *overrides, *where]
    ran = {"python": sys.executable, "command": shlex.join(cmd[1:]), "cwd": str(tree), "code": code,
           "env": {k: env[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PELAB_CACHE_DIR")}}
    done = finished(out)
    if done is None:
        log(f"rerun {folder.relative_to(REPO)} at {commit[:12]}: {ran['command']}")
        t0 = time.time()
        (SCRATCH / "logs").mkdir(parents=True, exist_ok=True)
        with (SCRATCH / "logs" / f"{out.name}.log").open("a") as fh:
            subprocess.run(cmd, env=env, cwd=tree, stdout=fh, stderr=subprocess.STDOUT, check=True,
                           stdin=subprocess.DEVNULL)
        ran["rerun_wall_seconds"] = round(time.time() - t0, 1)
        done = finished(out)
        if done is None:
            raise RuntimeError(f"the rerun left no finished run in {out}")
    return done, ran


def finished(out: Path) -> Path | None:
    """The one finished run folder under `out` (the run folder itself, or the one job of a multirun)."""
    found = [p.parent for p in [out / "summary.json", *out.glob("*/summary.json")] if p.is_file()]
    if len(found) > 1:
        raise RuntimeError(f"{out} holds {len(found)} runs: the rerun swept more than its one job")
    return found[0] if found and summary_of(found[0]).get("status") == "ok" else None


# -- the comparison ----------------------------------------------------------------------------------------------
def flat(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        return {k: v for key, value in x.items() for k, v in flat(value, f"{prefix}.{key}" if prefix else key).items()}
    if isinstance(x, list):
        return {k: v for i, value in enumerate(x) for k, v in flat(value, f"{prefix}[{i}]").items()}
    return {prefix: x}


def recorded_numbers(summary: dict) -> dict[str, Any]:
    """What a rerun must give to the digit: metrics, the along-training points by step, the final evaluation's
    details, model counts, the data fingerprint, the step reached, the resolved settings (but NOT_SETTINGS);
    wall-clock values and paths left out."""
    fingerprint = ((summary.get("data") or {}).get("fingerprint") or {})
    sections = {
        "global_step": summary.get("global_step"),
        "metrics": summary.get("metrics"),
        "along_training": {str(p["step"]): p for p in summary.get("along_training") or []},
        "evaluation": summary.get("evaluation"),
        "model": summary.get("model"),
        "data.fingerprint": {k: v for k, v in fingerprint.items() if k != "cache_path"},
        "config": summary.get("config"),
    }
    dropped = tuple(f"config.{k}" for k in NOT_SETTINGS)
    return {k: v for k, v in flat(sections).items()
            if not NOT_COMPARED.search(k) and not any(k == d or k.startswith((f"{d}.", f"{d}[")) for d in dropped)}


def csv_cells(folder: Path) -> dict[str, str]:
    path = folder / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    return {f"csv[{i}].{k}": v for i, row in enumerate(rows) for k, v in row.items() if not NOT_COMPARED.search(k)}


def compare(recorded: dict[str, Any], rerun: dict[str, Any]) -> list[dict[str, Any]]:
    """Every key of either side whose values differ (a key only one side has included)."""
    missing = object()
    out = []
    for key in sorted(set(recorded) | set(rerun)):
        a, b = recorded.get(key, missing), rerun.get(key, missing)
        if a != b:
            out.append({"key": key, "recorded": None if a is missing else a, "rerun": None if b is missing else b,
                        **({"only": "recorded" if b is missing else "rerun"} if missing in (a, b) else {})})
    return out


def outcome(folder: Path, summary: dict, done: Path, ran: dict) -> dict[str, Any]:
    again = summary_of(done)
    a = {**recorded_numbers(summary), **csv_cells(folder)}
    b = {**recorded_numbers(again), **csv_cells(done)}
    diffs = compare(a, b)
    code = again["provenance"]["code"]
    if code.get("git") != recorded_commit(summary) or code.get("dirty") is not False:
        diffs.insert(0, {"key": "provenance.code", "recorded": recorded_commit(summary), "rerun": code})
    return {
        "verified": not diffs,
        "commit": recorded_commit(summary),
        "launches_recorded": len(summary.get("launches") or []),
        "recorded_command": summary.get("command"),
        **ran,
        "rerun_code": code,
        "rerun_name": again.get("name"), "recorded_name": summary.get("name"),
        "versions": {"recorded": summary.get("versions"), "rerun": again.get("versions")},
        "compared": {"summary": sum(1 for k in a if not k.startswith("csv[")),
                     "csv_cells": sum(1 for k in a if k.startswith("csv["))},
        "n_mismatches": len(diffs),
        "mismatches": diffs[:200],
        "date": now(),
        "machine": {"host": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    "torch_threads": again["provenance"]["machine"]["torch_threads"]},
        "rerun_folder": str(done),
    }


# -- one run, with its parent --------------------------------------------------------------------------------------
def verify(folder: Path, again: bool) -> Path:
    """Verify `folder` (its parent first, for a context-extension child); returns its rerun's folder."""
    summary = summary_of(folder)
    target = folder / VERIFIED_FILE
    replace = {}
    parent = committed_parent(folder, summary)
    if parent is not None:
        parent_rerun = verify(parent, again)
        if not json.loads((parent / VERIFIED_FILE).read_text())["verified"]:
            raise RuntimeError(f"its parent {parent.relative_to(REPO)} did not rerun to the digit: no same weights")
        replace["extend.from"] = str(parent_rerun)  # the recorded path is gone: the rerun parent's weights
    if target.is_file() and not again:
        previous = json.loads(target.read_text())
        if previous.get("rerun_folder") and Path(previous["rerun_folder"]).is_dir():
            return Path(previous["rerun_folder"])
        log(f"{folder.relative_to(REPO)}: has {VERIFIED_FILE}, rerunning only for its checkpoint")
    done, ran = rerun(folder, summary, replace)
    if target.is_file() and not again:
        return done
    result = outcome(folder, summary, done, ran)
    target.write_text(json.dumps(result, indent=2) + "\n")
    log(f"{folder.relative_to(REPO)}: {'VERIFIED' if result['verified'] else 'DIFFERS'} "
        f"({result['compared']['summary']} summary values, {result['compared']['csv_cells']} csv cells, "
        f"{result['n_mismatches']} mismatches)")
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="*", type=Path, help="run folders (with summary.json)")
    p.add_argument("--dirty", type=Path, help="every run folder under this one with a dirty launch")
    p.add_argument("--max-steps", type=int, help="only runs of at most this many steps")
    p.add_argument("--again", action="store_true", help="rerun runs that have an outcome already")
    p.add_argument("--list", action="store_true", help="list the runs, cheapest first, and stop")
    args = p.parse_args()
    folders = [f.resolve() for f in args.folders] + (dirty_runs(args.dirty.resolve()) if args.dirty else [])
    steps = {f: summary_of(f).get("global_step") or 0 for f in folders}
    folders = sorted((f for f in folders if args.max_steps is None or steps[f] <= args.max_steps),
                     key=lambda f: (steps[f], str(f)))
    for f in folders:
        state = json.loads((f / VERIFIED_FILE).read_text()).get("verified") if (f / VERIFIED_FILE).is_file() else "-"
        print(f"{steps[f]:>6} {state!s:>5} {f.relative_to(REPO)}")
    if args.list:
        return
    failed = 0
    for f in folders:
        if (f / VERIFIED_FILE).is_file() and not args.again:
            continue
        try:
            verify(f, args.again)
        except (subprocess.CalledProcessError, RuntimeError, ValueError) as err:
            failed += 1
            log(f"{f.relative_to(REPO)}: not verified: {type(err).__name__}: {err}")
    log(f"done: {len(folders)} runs, {failed} could not be rerun")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
