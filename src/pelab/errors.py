"""Errors that carry a message for the user: printed as one line (`Error: ...`), never a traceback."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key to change and how."""


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

