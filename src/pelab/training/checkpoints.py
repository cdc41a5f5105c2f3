"""Checkpoint I/O, in one place: atomic writes, one reader with one check ("written by pelab's train.py"),
the settings that must match to resume, and the model weights inside.

- **Atomic checkpoints.** `AtomicCheckpointIO` writes `<name>.tmp-<pid>` and renames it, so a checkpoint file
  is complete or absent even when the process is SIGKILLed mid-write (Lightning writes in place).
- **Resume checks.** `checkpoint_mismatches`: the settings that must match to train a checkpoint's weights on
  (`pelab.runs.folder.check_resume_checkpoint` refuses another model / encoding / tokenizer before any data is
  built); a truncated file is a one-line error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from pelab.disk import disk_error, naming
from pelab.errors import CheckpointError
from pelab.model import GPTConfig


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to a temporary file in the same folder, fsync, rename over the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):  # remote storage: Lightning's fsspec writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as err:
            found = disk_error(err)  # torch.save reports a full disk as a RuntimeError (its context: the OSError)
            if found is None:
                raise
            raise naming(found, path) from err
        finally:
            tmp.unlink(missing_ok=True)


def read_checkpoint(path: str | Path, key: str = "ckpt_path") -> dict[str, Any]:
    """The checkpoint dict (tensors memory-mapped, so a large file costs little), or a one-line error naming
    the setting `key` that pointed at it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{key}={path} does not exist; pass a .ckpt file, 'auto' or null.")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            return torch.load(path, map_location="cpu", weights_only=False)  # legacy (non-zip) format
    except Exception as err:  # any unpickling failure means the same to the user
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"{key}={path} is not a readable checkpoint (truncated or corrupted: {type(err).__name__}: "
            f"{first}); delete it or set {key}= to another checkpoint (e.g. checkpoints/best.ckpt)."
        ) from err


def load_run_checkpoint(path: str | Path, key: str = "ckpt_path") -> dict[str, Any]:
    """A checkpoint written by pelab's train.py: its training config (`hyper_parameters.cfg`), vocabulary size
    and weights are inside; anything else is a one-line error naming `key`."""
    ckpt = read_checkpoint(path, key)
    hp = ckpt.get("hyper_parameters") or {}
    if "cfg" not in hp or "state_dict" not in ckpt:
        raise CheckpointError(f"{key}={path} was not written by pelab's train.py (no training config inside).")
    if hp.get("vocab_size") is None:
        raise CheckpointError(f"{key}={path} records no vocabulary size; it cannot be checked.")
    return ckpt


def model_state(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The GPT's own weights of a training checkpoint (the LightningModule stores them under `model.`)."""
    return {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}


def checkpoint_step(path: str | Path) -> int:
    """The global step a checkpoint was written at."""
    return int(read_checkpoint(path).get("global_step", 0))


def checkpoint_mismatches(ckpt_cfg: dict, cfg: dict) -> list[str]:
    """Settings that must match to continue training these weights, as readable differences: every key of
    model.*, pe.* and tokenizer.* but those that do not change the weights (`GPTConfig.RUNTIME_KEYS`, the
    encoding's own `runtime_keys`). Keys that only one side has are skipped (a key added to the configs since
    the checkpoint was written)."""
    from pelab.encodings import pe_schema

    runtime_keys = {"model": set(GPTConfig.RUNTIME_KEYS), "pe": set(pe_schema(cfg["pe"]).runtime_keys),
                    "tokenizer": set()}
    out = []
    for group, runtime in runtime_keys.items():
        old, new = ckpt_cfg.get(group) or {}, cfg.get(group) or {}
        keys = sorted(set(old) & set(new), key=lambda k: (k != "name" and k != "kind", k))
        for key in keys:
            if key not in runtime and old.get(key) != new.get(key):
                out.append(f"{group}.{key}={old.get(key)!r} in the checkpoint but {new.get(key)!r} now")
    return out
