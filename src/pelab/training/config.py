"""The training's config schema: `optim`, the `trainer` keys pelab relies on, and pelab's own `callbacks`
entries, typed and range-checked before any data or training cost. The values live in conf/optim/,
conf/trainer/ and conf/callbacks/."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.checks import is_int, need, resolved_value, show, typed_group
from pelab.data.config import LoaderConfig, TokenizerConfig
from pelab.encodings.settings import PEConfig
from pelab.errors import ConfigError
from pelab.evaluation.config import EvalConfig, ProbesConfig
from pelab.model.config import GPTConfig

# What builds the optimizer and its schedule when a config names none (the records of runs and checkpoints
# written before optim had a `_target_`, optim groups built by hand): conf/optim/adamw.yaml's.
OPTIMIZER = "pelab.training.optimizer.adamw_cosine"


@dataclass
class OptimConfig:
    lr: float
    weight_decay: float
    betas: list[float]
    eps: float
    warmup_steps: int
    min_lr_ratio: float
    grad_clip: float
    nonfinite: str
    max_skips: int
    fused: bool | None  # null = on CUDA only
    # (model, this config, device, max_steps) -> Lightning's configure_optimizers answer
    _target_: str = OPTIMIZER


@dataclass
class TrainerConfig:
    """The Trainer keys pelab relies on; other Lightning Trainer keywords pass through untyped."""

    accelerator: str  # auto, cpu, gpu, cuda, ... (Lightning's)
    max_steps: int
    val_check_interval: Any  # an int number of steps (checked below)
    log_every_n_steps: int
    devices: Any  # n, -1 / "auto" (all), or a list of device ids
    num_nodes: int
    precision: Any  # a Lightning precision, or "auto"


@dataclass
class CheckpointConfig:
    """callbacks.checkpoint (pelab.training.callbacks.checkpoint.RunCheckpoint), in the keys checked here."""

    mode: str
    every_n_steps: int | None


@dataclass
class ThroughputConfig:
    """callbacks.throughput (pelab.training.callbacks.throughput.TokenThroughput)."""

    available_flops: float | None


# `callbacks` holds `_target_` entries (null or false = off; more may be added): pelab's own are typed.
CALLBACKS = {"checkpoint": CheckpointConfig, "throughput": ThroughputConfig}


def check_optim(o: DictConfig) -> None:
    need(0 < o.lr < math.inf, "optim.lr", o.lr, "must be a finite number > 0.")
    need(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0.")
    need(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas", o.betas,
         "must be two numbers in [0, 1), e.g. [0.9, 0.95].")
    need(o.eps > 0, "optim.eps", o.eps, "must be > 0.")
    need(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, "must be >= 0.")
    need(0.0 <= o.min_lr_ratio <= 1.0, "optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1].")
    need(o.grad_clip >= 0, "optim.grad_clip", o.grad_clip, "must be >= 0 (0 = no clipping).")
    need(o.nonfinite in ("stop", "skip"), "optim.nonfinite", o.nonfinite, "must be 'stop' or 'skip'.")
    need(o.max_skips >= 0, "optim.max_skips", o.max_skips, "must be >= 0.")
    need(_importable(o._target_), "optim._target_", o._target_,
         f"must name the function that builds the optimizer and its schedule (module.function), e.g. {OPTIMIZER}.")


def _importable(target: str) -> bool:
    """Whether `target`'s module (module.function) can be found, without importing the module itself (torch)."""
    import importlib.util

    module, _, name = target.rpartition(".")
    try:
        return bool(module and name) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that does not exist
        return False


# Every precision Lightning 2.x accepts (the Literal types `lightning.fabric.connector._PRECISION_INPUT`), plus our
# "auto"; written out so that a config is checked without importing Lightning (torch). tests/test_training_config.py
# checks it equals the installed Lightning's list.
PRECISIONS = (64, 32, 16, "transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true",
              "bf16-mixed", "32-true", "64-true", "64", "32", "16", "bf16", "auto")


