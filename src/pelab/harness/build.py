"""Builders of a run's parts from its config: the DataModule, the LightningModule, the Trainer with its
callbacks and loggers, and the resume point. Used by `pelab.tasks.train` and `pelab.tasks.evaluate`.

The Trainer, its callbacks and loggers, and the DataModule are instantiated from their `_target_` configs
(conf/trainer, conf/callbacks, conf/logger, conf/datamodule).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.utils.data import IterableDataset

from pelab.data.datamodule import LMDataModule
from pelab.errors import CheckpointError
from pelab.harness.config import TrainerConfig, TrainSettings, check_world, explicit_world_size
from pelab.harness.job import JobRecord

log = logging.getLogger(__name__)


def trainer_settings(settings: TrainSettings) -> tuple[str, int]:
    """The precision (`auto`: bf16-mixed on GPU, 32-true on CPU, where bf16 matmul is ~200x slower) and the
    number of devices, checked against the batch size; on CUDA also sets `matmul_precision`."""
    t = settings.trainer
    precision = t.precision
    if precision == "auto":
        precision = "bf16-mixed" if on_cuda(t) else "32-true"
    if on_cuda(t):
        # TF32 for the fp32 matmuls left outside autocast (Lightning warns when this is unset on tensor cores)
        torch.set_float32_matmul_precision(settings.run.matmul_precision)
    world = world_size_of(t)
    check_world(settings.data.batch_size, world, settings.run.debug.emulate_world_size)
    return precision, world


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


def on_cuda(t: TrainerConfig) -> bool:
    """Whether this trainer config trains on CUDA devices."""
    return torch.cuda.is_available() and t.accelerator in ("auto", "gpu", "cuda")


def world_size_of(t: TrainerConfig) -> int:
    """The number of processes: as the config names them, or for -1 / auto the machine's GPUs (1 on a CPU)."""
    world = explicit_world_size(t)
    if world is None:
        world = (max(1, torch.cuda.device_count()) if t.accelerator != "cpu" else 1) * int(t.num_nodes)
    return world


def resume_point(ckpt_setting: str | None, output_dir: Path, summary: dict) -> tuple[str | None, int | None]:
    """The checkpoint to resume from (the `ckpt_path` setting) and its vocabulary size; another model's /
    tokenizer's checkpoint is refused here, before any data is built."""
    from pelab.harness.checkpoints import check_resume_checkpoint
    from pelab.harness.run_folder import resolve_ckpt_path

    ckpt_path = resolve_ckpt_path(ckpt_setting, output_dir)
    if not ckpt_path:
        if ckpt_setting == "auto" and summary.get("earlier_status") is not None:  # a relaunch: say it plainly
            log.warning("ckpt_path=auto: %s holds no checkpoint (the run stopped before its first one); this run "
                        "starts over from step 0", output_dir)
        return None, None
    step, vocab_size = check_resume_checkpoint(ckpt_path, summary["config"], same_run=ckpt_setting == "auto")
    summary["resumed_from"] = {"ckpt_path": ckpt_path, "step": step}
    log.info("resuming from %s (step %d)", ckpt_path, step)
    return ckpt_path, vocab_size


def prepare_data(datamodule: Any, summary: dict, ckpt_path: str | None = None, ckpt_vocab: int | None = None) -> Any:
    """The DataModule with its token cache built (the first real cost of a run)."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    summary["data"] = data_record(datamodule)
    if ckpt_vocab is not None and int(ckpt_vocab) != datamodule.vocab_size:
        raise CheckpointError(
            f"ckpt_path={ckpt_path} has a vocabulary of {ckpt_vocab} ids but this run's tokenizer gives "
            f"{datamodule.vocab_size}; resume with the checkpoint's tokenizer.* and data.* settings."
        )
    return datamodule


def data_record(datamodule: Any) -> dict:
    """summary.json's `data`: what a report needs to tell whether runs saw the same tokens."""
    return {
        "fingerprint": datamodule.fingerprint,
        "vocab_size": datamodule.vocab_size,
        "reserved": datamodule.reserved,  # the recall key / value id ranges [start, stop)
        "bytes_per_token": datamodule.bytes_per_token,
    }


