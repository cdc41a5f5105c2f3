"""Where a run's numbers come from: the code (git commit and dirty flag), the machine (CPU, threads, GPUs), the
library versions, and each launch of the run (start, end, wall time, status), accumulated across resumes.

Written into summary.json (`provenance`, `launches`, `wall_seconds_total`) and the W&B config (`provenance`),
and shown in the report's runs table. A launch from a tree with uncommitted changes to tracked files stores them
(`git diff HEAD --binary`) in the run folder, `provenance-<launch>.diff`, its sha256 in that launch's record;
`provenance_state` says how far a run's code can be told: clean, dirty with its diff, dirty and verified by a
rerun at its commit (`verified.json`, experiments/provenance/verify.py), or dirty and unverified.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


def now() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class CodeState:
    """The pelab code this process runs, read once: its commit, whether tracked files differ from it (which
    ones, and `git diff HEAD --binary`), pelab's version. `top`: the checkout, None for an installed copy."""

    version: dict[str, Any]
    top: Path | None = None
    changed: tuple[str, ...] = ()
    diff: bytes = b""


def git(top: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(top), *args], capture_output=True, check=True, timeout=10).stdout


@cache
def code_state() -> CodeState:
    """The code's state when the process first asks (a multirun's jobs share it: they run the code imported
    then). The diff is read with the flag, so the stored diff is the tree the flag describes."""
    import pelab

    try:
        top = Path(git(Path(pelab.__file__).resolve().parent, "rev-parse", "--show-toplevel").decode().strip())
        if not (top / "src" / "pelab").is_dir():  # pelab installed inside some other repository
            raise ValueError(top)
        commit = git(top, "rev-parse", "HEAD").decode().strip()
        changed = tuple(line[3:] for line in git(top, "status", "--porcelain", "--untracked-files=no")
                        .decode(errors="replace").splitlines())
        diff = git(top, "diff", "HEAD", "--binary") if changed else b""
    except (OSError, subprocess.SubprocessError, ValueError):
        return CodeState({"git": "not a git checkout", "version": pelab.__version__})
    return CodeState({"git": commit, "dirty": bool(changed), "version": pelab.__version__}, top, changed, diff)


def code_version() -> dict[str, Any]:
    """The git commit of the pelab code that runs and whether its tracked files differ from it; outside a git
    checkout (an installed wheel) `{"git": "not a git checkout"}`."""
    return dict(code_state().version)


# The diff of launch N (1-based) of a run, in its folder; and the outcome of a rerun at the recorded commit.
DIFF_FILE = "provenance-{launch}.diff"
VERIFIED_FILE = "verified.json"


def store_diff(folder: Path, launch: int) -> dict[str, Any] | None:
    """A launch from a dirty tree: its `git diff HEAD --binary` into `folder` (DIFF_FILE) and what the record
    keeps of it (file, sha256, bytes: `git apply` on the recorded commit gives the code that ran); None when
    the tree is clean or not a checkout."""
    state = code_state()
    if not state.version.get("dirty"):
        return None
    path = folder / DIFF_FILE.format(launch=launch)
    path.write_bytes(state.diff)
    return {"file": path.name, "sha256": hashlib.sha256(state.diff).hexdigest(), "bytes": len(state.diff)}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The host: name, CPU model and cores, the torch threads this process uses, the GPUs and CUDA."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "cuda": torch.version.cuda,
    }


def launch_record(command: str) -> dict[str, Any]:
    """One launch of a run, as `launches` keeps it: start time, commit, host, command (end, wall, status at
    its end)."""
    code = code_version()
    return {"started_at": now(), "ended_at": None, "wall_seconds": 0.0, "status": "running",
            "commit": code.get("git"), "dirty": code.get("dirty"), "host": platform.node(), "command": command}


# provenance_state's answers, best first.
PROVENANCE_STATES = ("clean", "dirty-verified", "dirty-with-diff", "dirty-unverified", "unknown")


def provenance_state(summary: dict[str, Any], folder: Path) -> str:
    """How far a run's code can be told, over every launch: "clean" (each at a commit, no uncommitted change);
    "dirty-verified" (a rerun from the clean recorded commit matched every metric to the digit: `verified.json`
    in `folder`); "dirty-with-diff" (every dirty launch's diff is in `folder`, its sha256 as recorded);
    "dirty-unverified" (a dirty launch with neither: only the flag); "unknown" (no commit recorded, e.g. an
    installed copy)."""
    code = (summary.get("provenance") or {}).get("code") or {}
    launches = summary.get("launches") or [{"dirty": code.get("dirty"), "diff": code.get("diff")}]
    if "dirty" not in code and all(launch.get("dirty") is None for launch in launches):
        return "unknown"
    dirty = [launch for launch in launches if launch.get("dirty")]
    if not dirty and not code.get("dirty"):
        return "clean"
    if verified(folder):
        return "dirty-verified"
    if dirty and all(diff_kept(folder, launch.get("diff")) for launch in dirty):
        return "dirty-with-diff"
    return "dirty-unverified"


def verified(folder: Path) -> bool:
    """A rerun from the recorded commit matched the run to the digit (VERIFIED_FILE says so)."""
    try:
        return json.loads((folder / VERIFIED_FILE).read_text()).get("verified") is True
    except (OSError, ValueError):
        return False


def diff_kept(folder: Path, stored: dict[str, Any] | None) -> bool:
    """A launch's diff (store_diff's record) is in the folder, unchanged."""
    if not stored:
        return False
    try:
        return hashlib.sha256((folder / stored["file"]).read_bytes()).hexdigest() == stored["sha256"]
    except (OSError, KeyError):
        return False
