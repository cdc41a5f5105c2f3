"""Errors that carry a message for the user (printed as one line, `Error: ...`, never a traceback), and the
typing / range-check helpers every layer's config schema uses. The bottom layer: imports no pelab module."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key to change and how."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to this run's model/tokenizer."""


class OutOfMemory(ValueError):
    """An allocation that failed during training: the settings to lower and the checkpoint to resume from."""


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient under optim.nonfinite=stop (or more than optim.max_skips skipped)."""


def is_user_error(err: BaseException) -> bool:
    """Errors pelab raises on purpose with a message naming the setting to change: print them as one line.
    Anything else (a bug, a library failure) keeps its full traceback."""
    if isinstance(err, NonFiniteError):
        return True
    return isinstance(err, ValueError) and type(err).__module__.startswith("pelab.")


# -- typing ------------------------------------------------------------------------------------------
def typed(schema: type, cfg: Any, group: str) -> Any:
    """``cfg`` (a mapping or DictConfig of config group ``group``) merged onto the structured config
    ``schema`` (a dataclass): a wrong type, an unknown key or a missing value is a ConfigError naming
    ``<group>.<key>``. Returns the typed DictConfig."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.merge(OmegaConf.structured(schema), cfg)
    except OmegaConfBaseException as err:
        key = ".".join(p for p in (group, str(getattr(err, "full_key", None) or "")) if p)
        first = str(getattr(err, "msg", None) or err).splitlines()[0]
        if "not in" in first and "Key" in first:  # unknown key
            known = sorted(k for k in OmegaConf.structured(schema) if not str(k).startswith("_"))
            raise ConfigError(f"{key} is not a setting of this {group or 'config'}; known: {known}") from None
        if type(err).__name__ == "MissingMandatoryValue":
            raise ConfigError(f"{key} has no value and needs one; set it ({key}=...)") from None
        raise ConfigError(f"{key}: {first}") from None


def typed_group(schema: type, values: Any, key: str, *, open_keys: bool = False) -> Any:
    """`values` (config group `key`, resolved) typed against `schema` (see `typed`); a ConfigError naming
    the full key for a wrong type, an unknown key (unless `open_keys`: keys the schema lacks are dropped)
    or a value left `???`."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    if values == "???":
        raise ConfigError(f"{key} has no value and this config needs one; choose one ({key}=...).")
    if not isinstance(values, dict):
        raise ConfigError(f"{key}={show(values)} must be a group of settings (conf/{key}/*.yaml).")
    if open_keys:
        known = {f.name for f in fields(schema)}
        values = {k: v for k, v in values.items() if k in known}
    out = typed(schema, values, key)
    missing = sorted(OmegaConf.missing_keys(out))
    if missing:
        name = ".".join(p for p in (key, missing[0]) if p)
        raise ConfigError(f"{name} has no value and this config needs one; set it ({name}=...).")
    return out


def resolved_value(parent: Any, key: str) -> Any:
    """parent[key] of a DictConfig resolved to plain data, `???` kept as is; a broken interpolation names its
    key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if key not in parent or OmegaConf.is_missing(parent, key):
        return "???"
    try:
        value = parent[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:  # full_key is the absolute key here
        raise ConfigError(f"{err.full_key or key} cannot be resolved: {str(err.msg).splitlines()[0]}.") from err


# -- range checks ------------------------------------------------------------------------------------
def show(value: Any) -> str:
    """A value as it is written on the command line: [kv, bogus], 1.5, null."""
    from omegaconf import OmegaConf

    if value is None:
        return "null"
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a typed float prints as given: lr=-1, not -1.0
    return str(value)


def need(ok: bool, key: str, value: Any, rule: str) -> None:
    """One-line error `<key>=<value> <rule>` unless `ok`: `key` is the full key as the user types it
    (`pe.base`, `data.seq_len`), `rule` says what the value must be."""
    if not ok:
        raise ConfigError(f"{key}={show(value)} {rule}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