def check_trainer(t: DictConfig) -> None:
    need(t.max_steps >= 1, "trainer.max_steps", t.max_steps,
         "must be a positive number of steps (the batch stream is endless: -1 would never stop).")
    need(is_int(t.val_check_interval) and t.val_check_interval >= 1, "trainer.val_check_interval",
         t.val_check_interval, "must be a positive whole number of steps (the batch stream has no epochs).")
    need(t.log_every_n_steps >= 1, "trainer.log_every_n_steps", t.log_every_n_steps, "must be >= 1.")
    devices = t.devices
    ok = (devices in (-1, "-1", "auto") or (is_int(devices) and devices >= 1)
          or (OmegaConf.is_list(devices) and len(devices) > 0 and all(is_int(i) and i >= 0 for i in devices)))
    need(ok, "trainer.devices", devices, "must be a number of devices >= 1, -1 or auto (all), or a list of ids.")
    need(t.num_nodes >= 1, "trainer.num_nodes", t.num_nodes, "must be >= 1.")
    need(t.precision in PRECISIONS, "trainer.precision", t.precision, f"must be one of {show(PRECISIONS)}.")


def _count(low: int) -> tuple[Any, str]:
    return (lambda v: is_int(v) and v >= low), f"must be a whole number >= {low}"


def _optional(rule: tuple[Any, str]) -> tuple[Any, str]:
    return (lambda v: v is None or rule[0](v)), f"{rule[1]} (or null)"


def _fraction_or_count(v: Any) -> bool:  # Lightning's limit_*_batches: a share of the batches or a number of them
    return v is None or (is_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0)


def _flag(v: Any) -> bool:
    return v is None or isinstance(v, bool)  # null: Lightning's default (benchmark, enable_model_summary)


LIMIT_RULE = "must be a share in [0.0, 1.0] or a whole number of batches >= 0 (or null)"
FLAGS = ("benchmark", "inference_mode", "use_distributed_sampler", "enable_model_summary", "barebones",
         "sync_batchnorm", "detect_anomaly")
# Lightning Trainer keywords given with `+trainer.<key>=` (pelab reads them not, Lightning takes them as they
# are): Lightning accepts a wrong value at construction and fails in the middle of fit (accumulate_grad_batches=0:
# a ZeroDivisionError after the data is built), so the numeric and flag ones are checked here, before any cost.
# The other keywords pass to Lightning unchecked.
PASSTHROUGH_RULES: dict[str, tuple[Any, str]] = {
    "accumulate_grad_batches": _count(1),
    "gradient_clip_val": ((lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool) and v >= 0)),
                          "must be a number >= 0 (or null)"),
    "gradient_clip_algorithm": ((lambda v: v in (None, "norm", "value")), "must be norm or value (or null)"),
    "max_epochs": _optional(_count(-1)),
    "min_epochs": _optional(_count(0)),
    "min_steps": _optional(_count(-1)),
    "check_val_every_n_epoch": _optional(_count(1)),
    "num_sanity_val_steps": _optional(_count(-1)),
    "reload_dataloaders_every_n_epochs": _count(0),
    **{f"limit_{split}_batches": (_fraction_or_count, LIMIT_RULE) for split in ("train", "val", "test", "predict")},
    "overfit_batches": ((lambda v: _fraction_or_count(v) and v is not None),
                        "must be a share in [0.0, 1.0] or a whole number of batches >= 0"),
    **{key: (_flag, "must be true or false (or null)") for key in FLAGS},
    "deterministic": ((lambda v: v is None or isinstance(v, bool) or v == "warn"),
                      "must be true, false or warn (or null)"),
}


def check_trainer_passthrough(trainer: dict) -> None:
    """The `trainer.*` keys pelab does not type itself (`TrainerConfig`) against PASSTHROUGH_RULES: one line
    naming the key, before any data is built."""
    typed_keys = {f.name for f in fields(TrainerConfig)}
    for key, value in trainer.items():
        rule = PASSTHROUGH_RULES.get(key)
        if key not in typed_keys and rule is not None:
            need(rule[0](value), f"trainer.{key}", value, f"{rule[1]} (a Lightning Trainer keyword).")


