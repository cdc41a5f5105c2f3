"""`python train.py [overrides]`: compose -> validate -> data -> model -> fit -> evaluate, as one job of
`pelab.tasks.task.run_task` (summary.json, the W&B run and the exit codes: see there).

`train()` is the list of its steps; each step is a function below. The Trainer, its callbacks and loggers,
and the DataModule are instantiated from their `_target_` configs (conf/trainer, conf/callbacks, conf/logger,
conf/datamodule).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR
from pelab.errors import ConfigError
from pelab.tasks.task import Task, cli_main, launcher_rank, resolved_config, run_task

log = logging.getLogger(__name__)


# -- configuration ---------------------------------------------------------------------------------
def validate_config(cfg: DictConfig) -> None:
    """Every setting typed and range-checked before any data is built or any step is taken: the groups by
    pelab.schema, `pe` by its encoding's own schema. A bad one is a ConfigError naming the key."""
    from pelab.encodings import resolve_pe_config
    from pelab.schema import validate

    typed = validate(cfg)
    m = typed["model"]
    resolve_pe_config(cfg.pe, d_model=m.d_model, n_heads=m.n_heads, train_length=typed["data"].seq_len)


def train(cfg: DictConfig) -> dict:
    """One training job. Returns its summary (also written to `<output_dir>/summary.json`, from the start
    and whenever something new is known)."""
    import lightning.pytorch as L

    from pelab.harness.reliability import preemption_signals

    single_lightning_log_handler()
    output_dir = Path(cfg.paths.output_dir)
    signals = preemption_signals()
    with run_task(output_dir, rank=launcher_rank(), signals=signals, name=cfg.name) as task:
        summary = task.summary
        summary["config"] = resolved_config(cfg)
        task.save()
        # The W&B run before validation, so that a bad job of a sweep shows up there as failed.
        task.start_wandb((summary["config"].get("logger") or {}).get("wandb"), name=cfg.name,
                         config=summary["config"], tags=list(cfg.get("tags") or []), notes=cfg.get("notes"))
        validate_config(cfg)
        parent = extension_parent(cfg, task)
        precision, world = trainer_settings(cfg)
        ckpt_path, ckpt_vocab = resume_point(cfg, output_dir, summary)
        if parent and not ckpt_path:  # a resumed child already holds its own weights
            ckpt_vocab = parent["vocab_size"]
        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
        datamodule = prepare_data(cfg, int(cfg.data.batch_size) // world, summary, ckpt_path or
                                  (parent or {}).get("path"), ckpt_vocab)
        module = build_module(summary, datamodule.vocab_size)
        if parent and not ckpt_path:
            load_parent_weights(module, parent["path"])
        task.save()
        log_run_start(task, module, datamodule, cfg)
        before = {}
        if parent and not ckpt_path and cfg.extend.get("eval_before") and launcher_rank() == 0:
            from pelab.evaluation.suite import run_evaluation

            # the parent's weights under the child's settings, before any step: the "step 0" of PI's tables
            before = run_evaluation(module.model, datamodule, cfg, output_dir, task.run, summary, prefix="step0")
            summary["metrics"] = dict(before)
            task.save()
        trainer, preemption = build_trainer(cfg, precision, task, signals)
        summary["metrics"] = {**fit(trainer, module, datamodule, ckpt_path, preemption, summary), **before}
        task.save()  # the training metrics stay whatever happens in evaluation
        if cfg.get("evaluate_after_fit", True) and trainer.is_global_zero:
            from pelab.evaluation.suite import run_evaluation

            summary["metrics"].update(run_evaluation(module.model, datamodule, cfg, output_dir, task.run, summary))
    return task.summary


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    return objective(cli_main(train, cfg), cfg.optimized_metric)


