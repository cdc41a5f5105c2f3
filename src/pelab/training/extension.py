"""Context extension: a NEW run initialised from another run's weights (`extend.from=`).

The protocol of position interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023): train at L, fine-tune
briefly at L' > L. The child takes the parent's weights only (no optimizer state, step 0); the parent must have
the same model shape, encoding and tokenizer, which is checked before any data is built.

PoSE (Zhu et al. 2024, `extend.pose_length=L'`): fine-tune at the parent's L itself with position ids that skip to
cover L' (`pelab.encodings.pose`, drawn by the training step), with PI or YaRN as the paper (pe.scaling, factor
L' / L). Against full-length fine-tuning at equal compute: the same optimizer steps and tokens per step (data.
batch_size x L' / L rows of L), fewer FLOPs (the attention term scales with the row length). `pose_check`: the
positions it draws fit the encoding, before any data is built.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.encodings import pe_settings, resolve_pe_config
from pelab.errors import ConfigError
from pelab.model import build_model
from pelab.summary import read_summary
from pelab.training.checkpoints import checkpoint_mismatches, load_run_checkpoint, model_state

log = logging.getLogger(__name__)


def extension_parent(cfg: DictConfig) -> dict | None:
    """`extend.from` (a .ckpt or a run folder): the parent run whose weights initialise this run, as a record
    (path, name, step, W&B run id, training length, vocabulary size) for `extend.parent`; None without one.
    Refuses, before any data is built, a parent of another model shape, encoding or tokenizer.

    A child whose encoding config stretches positions relative to its training length (`PEConfig.
    extends_context`, e.g. a RoPE scaling) and leaves `pe.train_length` null gets the PARENT's training length
    there (set in `cfg.pe`): PI and YaRN scale relative to the length the weights were trained at, not to the
    child's data.seq_len."""
    pose_check(cfg)
    source = OmegaConf.select(cfg, "extend.from")  # extend: null (or no extend group) is no parent either
    if source in (None, ""):
        return None
    path = parent_checkpoint(str(source))
    ckpt = load_run_checkpoint(path, key="extend.from")
    hp = ckpt["hyper_parameters"]
    pcfg = hp["cfg"]
    child = OmegaConf.to_container(cfg, resolve=True)
    # the encoding's knobs may change (that is the point); its identity may not
    diffs = [d for d in checkpoint_mismatches(pcfg, child)
             if not d.startswith("pe.") or d.startswith(("pe.name=", "pe._target_="))]
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise ConfigError(f"extend.from={source} cannot initialise this run: {'; '.join(diffs[:3])}{more}; "
                          "extend with the parent's model.*, pe= and tokenizer.* settings.")
    parent_seq_len = int(pcfg["data"]["seq_len"])
    # the length the parent's encoding was fitted to: its pe.train_length, null (or absent, in a config written
    # before the key existed) meaning its data.seq_len: the encoding's schema resolves it
    parent_train_length = int(pe_settings(pcfg["pe"], d_model=pcfg["model"]["d_model"],
                                          n_heads=pcfg["model"]["n_heads"], train_length=parent_seq_len).train_length)
    if cfg.pe.train_length is None and pe_extends_context(cfg):
        cfg.pe.train_length = parent_train_length
        resolve_pe_config(cfg.pe, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, train_length=parent_train_length)
    weights_fit(cfg, ckpt["state_dict"], int(hp["vocab_size"]), source)
    run_dir = path.parent.parent  # <run>/checkpoints/<file>.ckpt
    wandb_info = (read_summary(run_dir).get("wandb") or {}) if (run_dir / "summary.json").is_file() else {}
    parent = {"path": str(path.resolve()), "name": pcfg["name"], "step": int(ckpt.get("global_step", 0)),
              "wandb_run_id": wandb_info.get("id"), "train_length": parent_train_length, "seq_len": parent_seq_len,
              "vocab_size": hp.get("vocab_size")}
    log.info("extending %s (step %d, trained at L=%d)", path, parent["step"], parent["train_length"])
    return parent


def pose_check(cfg: DictConfig) -> None:
    """`extend.pose_length` (typed and above data.seq_len by `pelab.tasks.config.check_extend`): every position it
    draws, up to pose_length - 1, must be one the run's encodings can represent (a learned table ends at its size),
    before any data is built."""
    from pelab.errors import PositionOutOfRange

    pose = OmegaConf.select(cfg, "extend.pose_length")
    if pose is None:
        return
    model = build_model(cfg.model, cfg.pe, 2, int(cfg.data.seq_len))  # the encodings' range; no data needed
    try:
        for pe in model.encodings().values():
            pe.check_positions(largest=int(pose) - 1)
    except PositionOutOfRange as err:
        raise ConfigError(f"extend.pose_length={pose} reaches position {int(pose) - 1}, past this run's encoding: "
                          f"{err}") from None
    if not pe_extends_context(cfg):
        log.info("PoSE to %d positions without interpolation (pe.scaling.type=none): the paper pairs it with "
                 "linear or yarn, factor extend.pose_length / L", pose)


def pe_extends_context(cfg: DictConfig) -> bool:
    """Whether the run's encoding config stretches positions relative to its training length."""
    return pe_settings(cfg.pe, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads,
                       train_length=int(cfg.data.seq_len)).extends_context


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
    state = model_state(load_run_checkpoint(path, key="extend.from"))
    try:
        module.model.load_state_dict(state)
    except RuntimeError as err:  # e.g. a learned position table sized by the parent's length
        raise ConfigError(f"extend.from={path}: the parent's weights do not fit this run's model "
                          f"({str(err).splitlines()[0]}); keep the parent's pe.* table sizes.") from err
