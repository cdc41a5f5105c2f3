"""Where a run's numbers come from: the code (git commit and dirty flag), the machine (CPU, threads, GPUs), the
library versions, and each launch of the run (start, end, wall time, status), accumulated across resumes.

Written into summary.json (`provenance`, `launches`, `wall_seconds_total`) and the W&B config (`provenance`),
and shown in the report's runs table.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from functools import cache
from pathlib import Path
from typing import Any


def now() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@cache
def code_version() -> dict[str, Any]:
    """The git commit of the pelab code that runs and whether its tracked files differ from it; outside a git
    checkout (an installed wheel) `{"git": "not a git checkout"}`."""
    import pelab

    where = Path(pelab.__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel"))
        if not (top / "src" / "pelab").is_dir():  # pelab installed inside some other repository
            raise ValueError(top)
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"git": "not a git checkout", "version": pelab.__version__}
    return {"git": commit, "dirty": dirty, "version": pelab.__version__}


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
