"""Builders of a run's parts from its config: the DataModule, the LightningModule, the Trainer with its
callbacks and loggers, and the resume point. Used by `pelab.tasks.train` and `pelab.tasks.evaluate`.

The Trainer, its callbacks and loggers, and the DataModule are instantiated from their `_target_` configs
(conf/trainer, conf/callbacks, conf/logger, conf/data).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pelab.data.datamodule import EmulatedWorldDataModule
from pelab.errors import CheckpointError, ConfigError
from pelab.training.config import TrainerConfig, TrainSettings, check_world, explicit_world_size
from pelab.training.job import JobRecord

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
    from pelab.runs.folder import check_resume_checkpoint, resolve_ckpt_path

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
    """The DataModule `cfg.data._target_` names, given the rest of `cfg.data` as `data`, `cfg.tokenizer`, the seed
    and the token cache folder, serving `batch_size` rows per step and device (also eval.py's);
    `emulate_world_size`: debug.emulate_world_size of a training run."""
    # resolved but not walked: the data code names a value left unset (`???`) by its key, e.g. data.path
    data = OmegaConf.to_container(cfg.data, resolve=True)
    target = data.pop("_target_", None)
    if not target:  # a config recorded before the data group named it: pelab.tasks.evaluate.todays_form reads it
        raise ConfigError("data._target_ is not set: the data config names the DataModule to build "
                          "(conf/data/_loader.yaml).")
    kwargs: dict[str, Any] = {"data": data, "tokenizer": OmegaConf.to_container(cfg.tokenizer, resolve=True),
                              "batch_size": batch_size, "seed": int(cfg.seed), "cache_dir": cfg.paths.cache_dir,
                              "_recursive_": False}
    emulate = emulate_world_size or 1
    if emulate > 1:  # one process draws the rows of `emulate` ranks per step (see EmulatedWorldDataModule)
        target = f"{EmulatedWorldDataModule.__module__}.{EmulatedWorldDataModule.__qualname__}"
        kwargs.update(world=emulate, batch_size=batch_size // emulate)
    return instantiate({"_target_": target}, **kwargs)


def build_module(summary: dict, vocab_size: int) -> Any:
    """The LightningModule of the run's config (saved in its checkpoints)."""
    from pelab.training.module import LMModule

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

    from pelab.training.callbacks.preemption import PreemptionCheckpoint
    from pelab.training.callbacks.summary_updates import SummaryUpdates
    from pelab.training.checkpoints import AtomicCheckpointIO

    callbacks = instantiate_entries(cfg.get("callbacks"))  # the group removed (~callbacks): none
    if settings.eval.at:
        from pelab.training.callbacks.along_training import EvaluationAlongTraining

        callbacks.append(EvaluationAlongTraining(settings.eval, settings.data.seq_len, on_point=job.add_point,
                                                 probes=settings.probes if settings.eval.at_probes else None))
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
