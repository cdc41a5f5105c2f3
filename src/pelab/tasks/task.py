"""The life of one job, the same for `train` and `eval`: `run_task` (a context manager) and `cli_main`.

`summary.json` is written when the job starts (status `running`) and again whenever something is known
(config, data, each validation, the training metrics before evaluation, the end), so a killed job shows as
`running` with what it had done, and a failed evaluation keeps the training metrics. Every outcome ends the
same way: `summary.json` with the status (ok / failed / interrupted / preempted, with the error and its
traceback) and the W&B run finished with the job's exit code, so the jobs of a multirun never share or merge
a run, and a failed job is visible.

Exit codes of `python train.py` / `python eval.py`: 0 finished (a result table is printed); 1 failed (a
deliberate error is printed as one line `Error: <cause and the setting to change>`, anything else with its
traceback); 75 preempted (SIGTERM / SIGUSR1) and 130 interrupted (Ctrl-C): during training
`checkpoints/last.ckpt` is saved at the end of the step; relaunch the same command with `ckpt_path=auto` to
continue. A second Ctrl-C quits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from pelab.errors import ConfigError, is_user_error
from pelab.provenance import code_version, launch_record, machine, now, store_diff
from pelab.result_table import result_table
from pelab.summary import RunRecord, command_line, read_summary, versions, write_summary
from pelab.tasks.names import in_multirun, sweep_group

log = logging.getLogger(__name__)

# sysexits.h EX_TEMPFAIL: "temporary failure, retry".
PREEMPTED_EXIT_CODE = 75
# 128 + SIGINT, what a shell reports for a job ended by Ctrl-C.
INTERRUPTED_EXIT_CODE = 130
EXIT_CODES = {"ok": 0, "preempted": PREEMPTED_EXIT_CODE, "interrupted": INTERRUPTED_EXIT_CODE}  # else 1


@dataclass
class Task:
    """What a running job owns: its summary (written whatever happens) and its W&B run (finished likewise)."""

    output_dir: Path
    summary: RunRecord
    rank: int = 0
    run: Any | None = field(default=None, repr=False)
    t0: float = field(default_factory=time.time, repr=False)
    cpu0: float = field(default_factory=time.process_time, repr=False)  # this process's CPU time at the start
    pid: int = field(default_factory=os.getpid, repr=False)  # ranks spawned by Lightning never write

    def __getstate__(self) -> dict:  # handed to ddp_spawn ranks with the callbacks: not the W&B run
        return {**self.__dict__, "run": None}

    def start_wandb(self, wcfg: dict | None, *, name: str, config: dict, group: str | None = None,
                    tags: list[str] | None = None, notes: str | None = None) -> Any | None:
        """This job's W&B run (rank 0 only; None when `logger.wandb` is off or disabled)."""
        from pelab.runs.loggers import init_info, init_wandb  # lazy: W&B and Lightning import slowly

        if not wcfg or self.rank != 0:
            return None
        config = {**config, "provenance": self.summary.get("provenance")}  # commit, machine: filterable in W&B
        self.run = init_wandb(wcfg, name=name, output_dir=self.output_dir, config=config,
                              group=wcfg.get("group") or sweep_group() or group, tags=tags, notes=notes)
        self.summary["wandb"] = init_info(self.run) if self.run else None
        self.save()
        return self.run

    def record_machine(self) -> None:
        """The host, CPUs, GPUs and torch threads into `provenance.machine`: once the settings are valid (it
        imports torch, which a refused setting never waits for)."""
        self.summary["provenance"]["machine"] = machine()

    def record_diff(self) -> None:
        """A launch from a tree with uncommitted changes keeps them: `git diff HEAD` into the run folder
        (provenance-<launch>.diff), its file and sha256 in this launch's record and in `provenance.code` (the
        code of the latest launch); a resumed run shows each launch's tree. Once the settings are valid."""
        if self.rank != 0 or os.getpid() != self.pid:
            return
        stored = store_diff(self.output_dir, len(self.summary["launches"]))
        if stored is not None:
            self.summary["launches"][-1]["diff"] = stored
            self.summary["provenance"]["code"]["diff"] = stored
            self.save()

    def save(self) -> None:
        """Write summary.json as it stands (rank 0): called whenever something new is known."""
        if self.rank == 0 and os.getpid() == self.pid:
            self.summary["wall_seconds"] = round(time.time() - self.t0, 2)  # this launch
            # what a CPU budget counts: this process's user + system time, every thread (not DataLoader workers or
            # other DDP ranks); on a shared machine the wall time is larger
            self.summary["cpu_seconds"] = round(time.process_time() - self.cpu0, 2)
            launches = self.summary.setdefault("launches", [])
            if launches:
                launches[-1].update(ended_at=now(), wall_seconds=self.summary["wall_seconds"],
                                    cpu_seconds=self.summary["cpu_seconds"], status=self.summary["status"])
            self.summary["wall_seconds_total"] = round(sum(x.get("wall_seconds") or 0 for x in launches), 2)
            # launches recorded before the key count nothing: the total is then a lower bound
            self.summary["cpu_seconds_total"] = round(sum(x.get("cpu_seconds") or 0 for x in launches), 2)
            # which attention path each scheme took in this process (a FlexAttention failure included)
            self.summary["attention"] = attention_record()
            write_summary(self.output_dir, self.summary)

    def add_point(self, record: dict) -> None:
        """An evaluation during training (eval.at): into summary.json's `along_training`, by step."""
        points = [p for p in self.summary.get("along_training") or [] if p["step"] != record["step"]]
        self.summary["along_training"] = sorted([*points, record], key=lambda p: p["step"])
        self.save()

    def quit_now(self, signum: int) -> None:
        """A second Ctrl-C (or a signal while finishing): record it and end the process at once."""
        if signum == signal.SIGINT:
            os.write(2, b"\nCtrl-C again: quitting now, without saving a checkpoint.\n")
            self.summary.update(status="interrupted", error="Ctrl-C twice: quit at once, without a checkpoint at "
                                "this point (resume with ckpt_path=auto from the last one).")
        self.save()
        os._exit(self.exit_code)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.summary["status"], 1)


