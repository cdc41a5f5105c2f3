"""How many CPU threads torch takes in this run: chosen once at its start, recorded (summary.json -> threads)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def busy_cores(seconds: float = 0.5) -> tuple[float, str]:
    """How many cores other work keeps busy now: the non-idle share of /proc/stat over `seconds` (this process
    sleeps meanwhile, so it counts only the others), else the 1-minute load average (which lags a minute)."""
    def times() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]

    try:
        a = times()
        time.sleep(seconds)
        b = times()
    except (OSError, ValueError):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return load, f"1-minute load {load:.2f}"
    d = [y - x for x, y in zip(a, b)]
    idle = d[3] + (d[4] if len(d) > 4 else 0)  # idle + iowait
    busy = (os.cpu_count() or 1) * (1 - idle / max(1, sum(d)))
    return busy, f"{busy:.1f} cores busy over {seconds} s"


def set_threads(setting: Any, recorded: dict | None, world: int) -> dict:
    """torch's CPU threads for this run, applied, with how they were chosen (summary.json -> threads).

    A resumed run takes the count it recorded (CPU float sums depend on it); else a number given is used,
    OMP_NUM_THREADS when set, or `auto`: the cores other work leaves free at the start (`busy_cores`), shared by
    the `world` processes of this machine (at least 1). A second job beside a running one thus takes the free
    core instead of two threads fighting over it."""
    cores = os.cpu_count() or 1
    if recorded and recorded.get("used"):
        n, how = int(recorded["used"]), "resumed: the count this run started with"
    elif setting != "auto":
        n, how = int(setting), f"threads={setting}"
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        n, how = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    else:
        busy, measured = busy_cores()
        n = max(1, (cores - round(busy)) // world)
        how = f"auto: {cores} cores, {measured}, {world} process(es)"
    torch.set_num_threads(n)
    log.info("CPU threads: %d (%s)", n, how)
    return {"used": n, "chosen_by": how}
