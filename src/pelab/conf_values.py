"""The values a config file gives, read outside Hydra's composition: conf/<group>/<option>.yaml as Hydra composes
it into its group. The one place code takes a setting's default from when its config lacks the key: a config
built by hand (a test, a benchmark, `build_corpus({"source": "stdlib"})`) or written before the key existed (a
checkpoint's training config, a committed run's summary.json). The value stays written once, in its YAML or its
schema, instead of again in a `.get(key, default)` beside the code that reads it.

Schemas with defaults (every encoding's `PEConfig` subclass, the model's `GPTConfig`) are Hydra config nodes of
their group, named `_<Class>` (`pe/_RoPEConfig`, `model/_GPTConfig`): a YAML composes its schema first
(`defaults: [_RoPEConfig, _self_]`) and writes only its choices and deviations, so no default is written twice.
Each schema module stores its own node when it is imported (`store_defaults`); pelab's entry points import the
schemas (`pelab.training.config`) before Hydra composes, and a composition of your own (`initialize_config_dir`)
imports them first, or Hydra answers "Could not find 'pe/_RoPEConfig'". (Hydra's plugin discovery would register
them implicitly, but it does not see packages of an editable install.) The nodes are plain (untyped) so that a
wrong value still gets pelab's one-line error from the validation pass, not Hydra's. Bottom layer: imports no
other pelab module but the package's `CONF_DIR`, nor torch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR


def store_defaults(group: str, schema: type, leave_out: tuple[str, ...] = ()) -> None:
    """Store a schema's defaults as the plain config node `<group>/_<Class>` of Hydra's ConfigStore (`???` where
    a field has none; without the keys `leave_out`). Idempotent: a store replaces the node of the same name."""
    values = OmegaConf.to_container(OmegaConf.structured(schema))
    node = OmegaConf.create({k: v for k, v in values.items() if k not in leave_out})
    ConfigStore.instance().store(group=group, name=f"_{schema.__name__}", node=node, provider="pelab")


def schema_node(group: str, name: str) -> DictConfig | None:
    """The stored node `<group>/<name>` (e.g. `pe/_RoPEConfig`), or None when no schema stored it."""
    try:
        return ConfigStore.instance().load(f"{group}/{name}.yaml").node.copy()
    except Exception:  # noqa: BLE001 - Hydra's ConfigLoadError / KeyError: no such node
        return None


def group_yaml(group: str, option: str) -> DictConfig:
    """conf/<group>/<option>.yaml as Hydra composes it into `group`: the entries of its defaults list (files of the
    same group, e.g. `_loader`, or schema nodes, e.g. `_RoPEConfig`) merged in order with the file's own keys at `_self_` (last when not
    listed); the `defaults` key dropped. Interpolations stay unresolved (they resolve in the config the values
    are merged into) and a value left `???` stays so."""
    path = Path(CONF_DIR) / group / f"{option}.yaml"
    if not path.is_file() and (node := schema_node(group, option)) is not None:  # `_RoPEConfig`, not a file
        return node
    own = OmegaConf.load(path)
    defaults = list(own.pop("defaults", []))
    cfg = OmegaConf.create()
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        cfg = OmegaConf.merge(cfg, own if entry == "_self_" else group_yaml(group, str(entry)))
    return cfg


def with_file_values(values: Mapping[str, Any], group: str, option: str) -> dict[str, Any]:
    """`values` (a config of `group`, plain data) with each key it lacks taken from conf/<group>/<option>.yaml
    (`group_yaml`); its own keys kept as they are."""
    return {**OmegaConf.to_container(group_yaml(group, option)), **values}


def with_data_target(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` (a run's config, plain data) with its data group naming the DataModule to build (`data._target_`). A
    config recorded before conf/data/ named it had a group `datamodule` of its own (its `_target_`; its other keys
    repeated data.* and tokenizer.*): its `_target_` moves into `data` and the group is dropped. A data group that
    names neither takes conf/data/_loader.yaml's."""
    out = dict(cfg)
    old = out.pop("datamodule", None)
    data = out.get("data")
    if isinstance(data, Mapping) and "_target_" not in data:
        target = old.get("_target_") if isinstance(old, Mapping) else None
        out["data"] = {"_target_": target or group_yaml("data", "_loader")["_target_"], **data}
    return out