def explicit_world_size(t: TrainerConfig) -> int | None:
    """The number of processes a trainer config asks for, when it names them (devices as a number or a list of
    ids, times num_nodes); None for -1 / auto (all the machine's GPUs: counted once torch is loaded)."""
    devices = t.devices
    if devices in (-1, "-1", "auto"):
        return None
    n = len(devices) if isinstance(devices, list | tuple) or OmegaConf.is_list(devices) else int(devices)
    return n * int(t.num_nodes)


def check_world(batch_size: int, world: int, emulate_world_size: int | None) -> None:
    """The global batch splits evenly over the processes; emulating ranks needs one process."""
    if batch_size % world:
        raise ConfigError(f"data.batch_size={batch_size} (global) is not divisible by the {world} devices; "
                          "change data.batch_size or trainer.devices.")
    if world > 1 and emulate_world_size:
        raise ConfigError("debug.emulate_world_size emulates several ranks in one process; "
                          "use it with one device (trainer=cpu) or drop it.")


def typed_callbacks(cfg: DictConfig) -> dict[str, DictConfig]:
    """pelab's callback entries that are on, typed in the keys checked here (only those are resolved)."""
    group = cfg.get("callbacks") or {}  # the group removed (~callbacks) or null: no callbacks
    out = {}
    for name, schema in CALLBACKS.items():
        if name in group and OmegaConf.is_dict(group[name]):  # an entry set to null / false is off
            entry = group[name]
            out[name] = typed_group(schema, {f.name: resolved_value(entry, f.name) for f in fields(schema)},
                                    f"callbacks.{name}")
    return out


def check_callbacks(c: dict[str, DictConfig]) -> None:
    if "checkpoint" in c:
        ck = c["checkpoint"]
        need(ck.mode in ("min", "max"), "callbacks.checkpoint.mode", ck.mode, "must be 'min' or 'max'.")
        need(ck.every_n_steps is None or ck.every_n_steps >= 1, "callbacks.checkpoint.every_n_steps",
             ck.every_n_steps, "must be a positive number of steps or null.")
    if "throughput" in c:
        flops = c["throughput"].available_flops
        need(flops is None or flops > 0, "callbacks.throughput.available_flops", flops, "must be > 0 or null.")


def wandb_entry(config: Any) -> Any:
    """The `logger.wandb` entry of a run config (as plain data), or None when the run logs to no W&B run:
    logger=csv (no such entry), the entry set to null, or the logger group removed (~logger)."""
    logger = config.get("logger") or {}
    entry = logger.get("wandb") or None
    return OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else entry


# -- the run's top-level keys, and the whole typed tree ----------------------------------------------
@dataclass
class DebugConfig:
    inject_nan_at_step: Any  # null, a step, or a list of steps
    emulate_world_size: int | None


@dataclass
class ProvenanceConfig:
    allow_dirty: bool  # a study run from a tree with uncommitted changes (pelab.tasks.preflight)


@dataclass
class RunConfig:
    """The top-level keys of conf/train.yaml (the groups are typed by their own schemas): what a run is called
    and how the job runs it."""

    seed: int
    name: str
    tags: list[str]
    notes: str | None
    optimized_metric: str
    ckpt_path: str | None
    compile: bool
    matmul_precision: str
    threads: Any
    evaluate_after_fit: bool
    debug: DebugConfig
    provenance: ProvenanceConfig


@dataclass(frozen=True)
class TrainSettings:
    """A train config typed once (pelab.tasks.config.validate, before torch is imported), each group as its
    layer's schema object; the training job reads its settings here. The DictConfig stays beside it for what Hydra
    instantiates by `_target_` (the DataModule, the Trainer, callbacks, loggers) and for the record."""

    run: RunConfig
    model: GPTConfig  # the vocabulary a stand-in until the data is built
    pe: PEConfig  # the encoding's resolved config (its own PEConfig subclass)
    data: LoaderConfig  # the loader keys (a corpus's own keys stay in the DictConfig)
    tokenizer: TokenizerConfig
    optim: OptimConfig
    trainer: TrainerConfig
    eval: EvalConfig
    probes: ProbesConfig
    callbacks: dict[str, Any]  # pelab's own callback entries that are on, typed