# -- the steps of train() ------------------------------------------------------------------------------
# -- context extension: a new run from another run's weights -----------------------------------------
def extension_parent(cfg: DictConfig, task: Task) -> dict | None:
    """`extend.from` (a .ckpt or a run folder): the parent run whose weights initialise this NEW run (its
    optimizer state and step are not taken: the protocol of position interpolation, Chen et al. 2023, and
    YaRN, Peng et al. 2023: train at L, fine-tune briefly at L' > L). Refuses, before any data is built, a
    parent of another model shape, encoding or tokenizer. Records the parent (path, W&B run id, training
    length) in `extend.parent` of the run's config: summary.json, the W&B config and the checkpoints.

    A child that scales its rotary frequencies (`pe.scaling.type` != none, for encodings whose schema
    `supports_scaling`) and leaves `pe.train_length` null gets the PARENT's training length there: PI and
    YaRN scale relative to the length the weights were trained at, not to the child's data.seq_len."""
    from pelab.encodings import pe_schema
    from pelab.harness.reliability import CheckpointError, checkpoint_mismatches, read_checkpoint

    source = (cfg.get("extend") or {}).get("from")
    if source in (None, ""):
        return None
    path = parent_checkpoint(str(source))
    ckpt = read_checkpoint(path)
    hp = ckpt.get("hyper_parameters") or {}
    if "cfg" not in hp or "state_dict" not in ckpt:
        raise ConfigError(f"extend.from={source} was not written by pelab's train.py (no training config inside).")
    pcfg = hp["cfg"]
    child = OmegaConf.to_container(cfg, resolve=True)
    diffs = [d for d in checkpoint_mismatches(pcfg, child)
             if not d.startswith(("pe.", "model.attn_logit_scale=")) or d.startswith(("pe.name=", "pe._target_="))]
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise ConfigError(f"extend.from={source} cannot initialise this run: {'; '.join(diffs[:3])}{more}; "
                          "extend with the parent's model.*, pe= and tokenizer.* settings.")
    p_len = int(pcfg["data"]["seq_len"])
    p_pe_len = (pcfg.get("pe") or {}).get("train_length") or p_len
    scaled = pe_schema(cfg.pe).supports_scaling and str(cfg.pe.get("scaling", {}).get("type", "none")) != "none"
    if scaled and cfg.pe.get("train_length") is None:
        cfg.pe.train_length = int(p_pe_len)
        validate_config(cfg)
    if hp.get("vocab_size") is None:
        raise CheckpointError(f"extend.from={source} records no vocabulary size; it cannot be checked.")
    weights_fit(cfg, ckpt["state_dict"], int(hp["vocab_size"]), source)
    run_dir = path.parent.parent  # <run>/checkpoints/<file>.ckpt
    wandb_info = {}
    if (run_dir / "summary.json").is_file():
        from pelab.summary import read_summary

        wandb_info = read_summary(run_dir).get("wandb") or {}
    parent = {"path": str(path.resolve()), "name": pcfg.get("name"), "step": int(ckpt.get("global_step", 0)),
              "wandb_run_id": wandb_info.get("id"), "train_length": int(p_pe_len), "seq_len": p_len,
              "vocab_size": hp.get("vocab_size")}
    cfg.extend.parent = parent
    task.summary["config"] = resolved_config(cfg)
    task.summary["extended_from"] = parent
    task.save()
    if task.run is not None:
        from pelab.harness.loggers import guarded

        guarded("config update", task.run.config.update,
                {"extend": task.summary["config"]["extend"], "pe": task.summary["config"]["pe"]},
                allow_val_change=True)
    log.info("extending %s (step %d, trained at L=%d)", path, parent["step"], parent["train_length"])
    return parent


def parent_checkpoint(source: str) -> Path:
    """A .ckpt file as is; a run folder -> its checkpoints/last.ckpt (the final weights)."""
    path = Path(source)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise ConfigError(f"extend.from={source}: no such checkpoint; pass a .ckpt file or a run folder "
                          "with checkpoints/last.ckpt.")
    return path


def weights_fit(cfg: DictConfig, state_dict: dict, vocab_size: int, source: str) -> None:
    """The parent's tensors against this run's model, by shape, before any data is built (a model of
    these sizes costs nothing next to the data): e.g. a learned position table sized by the parent's length."""
    from pelab.model import build_model

    model = build_model(cfg.model, cfg.pe, vocab_size, int(cfg.data.seq_len))
    own = {f"model.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in state_dict.items() if k.startswith("model.")}
    bad = [f"{k[6:]} {theirs.get(k)} in the parent but {own.get(k)} here" for k in sorted(set(own) | set(theirs))
           if own.get(k) != theirs.get(k)]
    if bad:
        raise ConfigError(f"extend.from={source}: the parent's weights do not fit this run's model: {bad[0]}"
                          + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
                          + "; keep the parent's model.* and pe.* sizes (a learned position table cannot grow past the "
                          "parent's: extend such a parent at its own length).")


def load_parent_weights(module: Any, path: str) -> None:
    """The parent's model weights into the new run's model (strict: every tensor, no optimizer state)."""
    from pelab.harness.reliability import read_checkpoint

    state = {k[len("model."):]: v for k, v in read_checkpoint(path)["state_dict"].items() if k.startswith("model.")}
    try:
        module.model.load_state_dict(state)
    except RuntimeError as err:  # e.g. a learned position table sized by the parent's length
        raise ConfigError(f"extend.from={path}: the parent's weights do not fit this run's model "
                          f"({str(err).splitlines()[0]}); keep the parent's pe.* table sizes.") from err


def trainer_settings(cfg: DictConfig) -> tuple[str, int]:
    """The precision (`auto`: bf16-mixed on GPU, 32-true on CPU, where bf16 matmul is ~200x slower) and the
    number of devices, checked against the batch size; on CUDA also sets `matmul_precision`."""
    t = OmegaConf.to_container(cfg.trainer, resolve=True)
    precision = t.get("precision")
    if precision == "auto":
        precision = "bf16-mixed" if on_cuda(t) else "32-true"
    if on_cuda(t):
        # TF32 for the fp32 matmuls left outside autocast (Lightning warns when this is unset on tensor cores)
        torch.set_float32_matmul_precision(cfg.matmul_precision)
    world = world_size_of(t)
    if int(cfg.data.batch_size) % world:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} (global) is not divisible by the {world} devices; "
            "change data.batch_size or trainer.devices."
        )
    if world > 1 and (cfg.get("debug") or {}).get("emulate_world_size"):
        raise ConfigError("debug.emulate_world_size emulates several ranks in one process; "
                          "use it with one device (trainer=cpu) or drop it.")
    return precision, world


