"""From a ``pe`` config (``conf/pe/<name>.yaml``, with its ``_target_``) to a validated encoding.

The encoding class named by ``_target_`` owns its schema (``Cls.Config``, a ``PEConfig`` dataclass), so
this module knows no scheme by name: a new encoding is found through its YAML's ``_target_``, and the
config group folder is the only list of encodings. Each YAML composes its schema's
defaults first (``defaults: [_RoPEConfig, _self_]``, the schema nodes of ``pelab.conf_values``) and writes only
its ``_target_``, its name and its deviations; ``load_pe_yaml`` composes a file the same way outside Hydra.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR
from pelab.checks import typed
from pelab.conf_values import group_yaml
from pelab.encodings.settings import SCHEMAS, PEConfig
from pelab.errors import ConfigError

PE_CONF_DIR = Path(CONF_DIR) / "pe"


def available_encodings() -> list[str]:
    """The names under conf/pe/ (the config group is the registry); a name starting with ``_`` would be a
    shared part, not an encoding."""
    return sorted(p.stem for p in PE_CONF_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def load_pe_yaml(name: str) -> DictConfig:
    """conf/pe/<name>.yaml as Hydra composes it into ``pe`` (``pelab.conf_values.group_yaml``: its defaults list,
    e.g. ``_RoPEConfig``, merged under its own keys). Untyped: see ``default_pe_config``."""
    return group_yaml("pe", name)


def default_pe_config(name: str) -> dict:
    """The full default config of encoding ``name``: conf/pe/<name>.yaml (``load_pe_yaml``) typed against its
    schema."""
    if name not in available_encodings():
        raise ConfigError(f"pe={name} is unknown; known encodings: {available_encodings()}")
    cfg = load_pe_yaml(name)
    return OmegaConf.to_container(typed(pe_schema(cfg), cfg, "pe"), resolve=True)


def _as_config(cfg: Any, overrides: Mapping | None = None) -> DictConfig:
    """A name, a mapping or a DictConfig -> DictConfig; a mapping without ``_target_`` starts from the
    defaults of its ``name`` (so code and tests can say ``{"name": "rope", "base": 500}``)."""
    if isinstance(cfg, str):
        cfg = {"name": cfg}
    if not isinstance(cfg, Mapping | DictConfig):
        raise TypeError(f"a pe config is a mapping with a _target_ or a name; got {type(cfg).__name__}")
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg))
    if "_target_" not in cfg:
        cfg = OmegaConf.merge(default_pe_config(str(cfg.get("name"))), cfg)
    return OmegaConf.merge(cfg, dict(overrides or {}))


def pe_schema(cfg: Any) -> type[PEConfig]:
    """The config dataclass of the encoding a ``pe`` config names: a built-in's from ``SCHEMAS`` (no torch
    import), any other ``_target_``'s ``Config`` (importing its class)."""
    target = cfg.get("_target_") if isinstance(cfg, Mapping | DictConfig) else None
    if target is None:
        return pe_schema(_as_config(cfg))
    if str(target) in SCHEMAS:
        return SCHEMAS[str(target)]
    from pelab.encodings.base import PositionEncoding

    try:
        cls = get_class(str(target))
    except Exception as err:  # noqa: BLE001 - ImportError, AttributeError, ...: all mean a wrong _target_
        raise ConfigError(f"pe._target_={target} cannot be imported ({type(err).__name__}); it must name a "
                          "PositionEncoding subclass, e.g. pelab.encodings.rotary.RoPE") from None
    if not (isinstance(cls, type) and issubclass(cls, PositionEncoding)):
        raise ConfigError(f"pe._target_={target} is not a PositionEncoding subclass")
    return cls.Config


def pe_settings(cfg: Any, *, d_model: int, n_heads: int, train_length: int | None) -> PEConfig:
    """The encoding's config object: typed (its schema), resolved (settings that mean "the training length"
    filled) and range-checked; every problem is a ConfigError naming ``pe.<key>``."""
    cfg = _as_config(cfg)
    config: PEConfig = OmegaConf.to_object(typed(pe_schema(cfg), cfg, "pe"))
    config.resolve(train_length)
    config.validate(int(d_model), int(n_heads))
    return config


def resolve_pe_config(cfg: Any, *, d_model: int, n_heads: int, train_length: int | None) -> dict:
    """``pe_settings`` as a plain dict (what ``instantiate`` and summary.json take)."""
    config = pe_settings(cfg, d_model=d_model, n_heads=n_heads, train_length=train_length)
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def pe_variant(cfg: Any, variant: str) -> dict:
    """The ``pe`` config (unresolved: ``train_length`` as given) of the encoding's named variant
    (``PEConfig.variant``, e.g. a RoPE scaling type for eval.py's ``scaling_sweep``)."""
    cfg = _as_config(cfg)
    config: PEConfig = OmegaConf.to_object(typed(pe_schema(cfg), cfg, "pe"))
    return OmegaConf.to_container(OmegaConf.structured(config.variant(variant)), resolve=True)


def build_encoding(cfg: Any, d_model: int, n_heads: int, train_length: int | None = None,
                   **overrides: Any) -> Any:
    """The encoding of a ``pe`` config (a name, a mapping or a DictConfig; ``overrides`` replace keys):
    ``instantiate`` of the resolved config with the model's sizes."""
    resolved = resolve_pe_config(_as_config(cfg, overrides), d_model=d_model, n_heads=n_heads,
                                 train_length=train_length)
    return instantiate(resolved, d_model=int(d_model), n_heads=int(n_heads), _convert_="all")
