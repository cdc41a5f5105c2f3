"""`python train.py [overrides]`: compose -> validate -> data -> model -> fit -> evaluate, as one job of
`pelab.tasks.task.run_task` (summary.json, the W&B run and the exit codes: see there).

The task layer composes (Hydra), validates (`pelab.tasks.config`), holds the run folder and keeps the record
(`run_task`); it hands the valid config on once: `pelab.runs.training.run_training` (data, model,
fit, evaluation).
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from pelab import CONF_DIR
from pelab.tasks.names import in_multirun
from pelab.tasks.task import cli_main, earlier_summary, launcher_rank, resolved_config, run_task
from pelab.training.config import (
    TrainSettings,  # imports the schemas: their nodes are stored before Hydra composes
)

log = logging.getLogger(__name__)


def validate_config(cfg: DictConfig) -> TrainSettings:
    """Every setting typed and range-checked before any data is built or any step is taken (each layer's
    schema, composed by pelab.tasks.config): the typed tree the training job reads. A bad one is a ConfigError
    naming the key."""
    from pelab.tasks.config import validate

    return validate(cfg)


def train(cfg: DictConfig) -> dict:
    """One training job. Returns its summary (also written to `<output_dir>/summary.json`, from the start
    and whenever something new is known).

    A launch into a folder that holds a run continues it (ckpt_path=auto), or, in a relaunched multirun, skips
    a job that finished (status ok) and resumes the others from their checkpoints; another run's settings, or a
    fresh start over a run, are refused in one line (`pelab.runs.folder`). A multirun's job whose folder a live
    process holds (another worker launched on the same sweep folder) is left to it: status "held"."""
    from pelab.runs.folder import FolderHeld, relaunch_decision
    from pelab.signals import preemption_signals

    output_dir = Path(cfg.paths.output_dir)
    signals = preemption_signals()
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(claim_folder(output_dir))
        except FolderHeld as err:
            if not in_multirun():
                raise
            log.info("%s is held by a running job (pid %d), another worker of this sweep: left to it",
                     output_dir, err.pid)
            return {"status": "held", "held_by": err.pid, "output_dir": str(output_dir)}
        earlier = earlier_summary(output_dir) if launcher_rank() == 0 else {}
        decision = relaunch_decision(output_dir, resolved_config(cfg), earlier, cfg.get("ckpt_path"), in_multirun())
        if decision == "skip":  # a relaunched multirun: this job finished earlier
            log.info("%s finished earlier (status ok, step %s): skipped", output_dir, earlier.get("global_step"))
            return {**earlier, "skipped": True}
        if decision == "continue" and cfg.get("ckpt_path") in (None, "", "null"):
            cfg.ckpt_path = "auto"  # a relaunched multirun resumes its interrupted jobs
        return train_in(cfg, output_dir, signals)


def claim_folder(output_dir: Path) -> Any:
    """The run folder held by this process (rank 0; the other launcher ranks share it)."""
    from pelab.runs.folder import claim

    return claim(output_dir) if launcher_rank() == 0 else contextlib.nullcontext()


def train_in(cfg: DictConfig, output_dir: Path, signals: tuple[int, ...]) -> dict:
    """`train` in its claimed folder."""
    with run_task(output_dir, rank=launcher_rank(), signals=signals, name=cfg.name) as task:
        task.summary["config"] = resolved_config(cfg)
        task.save()
        # Every check that needs no data before torch, Lightning or W&B is imported (a bad input is refused in
        # a second and costs no W&B connection) ...
        settings = validate_config(cfg)
        task.record_diff()
        task.record_machine()
        from pelab.runs.training import run_training  # here: it imports torch and Lightning

        with kept_threads():
            run_training(cfg, settings, task, signals)
    return task.summary


@contextlib.contextmanager
def kept_threads() -> Any:
    """The caller's torch thread count, restored after the job (the run's count, `threads`, is its own)."""
    import torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    return objective(cli_main(train, cfg), cfg.optimized_metric)


def main() -> None:
    """`python train.py` / `pelab-train`: the checks that need no config job (environment, group choices,
    writable folders), then Hydra's job."""
    from pelab.tasks.hydra_errors import one_line_hydra_errors
    from pelab.tasks.preflight import preflight

    preflight(CONF_DIR)
    with one_line_hydra_errors():  # an override Hydra cannot apply, a folder it cannot write: one line
        hydra_main()


def objective(summary: dict, metric: str) -> float:
    """Value returned to sweepers; a failed or missing metric is +inf (never a crash of the sweep)."""
    value = (summary.get("metrics") or {}).get(metric)
    return float(value) if value is not None and math.isfinite(float(value)) else float("inf")


if __name__ == "__main__":
    main()
