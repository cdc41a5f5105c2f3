"""`summary.json`: the one file per run that reports, sweeps and people read (no W&B needed)."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"


def versions() -> dict[str, str]:
    """The versions a run records, read from the installed packages' metadata: a job starts (and a bad setting
    is refused) without importing torch, Lightning or W&B. A module already imported gives its own
    `__version__` (the same string for a wheel)."""
    from importlib.metadata import PackageNotFoundError, version

    import pelab

    def installed(name: str) -> str | None:
        module = sys.modules.get(name)
        if module is not None:
            return module.__version__
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    out = {"python": platform.python_version(), "torch": installed("torch"), "lightning": installed("lightning")}
    if installed("wandb") is not None:
        out["wandb"] = installed("wandb")
    out["pelab"] = pelab.__version__
    return out


def json_safe(x: Any) -> Any:
    """Make a value JSON-serialisable. Non-finite floats become the strings "nan", "inf", "-inf"
    (strings, not null, so that "diverged" (inf) and "not applicable" (nan) stay distinct).
    Recurses into dicts, lists and tuples; tensors and numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # tensors, numpy arrays and scalars
        return json_safe(x.tolist())
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def as_float(x: Any) -> float:
    """Inverse of json_safe for one number ("nan"/"inf" strings and null -> float)."""
    return float("nan") if x is None else float(x)


def write_summary(output_dir: Path, summary: dict) -> Path:
    """Atomic write (temp + rename) so a crash never leaves a half summary."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_safe(summary), indent=2, sort_keys=False))
    os.replace(tmp, path)
    return path


def read_summary(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    return json.loads(path.read_text())


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


# -- the result table printed at the end of a run -----------------------------------------------------


def retrieval_acquired(metrics: dict) -> bool | None:
    """Did the run reach its in-window retrieval criterion (pelab.harness.retrieval)? None: it had none."""
    if "train/retrieval_acc" not in metrics:
        return None
    return math.isfinite(as_float(metrics.get("train/steps_to_criterion")))
