"""`summary.json`: the one file per run that reports, sweeps and people read (no W&B needed).

What it holds is declared once, in `FIELDS` (key, type, meaning); a job writes it through `RunRecord`, which
refuses a key that is not declared or a value of another type, so the file's schema cannot drift from this
list."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from pelab.disk import naming

SUMMARY_FILE = "summary.json"

NUMBER = (int, float)
NONE = type(None)
# key -> (the types its value may have, what it holds). In the order a run usually writes them.
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "status": ((str,), "running, ok, failed, preempted or interrupted"),
    "earlier_status": ((str, NONE), "the status the previous launch of this run left"),
    "name": ((str,), "the run's name (W&B run name, folder name)"),
    "task": ((str,), "eval for an evaluation job (absent for training)"),
    "ckpt_path": ((str,), "the checkpoint an evaluation job read"),
    "output_dir": ((str,), "the run folder"),
    "command": ((str,), "the command line of this launch"),
    "versions": ((dict,), "python, torch, lightning, wandb, pelab"),
    "provenance": ((dict,), "code (commit, dirty tree) and machine (host, CPUs, GPUs, torch threads)"),
    "launches": ((list,), "every launch: start, end, wall seconds, status, commit, host, command"),
    "wall_seconds": (NUMBER, "this launch's wall time so far"),
    "wall_seconds_total": (NUMBER, "all launches' wall time"),
    "cpu_seconds": (NUMBER, "this launch's CPU time so far (this process, every thread; rank 0 under DDP)"),
    "cpu_seconds_total": (NUMBER, "all launches' CPU time (launches recorded before the key count 0)"),
    "attention": ((dict,), "the attention path each scheme took (and a FlexAttention failure)"),
    "config": ((dict,), "the resolved config"),
    "threads": ((dict,), "CPU threads the run uses and how they were chosen (kept on resume)"),
    "eval_cost": ((dict,), "the final evaluation's compute (TFLOP; eval.at's points beside it), its ratio to the training's: estimated before it"),
    "wandb": ((dict, NONE), "the W&B run (id, mode, folder) or null"),
    "extended_from": ((dict,), "the parent run of a context extension"),
    "resumed_from": ((dict,), "the checkpoint this launch resumed from, and its step"),
    "data": ((dict,), "corpus, tokenizer, split sizes, cache fingerprint"),
    "model": ((dict,), "parameter counts, FLOPs per token"),
    "metrics": ((dict,), "metric key -> number (pelab.metric_keys)"),
    "global_step": ((int, NONE), "the step training reached"),
    "start_step": ((int, NONE), "the step this launch started from"),
    "nonfinite_skips": ((int,), "updates skipped for a non-finite loss or gradient"),
    "along_training": ((list,), "evaluations during training (eval.at), by step"),
    "evaluation": ((dict, NONE), "the final evaluation's details: blocks, rows, intervals, timings"),
    "scaling_table": ((list,), "eval.py's scaling_sweep rows"),
    "preempted": ((dict,), "the signal, step and checkpoint of a preemption"),
    "interrupted": ((dict,), "the same for Ctrl-C"),
    "error": ((str,), "why the job failed"),
    "traceback": ((str,), "where it failed"),
}
# A second evaluation of the same run (a RoPE scaling of eval.py, the parent's weights at step 0): its details.
VARIANT_PREFIX = "evaluation/"


class RunRecord(dict):
    """summary.json as a job writes it: a dict whose keys are the declared `FIELDS`, each value of its type.
    A writer's typo or an undeclared key is an error where it is written, not a silent new column."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        types, _ = FIELDS.get(key) or ((dict, NONE) if key.startswith(VARIANT_PREFIX) else (None, None))
        if types is None:
            raise KeyError(f"summary.json has no field {key!r}; declare it in pelab.summary.FIELDS")
        if not isinstance(value, types):
            raise TypeError(f"summary.json field {key!r} holds {', '.join(t.__name__ for t in types)}; "
                            f"got {type(value).__name__}")
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __reduce__(self) -> tuple:  # pickled for ddp_spawn's ranks: rebuilt through the checks
        return (RunRecord, (dict(self),))


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

    out = {"python": platform.python_version(), "torch": installed("torch"), "lightning": installed("lightning"),
           "wandb": installed("wandb"), "pelab": pelab.__version__}
    return {k: v for k, v in out.items() if v is not None or k != "wandb"}  # wandb is optional


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
    try:
        tmp.write_text(json.dumps(json_safe(summary), indent=2, sort_keys=False))
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise naming(err, path) from err  # a full disk mid-write names no file
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
    """Did the run reach its in-window retrieval criterion (pelab.training.callbacks.retrieval)? None: it had none."""
    if "train/retrieval_acc" not in metrics:
        return None
    return math.isfinite(as_float(metrics.get("train/steps_to_criterion")))