def on_cuda(tcfg: dict) -> bool:
    """Whether this trainer config trains on CUDA devices."""
    return torch.cuda.is_available() and tcfg.get("accelerator") in ("auto", "gpu", "cuda")


def world_size_of(tcfg: dict) -> int:
    devices = tcfg.get("devices", 1)
    if devices in (-1, "auto", "-1"):
        devices = max(1, torch.cuda.device_count()) if tcfg.get("accelerator") != "cpu" else 1
    n = len(devices) if isinstance(devices, (list, tuple)) else int(devices)
    return n * int(tcfg.get("num_nodes", 1))


def resume_point(cfg: DictConfig, output_dir: Path, summary: dict) -> tuple[str | None, int | None]:
    """The checkpoint to resume from (`ckpt_path`) and its vocabulary size; another model's / tokenizer's
    checkpoint is refused here, before any data is built."""
    from pelab.harness.reliability import check_resume_checkpoint

    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), output_dir)
    if not ckpt_path:
        return None, None
    step, vocab_size = check_resume_checkpoint(ckpt_path, summary["config"])
    summary["resumed_from"] = {"ckpt_path": ckpt_path, "step": step}
    log.info("resuming from %s (step %d)", ckpt_path, step)
    return ckpt_path, vocab_size


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> str | None:
    """null: fresh run; "auto": this run folder's newest checkpoint (last.ckpt, or a SLURM requeue
    checkpoint) if there is one, else a fresh run; or a path."""
    from pelab.harness.reliability import newest_checkpoint

    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "auto":
        newest = newest_checkpoint(output_dir)
        return str(newest) if newest else None
    if not Path(ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={ckpt_path} does not exist; pass a .ckpt file, 'auto' or null.")
    return ckpt_path


def prepare_data(cfg: DictConfig, batch_size: int, summary: dict, ckpt_path: str | None = None,
                 ckpt_vocab: int | None = None) -> Any:
    """The DataModule with its token cache built (the first real cost of a run)."""
    from pelab.harness.reliability import CheckpointError

    datamodule = build_datamodule(cfg, batch_size)
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


def build_datamodule(cfg: DictConfig, batch_size: int) -> Any:
    """`cfg.datamodule` serving `batch_size` rows per step and device (also eval.py's)."""
    from pelab.harness.reliability import EmulatedWorldDataModule

    # `data` and `tokenizer` are passed as they are (not walked): the data code names a value left unset
    # (`???`) by its key, e.g. data.path.
    kwargs: dict[str, Any] = {"batch_size": batch_size, "seed": int(cfg.get("seed", 0)),
                              "cache_dir": cfg.paths.get("cache_dir"), "_recursive_": False}
    emulate = int((cfg.get("debug") or {}).get("emulate_world_size") or 1)
    if emulate > 1:  # one process draws the rows of `emulate` ranks per step (see pelab.harness.reliability)
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
        "pe_params": module.model.pe.num_learnable_params(),
        "flops_per_token": module.flops_per_token,
    }
    return module


def log_run_start(task: Task, module: Any, datamodule: Any, cfg: DictConfig) -> None:
    """What W&B learns before the first step: the data fingerprint, the model's size, PE diagnostics."""
    from pelab.harness.loggers import guarded

    if task.run is None:
        return
    guarded("config update", task.run.config.update,
            {"data_fingerprint": datamodule.fingerprint, "model_info": task.summary["model"]},
            allow_val_change=True)
    guarded("PE diagnostics", log_pe_diagnostics, task.run, module.model, int(cfg.data.seq_len), task.output_dir)


