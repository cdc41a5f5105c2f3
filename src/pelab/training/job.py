"""What the training loop needs from the job that runs it: a narrow protocol the training layer defines and the
task layer satisfies (`pelab.tasks.task.Task`), so that no function below the task layer receives the task object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class JobRecord(Protocol):
    """The run's record and its W&B run, as the Trainer's callbacks use them."""

    output_dir: Path  # the run folder
    summary: dict[str, Any]  # what summary.json holds, kept current
    run: Any | None  # the job's W&B run, or None (disabled, or not rank 0)
    rank: int  # the launcher's rank of this process (torchrun / srun); 0 for `python train.py`

    def start_wandb(self, wcfg: dict | None, *, name: str, config: dict, group: str | None = None,
                    tags: list[str] | None = None, notes: str | None = None) -> Any | None:
        """This job's W&B run (rank 0; None when `logger.wandb` is off), recorded in the summary."""

    def save(self) -> None:
        """Write summary.json as it stands (rank 0 of the launching process only)."""

    def add_point(self, record: dict) -> None:
        """An evaluation during training (eval.at) into the record, by step."""

    def quit_now(self, signum: int) -> None:
        """A signal while stopping: record it and end the process at once (never returns)."""
