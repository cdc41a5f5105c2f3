"""The one validation pass of a train config, run before any data, model or training cost.

Each layer owns its schema (types) and range checks: `pe` its encoding (`pelab.encodings`), `model`
`GPTConfig`, `data` / `tokenizer` `pelab.data.config`, `eval` / `probes` `pelab.evaluation.config`, `optim` /
`trainer` / `callbacks` `pelab.training.config`; this module adds the top-level keys of conf/train.yaml and
composes them. Every failure is one `ConfigError` line naming the key. The values (defaults) live in the YAML
files under conf/; the schemas hold types only (a field without a default is required, `???` to OmegaConf).
`data`, `trainer` and `tokenizer` are typed only in the keys pelab reads: a corpus has its own keys (path,
name, ...) and the Trainer takes any Lightning keyword.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import pelab.tasks.names  # noqa: F401  registers the resolver the run name uses (${pelab.sweep_suffix:})
from pelab.checks import is_int, need, resolved_value, show, typed_group
from pelab.data.config import LoaderConfig, TokenizerConfig, check_loader, check_reserved, check_tokenizer
from pelab.data.recall import import_plugins
from pelab.data.sources import check_source
from pelab.encodings import pe_settings
from pelab.errors import ConfigError
from pelab.evaluation.config import EvalConfig, ProbesConfig, check_at_probes, check_eval, check_probes
from pelab.model import GPTConfig
from pelab.model.config import validate_layout
from pelab.runs.folder import resolve_ckpt_path
from pelab.training.config import (
    PASSTHROUGH_RULES,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    TrainSettings,
    check_callbacks,
    check_optim,
    check_trainer,
    check_trainer_passthrough,
    check_world,
    explicit_world_size,
    typed_callbacks,
)

# Groups typed in the listed keys only (the others are free).
OPEN_GROUPS = ("data", "trainer", "tokenizer")
SCHEMAS = {"data": LoaderConfig, "tokenizer": TokenizerConfig, "optim": OptimConfig, "trainer": TrainerConfig,
           "eval": EvalConfig, "probes": ProbesConfig}
MATMUL_PRECISIONS = ("highest", "high", "medium")
EXTEND_KEYS = ("from", "eval_before", "pose_length", "parent")  # `from` is a Python keyword: no dataclass field


def check_run(r: DictConfig, batch_size: int) -> None:
    # numpy's SeedSequence and Lightning's seed_everything take 0 .. 2**32-1 (Lightning silently uses 0 outside).
    need(0 <= r.seed < 2**32, "seed", r.seed, "must be in [0, 2**32).")
    need(bool(r.optimized_metric), "optimized_metric", r.optimized_metric, "must name a metric, e.g. val/ppl.")
    need(r.matmul_precision in MATMUL_PRECISIONS, "matmul_precision", r.matmul_precision,
         f"must be one of {', '.join(MATMUL_PRECISIONS)} (torch.set_float32_matmul_precision).")
    need(r.threads == "auto" or (is_int(r.threads) and r.threads >= 1), "threads", r.threads,
         "must be auto (the cores free at the start) or a positive number of CPU threads.")
    nan_at = r.debug.inject_nan_at_step
    steps = list(nan_at) if OmegaConf.is_list(nan_at) else ([] if nan_at is None else [nan_at])
    need(all(is_int(s) and s >= 0 for s in steps), "debug.inject_nan_at_step", nan_at,
         "must be null, a step or a list of steps.")
    emulate = r.debug.emulate_world_size
    need(emulate is None or (emulate >= 1 and batch_size % emulate == 0), "debug.emulate_world_size", emulate,
         f"must be a positive divisor of data.batch_size={batch_size}.")


def check_ckpt_path(cfg: DictConfig) -> None:
    """`ckpt_path`: a missing file, a run folder without checkpoints or a truncated checkpoint is refused before
    torch is imported (`pelab.runs.folder.resolve_ckpt_path`); whose run it is, is checked once the
    checkpoint is read (before any data)."""
    ckpt = resolved_value(cfg, "ckpt_path") if "ckpt_path" in cfg else None
    if ckpt in (None, "", "null", "???", "auto"):
        return  # auto: this run's own folder, whatever it holds
    resolve_ckpt_path(str(ckpt), Path("."))


def check_extend(cfg: DictConfig) -> None:
    """`extend` (conf/train.yaml): null, or {from: a path or null, eval_before: bool, pose_length: a number of tokens
    above data.seq_len or null, parent: filled by train.py}."""
    e = resolved_value(cfg, "extend") if "extend" in cfg else None
    if e in (None, "???"):
        return
    need(isinstance(e, dict), "extend", e, "must be a group of settings (extend.from=<run folder or .ckpt>).")
    unknown = sorted(set(e) - set(EXTEND_KEYS))
    if unknown:
        raise ConfigError(f"extend.{unknown[0]} is not a setting of extend; known: {show(list(EXTEND_KEYS))}.")
    if "from" in e:  # the keys the file does not set are left to pelab.training.extension
        need(e["from"] is None or isinstance(e["from"], str), "extend.from", e["from"],
             "must be a .ckpt file or a run folder (or null).")
    if "eval_before" in e:
        need(isinstance(e["eval_before"], bool), "extend.eval_before", e["eval_before"], "must be true or false.")
    if e.get("pose_length") is not None:  # PoSE (pelab.encodings.pose): positions of a longer window
        seq_len, pose = resolved_value(cfg, "data").get("seq_len"), e["pose_length"]
        need(is_int(pose) and (not is_int(seq_len) or pose > seq_len), "extend.pose_length", pose,
             f"(PoSE's target length) must be a number of tokens above data.seq_len={seq_len}, or null (off).")
        randomized = OmegaConf.select(cfg, "pe.randomized.max_position")
        need(randomized is None, "extend.pose_length", pose, f"and pe.randomized.max_position={randomized} both "
             "choose the training positions; set one of them.")


# Where a `+key=value` may add a key no config has: Hydra's own, and a namespace for the user's own keys.
FREE_NAMESPACES = ("hydra", "extra")
TYPED_GROUPS = ("model", "pe", "eval", "probes", "optim")  # their schemas name an unknown key themselves


def check_additions(cfg: DictConfig, overrides: list[str]) -> None:
    """`+key=value` overrides that add a key no config reads: one line naming each, with the nearest known keys
    (Hydra's own typo hint sends users to `+`, which accepts anything). Allowed: config groups (`+experiment=`),
    `hydra.*`, `extra.*` (the user's own keys), any keyword of Lightning's Trainer under `trainer.`, and new
    `_target_` entries of `callbacks.` / `logger.` (and keys of entries that exist)."""
    import difflib
    import inspect

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pelab import CONF_DIR

    bad = []
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        parts = key.split(".")
        if not o.is_add() or parts[0] in FREE_NAMESPACES or parts[0] in TYPED_GROUPS:
            continue
        if (Path(CONF_DIR) / Path(*parts)).is_dir():  # a config group choice, e.g. +experiment=recall
            continue
        if parts[0] == "trainer" and len(parts) > 1:
            if parts[1] in PASSTHROUGH_RULES:  # a Trainer keyword checked by its rule: no Lightning import (seconds)
                continue
            import lightning.pytorch as L

            known = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
            if parts[1] in known:
                continue
            candidates = [f"trainer.{k}" for k in sorted(known)]
        elif parts[0] in ("callbacks", "logger") and len(parts) > 2 and (
                parts[2] == "_target_" or OmegaConf.select(cfg, f"{parts[0]}.{parts[1]}._target_") is not None):
            continue
        else:
            group = OmegaConf.select(cfg, parts[0]) if len(parts) > 1 else None
            candidates = ([f"{parts[0]}.{k}" for k in group] if OmegaConf.is_dict(group)
                          else [str(k) for k in cfg if k != key])
        near = difflib.get_close_matches(key, [c for c in candidates if c != key], n=3, cutoff=0.6)
        bad.append(f"+{key} is not a setting any config reads" + (f" (did you mean {', '.join(near)}?)" if near
                                                                   else ""))
    if bad:
        raise ConfigError("; ".join(bad) + ". Your own keys go under +extra.*; Hydra's under hydra.*.")


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> TrainSettings:
    """Type and range-check every group of a train config; return the typed tree (`TrainSettings`: each group
    as its schema's object, "run" = the top-level keys, "pe" the resolved encoding config). Cheap: no data, no
    model, no torch. `overrides`: the command line's (default: Hydra's record of them), checked for keys no
    config reads."""
    from hydra.core.hydra_config import HydraConfig

    if overrides is None and HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    check_additions(cfg, overrides or [])
    model = resolved_value(cfg, "model")
    if not isinstance(model, dict):
        typed_group(GPTConfig, model, "model")  # the one-line error for a missing / non-group model
    t: dict[str, Any] = {"model": GPTConfig.from_settings(model)}  # the vocabulary: a stand-in until the data
    t |= {g: typed_group(s, resolved_value(cfg, g), g, open_keys=g in OPEN_GROUPS) for g, s in SCHEMAS.items()}
    run_keys = {f.name: resolved_value(cfg, f.name) for f in fields(RunConfig) if f.name in cfg}
    t["run"] = typed_group(RunConfig, run_keys, "")
    t["callbacks"] = typed_callbacks(cfg)
    import_plugins(t["probes"].plugins)  # kinds from outside the package, before any kind list is checked
    check_loader(t["data"])
    check_source(resolved_value(cfg, "data"))
    check_tokenizer(t["tokenizer"])
    check_optim(t["optim"])
    check_trainer(t["trainer"])
    check_trainer_passthrough(resolved_value(cfg, "trainer"))
    check_callbacks(t["callbacks"])
    check_eval(t["eval"], t["data"].seq_len)
    check_probes(t["probes"], t["data"].seq_len)
    check_at_probes(t["eval"], t["probes"])
    check_reserved(t["tokenizer"], t["data"], t["probes"])
    check_run(t["run"], t["data"].batch_size)
    world = explicit_world_size(t["trainer"])
    if world is not None:  # -1 / auto: counted (and checked) once torch is loaded
        check_world(t["data"].batch_size, world, t["run"].debug.emulate_world_size)
    check_ckpt_path(cfg)
    check_extend(cfg)
    pe = pe_settings(cfg.pe, d_model=t["model"].d_model, n_heads=t["model"].n_heads, train_length=t["data"].seq_len)
    validate_layout(t["model"], pe, t["data"].seq_len)
    typed = {g: OmegaConf.to_object(v) for g, v in t.items() if g not in ("model", "callbacks")}
    return TrainSettings(**typed, model=t["model"], pe=pe,
                         callbacks={k: OmegaConf.to_object(v) for k, v in t["callbacks"].items()})
