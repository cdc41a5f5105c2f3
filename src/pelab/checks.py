"""Typing and range checks every layer's config schema uses: a config group merged onto its dataclass
(`typed`, `typed_group`), a value read as plain data (`resolved_value`), a range check (`need`) and the way a
value is shown in a message (`show`). Each failure is a `ConfigError` naming the key as the user types it.
The bottom layer, beside `pelab.errors`: imports no other pelab module, nor torch."""

from __future__ import annotations

from typing import Any

from pelab.errors import ConfigError


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