@contextmanager
def run_task(output_dir: Path, *, rank: int = 0, signals: tuple[int, ...] = (), hint: str | None = None,
             **fields: Any) -> Iterator[Task]:
    """Run the body as one job: summary.json is written at once (status "running"), and on leaving it holds
    the job's outcome and its W&B run is finished.

    `signals`: preemption signals and SIGINT, which raise `Preempted` in the body (see
    `pelab.signals`); such a job ends normally with status "preempted" or "interrupted" (the
    caller exits with its EXIT_CODES), `hint` saying how to go on (default: relaunch with ckpt_path=auto).
    Any other exception is recorded and re-raised. Only rank 0 writes summary.json.
    """
    from pelab.signals import RESUME_HINT, JobSignals, Preempted

    quiet_third_party()
    if ATTENTION in sys.modules:  # this job's attention paths only (a multirun runs its jobs in one process)
        sys.modules["pelab.model"].reset_attention_paths()
    output_dir.mkdir(parents=True, exist_ok=True)
    earlier = earlier_summary(output_dir) if rank == 0 else {}
    summary = RunRecord({"status": "running", **carried(earlier), **fields, "output_dir": str(output_dir),
                         "command": command_line(), "versions": versions(), "provenance": {"code": code_version()},
                         "launches": [*earlier.get("launches", []), launch_record(command_line())]})
    task = Task(output_dir, summary, rank)
    task.save()
    with JobSignals(signals, quit_now=task.quit_now, hint=hint or RESUME_HINT) as job_signals:
        try:
            yield task
            summary["status"] = "ok"
        except Preempted as err:  # a clean stop: the checkpoint holds everything trained
            summary["status"] = err.status
            summary[err.status] = {"signal": err.signum, "step": err.step, "ckpt_path": err.ckpt}
            if err.step is not None:  # the step the run stopped at is the one its checkpoint holds
                summary["global_step"] = err.step
            log.warning("%s: %s", err.status.capitalize(), err)
        except BaseException as err:
            summary["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
            summary["error"] = f"{type(err).__name__}: {err}"
            summary["traceback"] = traceback.format_exc()
            raise
        finally:
            job_signals.finishing()  # a signal now ends the process at once, the summary written
            task.save()
            if task.run is not None:
                from pelab.runs.loggers import finish_wandb

                finish_wandb(task.run, exit_code=task.exit_code, preempted=summary["status"] == "preempted")


# The attention dispatch (torch): loaded by the first model, not by the job's start, so that a bad setting is
# refused before torch is imported. Until then no attention has run and its record is empty.
ATTENTION = "pelab.model.attention"
NO_ATTENTION = {"paths": {}, "flex_error": None}


def attention_record() -> dict:
    """summary.json's `attention`: the path each scheme's attention took in this process."""
    module = sys.modules.get(ATTENTION)
    return module.attention_paths() if module is not None else dict(NO_ATTENTION)


# What a relaunch into the same run folder keeps from the summary the earlier launch left, until it knows
# better: a relaunch that fails early still shows what the run had measured, beside its own failure.
CARRIED = ("global_step", "metrics", "data", "model", "along_training", "threads")


def earlier_summary(output_dir: Path) -> dict[str, Any]:
    """The summary.json an earlier launch of this run left in its folder ({} for a new run). An unreadable one
    (cut short by a crash, a hand edit) makes the folder a run of unknown settings: the launch is refused, the
    file left as it is -- treating the folder as empty would overwrite or relabel that run."""
    path = output_dir / "summary.json"
    if not path.is_file():
        return {}
    try:
        return read_summary(path)
    except (OSError, ValueError) as err:
        first = (str(err).splitlines() or [""])[0][:120]
        raise ConfigError(
            f"{path} cannot be read ({type(err).__name__}: {first}), so the run in {output_dir} is of unknown "
            "settings and this launch is refused (nothing was changed). Restore the file, or move it aside (mv "
            f"{path} {path}.unreadable) and relaunch with ckpt_path=auto to continue from the run's checkpoint "
            "(its recorded settings are checked against this launch), or launch into another folder.") from err


def carried(earlier: dict[str, Any]) -> dict[str, Any]:
    out = {k: earlier[k] for k in CARRIED if k in earlier}
    if earlier:
        out["earlier_status"] = earlier.get("status")
    return out


def cli_main(task_fn: Callable[[DictConfig], dict], cfg: DictConfig) -> dict:
    """The command line's side of a job: a finished job prints its result table; a deliberate error is one
    `Error:` line and exit code 1 (in a multirun it is re-raised, so that Hydra marks this job failed and
    runs the others); a preempted or interrupted job exits with its EXIT_CODES (a multirun stops there);
    other exceptions keep their traceback; a multirun's job held by another worker returns quietly."""
    try:
        summary = task_fn(cfg)
    except Exception as err:
        report_user_error(err)
        raise
    if summary["status"] == "held":  # a multirun's job left to the worker holding its folder (pelab.tasks.train)
        return summary
    if summary["status"] != "ok":
        code = EXIT_CODES.get(summary["status"], 1)
        if summary["status"] in ("preempted", "interrupted") or forward_left_running():
            exit_at_once(code)
        sys.exit(code)
    if launcher_rank() == 0:
        print(result_table(summary), flush=True)
    return summary


def forward_left_running() -> bool:
    """A stop during an evaluation forward left it running in its worker thread
    (`pelab.evaluation.common.stoppable_forward`): the interpreter's normal end would abort under it (exit 134)."""
    common = sys.modules.get("pelab.evaluation.common")  # loaded by any evaluation; not imported for a refusal
    return common is not None and common.abandoned_forwards()


def exit_at_once(code: int) -> None:
    """End a stopped job (its record written, W&B finished) with its code, without the interpreter's teardown:
    that runs a full garbage collection of every module (2.5-3.5 s measured after a stop in the 1 M-token
    evaluation, load ~6 on 2 cores), time a preemption's grace period does not have, and aborts under a forward
    left running."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# Third-party messages that ask nothing of the user: each silenced by its own text only.
NOISE_WARNINGS = [r"`isinstance\(treespec, LeafSpec\)` is deprecated"]  # torch pytree, via Lightning
NOISE_LOG_LINES = ["try installing [litlogger]"]  # Lightning's advertisement, on every Trainer


class _DropLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in NOISE_LOG_LINES)


def quiet_third_party() -> None:
    """Silence the notices in NOISE_WARNINGS / NOISE_LOG_LINES; every other warning still shows."""
    for pattern in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropLines) for f in logger.filters):
        logger.addFilter(_DropLines())


def report_user_error(err: BaseException) -> None:
    """Print a deliberate error as `Error: <message>` (one line) and exit 1; in a multirun re-raise it.
    Returns for any other exception (the caller re-raises it with its traceback)."""
    from pelab.tasks.preflight import os_error_line

    line = os_error_line(err)  # a full disk or a read-only place: one line, whatever raised it
    if line is None and not is_user_error(err):
        return
    line = line or " ".join(str(err).split())
    if in_multirun():
        log.error("Error: %s", line)
        raise err
    print(f"Error: {line}", file=sys.stderr, flush=True)
    sys.exit(1)


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