def build_datamodule(cfg: DictConfig, batch_size: int, emulate_world_size: int | None = None) -> Any:
    """`cfg.datamodule` serving `batch_size` rows per step and device (also eval.py's); `emulate_world_size`:
    debug.emulate_world_size of a training run."""
    # `data` and `tokenizer` are passed as they are (not walked): the data code names a value left unset
    # (`???`) by its key, e.g. data.path.
    kwargs: dict[str, Any] = {"batch_size": batch_size, "seed": int(cfg.seed), "cache_dir": cfg.paths.cache_dir,
                              "_recursive_": False}
    emulate = emulate_world_size or 1
    if emulate > 1:  # one process draws the rows of `emulate` ranks per step (see EmulatedWorldDataModule)
        target = f"{EmulatedWorldDataModule.__module__}.{EmulatedWorldDataModule.__qualname__}"
        kwargs.update(_target_=target, world=emulate, batch_size=batch_size // emulate)
    return instantiate(cfg.datamodule, **kwargs)


def build_module(summary: dict, vocab_size: int) -> Any:
    """The LightningModule of the run's config (saved in its checkpoints)."""
    from pelab.harness.module import LMModule

    module = LMModule(summary["config"], vocab_size=vocab_size)
    summary["model"] = {
        "params": module.model.num_params(exclude_embedding=False),
        "params_non_embedding": module.model.num_params(exclude_embedding=True),
        # every encoding a layer uses (a layout's others too)
        "pe_params": sum(pe.num_learnable_params() for pe in module.model.encodings().values()),
        "flops_per_token": module.flops_per_token,
    }
    return module


def build_trainer(cfg: DictConfig, settings: TrainSettings, precision: str, job: JobRecord,
                  signals: tuple[int, ...]) -> tuple[Any, Any]:
    """The Trainer of `cfg.trainer`, with the callbacks of `cfg.callbacks` and the loggers of `cfg.logger`
    (the W&B logger wraps this job's run; the CSV log keeps the rows before the resumed step), plus the
    preemption checkpoint, summary.json updates and atomic checkpoint writes."""
    from lightning.pytorch.callbacks.progress import ProgressBar

    from pelab.harness.callbacks import PreemptionCheckpoint, SummaryUpdates
    from pelab.harness.checkpoints import AtomicCheckpointIO

    callbacks = instantiate_entries(cfg.get("callbacks"))  # the group removed (~callbacks): none
    if settings.eval.at:
        from pelab.harness.along_training import EvaluationAlongTraining

        callbacks.append(EvaluationAlongTraining(settings.eval, settings.data.seq_len, on_point=job.add_point))
    preemption = PreemptionCheckpoint(job.output_dir / "checkpoints" / "last.ckpt", signals, job.quit_now)
    resumed_step = (job.summary.get("resumed_from") or {}).get("step")
    # No W&B run (disabled, or not rank 0): no W&B logger.
    loggers = instantiate_entries(cfg.get("logger"), skip=() if job.run else ("wandb",),
                                  wandb={"experiment": job.run}, csv={"resume_step": resumed_step})
    trainer = instantiate(
        cfg.trainer,
        precision=precision,
        logger=loggers or False,
        callbacks=[preemption, *callbacks, SummaryUpdates(job)],  # the stop first: nothing runs after it
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(job.output_dir),
        enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
        _convert_="all",
    )
    return trainer, preemption


def instantiate_entries(group: DictConfig | None, skip: tuple[str, ...] = (), **kwargs: dict) -> list:
    """The objects of a config group made of `_target_` entries (callbacks, logger); an entry set to null or
    false is switched off. `kwargs[name]`: extra arguments for entry `name`."""
    return [instantiate(node, **kwargs.get(name, {})) for name, node in (group or {}).items()
            if isinstance(node, DictConfig) and "_target_" in node and name not in skip]


# -- one process drawing a DDP run's data (debug.emulate_world_size) ------------------------------------
class RankUnion(IterableDataset):
    """Batch `step` = rows of rank 0, then rank 1, ...: what a W-rank run trains on at that step."""

    def __init__(self, parts: list[IterableDataset]):
        self.parts = parts

    def __iter__(self) -> Iterator[torch.Tensor]:
        for rows in zip(*self.parts):  # each (B/W, T+1)
            yield torch.cat(rows)  # (B, T+1)


class EmulatedWorldDataModule(LMDataModule):
    """`LMDataModule` whose training stream is the union of `world` ranks' streams; `batch_size` is per rank.
    DDP averages the ranks' gradients, i.e. the gradient of the mean loss over these same B rows."""

    def __init__(self, *args: Any, world: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.world = int(world)

    def train_dataset(self, start_step: int | None = None, rank: int | None = None) -> IterableDataset:
        return RankUnion([super(EmulatedWorldDataModule, self).train_dataset(start_step, rank=r)
                          for r in range(self.world)])
