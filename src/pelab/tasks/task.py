"""The life of one job, the same for `train` and `eval`: `run_task` (a context manager) and `cli_main`.

Every outcome ends the same way: `summary.json` written (status ok / failed / interrupted / preempted, with the
error and its traceback) and the W&B run finished with the job's exit code, so the jobs of a multirun never
share or merge a run, and a failed job is visible.

Exit codes of `python train.py` / `python eval.py`: 0 finished; 1 failed (a deliberate error is printed as
one line `Error: <cause and the setting to change>`, anything else with its traceback); 75 preempted
(SIGTERM / SIGUSR1 during training: `checkpoints/last.ckpt` saved; relaunch the same command with
`ckpt_path=auto` to continue).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from pelab.errors import ConfigError
from pelab.summary import command_line, versions, write_summary

log = logging.getLogger(__name__)

# sysexits.h EX_TEMPFAIL: "temporary failure, retry".
PREEMPTED_EXIT_CODE = 75
EXIT_CODES = {"ok": 0, "preempted": PREEMPTED_EXIT_CODE}  # anything else: 1


@dataclass
class Task:
    """What a running job owns: its summary (written whatever happens) and its W&B run (finished likewise)."""

    output_dir: Path
    summary: dict[str, Any]
    rank: int = 0
    run: Any | None = field(default=None, repr=False)

    def start_wandb(self, wcfg: dict | None, *, name: str, config: dict, group: str | None = None,
                    tags: list[str] | None = None, notes: str | None = None) -> Any | None:
        """This job's W&B run (rank 0 only; None when `logger.wandb` is off or disabled)."""
        from pelab.harness.loggers import init_info, init_wandb

        if not wcfg or self.rank != 0:
            return None
        self.run = init_wandb(wcfg, name=name, output_dir=self.output_dir, config=config,
                              group=wcfg.get("group") or sweep_group() or group, tags=tags, notes=notes)
        self.summary["wandb"] = init_info(self.run) if self.run else None
        return self.run

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.summary["status"], 1)


@contextmanager
def run_task(output_dir: Path, *, rank: int = 0, signals: tuple[int, ...] = (), **fields: Any) -> Iterator[Task]:
    """Run the body as one job: on leaving, summary.json holds its outcome and its W&B run is finished.

    `signals`: preemption signals that raise `Preempted` in the body (see `pelab.harness.reliability`); a
    preempted job ends normally with status "preempted" (the caller exits with PREEMPTED_EXIT_CODE). Any
    other exception is recorded and re-raised. Only rank 0 writes summary.json.
    """
    from pelab.harness.loggers import finish_wandb
    from pelab.harness.reliability import JobSignals, Preempted

    t0 = time.time()
    output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"status": "running", **fields, "output_dir": str(output_dir),
                               "command": command_line(), "versions": versions()}
    task = Task(output_dir, summary, rank)
    try:
        with JobSignals(signals):
            yield task
        summary["status"] = "ok"
    except Preempted as err:  # a clean stop: the checkpoint holds everything trained
        summary["status"] = "preempted"
        summary["preempted"] = {"signal": err.signum, "step": err.step, "ckpt_path": err.ckpt}
        log.warning("Preempted: %s", err)
    except BaseException as err:
        summary["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        summary["error"] = f"{type(err).__name__}: {err}"
        summary["traceback"] = traceback.format_exc()
        raise
    finally:
        summary["wall_seconds"] = round(time.time() - t0, 2)
        if rank == 0:
            write_summary(output_dir, summary)
        finish_wandb(task.run, exit_code=task.exit_code, preempted=summary["status"] == "preempted")


def cli_main(task_fn: Callable[[DictConfig], dict], cfg: DictConfig) -> dict:
    """The command line's side of a job: a deliberate error is one `Error:` line and exit code 1 (in a
    multirun it is re-raised, so that Hydra marks this job failed and runs the others); a preempted job
    exits with PREEMPTED_EXIT_CODE; other exceptions keep their traceback."""
    try:
        summary = task_fn(cfg)
    except Exception as err:
        report_user_error(err)
        raise
    if summary["status"] == "preempted":
        sys.exit(PREEMPTED_EXIT_CODE)
    return summary


def report_user_error(err: BaseException) -> None:
    """Print a deliberate error as `Error: <message>` (one line) and exit 1; in a multirun re-raise it.
    Returns for any other exception (the caller re-raises it with its traceback)."""
    from pelab.harness.reliability import is_user_error

    if not is_user_error(err):
        return
    line = " ".join(str(err).split())
    if in_multirun():
        log.error("Error: %s", line)
        raise err
    print(f"Error: {line}", file=sys.stderr, flush=True)
    sys.exit(1)


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_group() -> str | None:
    """All jobs of one multirun share a W&B group: the sweep folder (date/time)."""
    from hydra.core.hydra_config import HydraConfig

    if not in_multirun():
        return None
    sweep_dir = Path(HydraConfig.get().sweep.dir)
    return f"sweep-{sweep_dir.parent.name}-{sweep_dir.name}"


def launcher_rank() -> int:
    """This process's global rank when a launcher started one process per device (torchrun: RANK; srun
    with several tasks: SLURM_PROCID); 0 for `python train.py` (ddp_spawn starts its ranks inside fit).
    Only rank 0 creates the W&B run and writes summary.json."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return int(os.environ.get("SLURM_PROCID", "0"))
    return 0


def resolved_config(cfg: DictConfig) -> dict:
    """The config as plain data; a required value left unset (`???`) is a one-line error naming it."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except MissingMandatoryValue as err:
        key = getattr(err, "full_key", None) or str(err).splitlines()[0]
        raise ConfigError(f"{key} has no value and this config needs one; set it on the command line "
                          f"({key}=...).") from err
