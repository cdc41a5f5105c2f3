"""The values a config file gives, read outside Hydra's composition: conf/<group>/<option>.yaml as Hydra composes
it into its group. The one place code takes a setting's default from when its config lacks the key: a config
built by hand (a test, a benchmark, `build_corpus({"source": "stdlib"})`) or written before the key existed (a
checkpoint's training config, a committed run's summary.json). The value stays written once, in its YAML, instead
of again in a `.get(key, default)` beside the code that reads it. Bottom layer: imports no other pelab module but
the package's `CONF_DIR`, nor torch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR


def group_yaml(group: str, option: str) -> DictConfig:
    """conf/<group>/<option>.yaml as Hydra composes it into `group`: the entries of its defaults list (files of the
    same group, e.g. `_base`, `_loader`) merged in order with the file's own keys at `_self_` (last when not
    listed); the `defaults` key dropped. Interpolations stay unresolved (they resolve in the config the values
    are merged into) and a value left `???` stays so."""
    own = OmegaConf.load(Path(CONF_DIR) / group / f"{option}.yaml")
    defaults = list(own.pop("defaults", []))
    cfg = OmegaConf.create()
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        cfg = OmegaConf.merge(cfg, own if entry == "_self_" else group_yaml(group, str(entry)))
    return cfg


def with_file_values(values: Mapping[str, Any], group: str, option: str) -> dict[str, Any]:
    """`values` (a config of `group`, plain data) with each key it lacks taken from conf/<group>/<option>.yaml
    (`group_yaml`); its own keys kept as they are."""
    return {**OmegaConf.to_container(group_yaml(group, option)), **values}