def build_trainer(cfg: DictConfig, precision: str, task: Task, signals: tuple[int, ...]) -> tuple[Any, Any]:
    """The Trainer of `cfg.trainer`, with the callbacks of `cfg.callbacks` and the loggers of `cfg.logger`
    (the W&B logger wraps this job's run; the CSV log keeps the rows before the resumed step), plus the
    preemption checkpoint, summary.json updates and atomic checkpoint writes."""
    from lightning.pytorch.callbacks.progress import ProgressBar

    from pelab.harness.callbacks import SummaryUpdates
    from pelab.harness.reliability import AtomicCheckpointIO, PreemptionCheckpoint

    callbacks = instantiate_entries(cfg.get("callbacks"))
    preemption = PreemptionCheckpoint(task.output_dir / "checkpoints" / "last.ckpt", signals, task.quit_now)
    resumed_step = (task.summary.get("resumed_from") or {}).get("step")
    # No W&B run (disabled, or not rank 0): no W&B logger.
    loggers = instantiate_entries(cfg.get("logger"), skip=() if task.run else ("wandb",),
                                  wandb={"experiment": task.run}, csv={"resume_step": resumed_step})
    trainer = instantiate(
        cfg.trainer,
        precision=precision,
        logger=loggers or False,
        callbacks=[preemption, *callbacks, SummaryUpdates(task)],  # the stop first: nothing runs after it
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(task.output_dir),
        enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
        _convert_="all",
    )
    return trainer, preemption


def instantiate_entries(group: DictConfig | None, skip: tuple[str, ...] = (), **kwargs: dict) -> list:
    """The objects of a config group made of `_target_` entries (callbacks, logger); an entry set to null or
    false is switched off. `kwargs[name]`: extra arguments for entry `name`."""
    return [instantiate(node, **kwargs.get(name, {})) for name, node in (group or {}).items()
            if isinstance(node, DictConfig) and "_target_" in node and name not in skip]


def fit(trainer: Any, module: Any, datamodule: Any, ckpt_path: str | None, preemption: Any,
        summary: dict) -> dict[str, float]:
    """Train; returns the final val/ and train/ metrics (those saved in the checkpoint when a relaunch has
    no step left to train, e.g. after a preemption during the evaluation)."""
    from pelab.harness.reliability import Preempted

    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    if preemption.received is not None:  # signalled during the final validation: last.ckpt is final
        raise Preempted(preemption.received, step=trainer.global_step, ckpt=preemption.ckpt_path)
    summary["start_step"] = module.start_step if module.start_step is not None else module.last_ckpt_step
    summary["global_step"] = final_step(trainer, Path(summary["output_dir"]))
    summary["nonfinite_skips"] = module.nonfinite_skips
    return module.run_metrics(trainer)


def single_lightning_log_handler() -> None:
    """`import lightning` adds its own console handler; under Hydra the root logger already prints (and
    writes the job's log file), so every Lightning message would appear twice."""
    lightning_logger = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)


def final_step(trainer: Any, output_dir: Path) -> int:
    """The step training ended at. Under ddp_spawn the loop ran in child processes and this process's
    trainer still says 0, so the step comes from the checkpoint the ranks wrote."""
    if trainer.global_step > 0:
        return int(trainer.global_step)
    last = output_dir / "checkpoints" / "last.ckpt"
    if last.exists():
        return int(torch.load(last, map_location="cpu", weights_only=False).get("global_step", 0))
    return 0


def log_pe_diagnostics(run: Any, model: Any, seq_len: int, output_dir: Path) -> None:
    """Parameter count, neighbour similarity and the position-table heatmap, logged once at start."""
    import wandb

    from pelab.encodings.diagnostics import encoding_report

    report = encoding_report(model.pe, n_positions=seq_len, figures=True)
    figs = report.pop("figures", {})
    scalars = {f"pe/{k}": v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    plot_dir = output_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    media = {}
    for key, fig in figs.items():
        path = plot_dir / f"pe_{key}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        media[f"pe/{key}"] = wandb.Image(str(path))
    run.summary.update(scalars)
    run.log({**scalars, **media})


def objective(summary: dict, metric: str) -> float:
    """Value returned to sweepers; a failed or missing metric is +inf (never a crash of the sweep)."""
    value = (summary.get("metrics") or {}).get(metric)
    return float(value) if value is not None and math.isfinite(float(value)) else float("inf")


if __name__ == "__main__":
    main()
