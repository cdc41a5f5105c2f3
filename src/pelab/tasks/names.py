"""Run names and W&B groups of multirun jobs: the `${pelab.sweep_suffix:}` resolver the run name uses, registered
when this module is imported (a leaf: it imports no other pelab module, so any layer that composes a config can
import it)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_suffix(*, _root_: DictConfig) -> str:
    """`${pelab.sweep_suffix:}` in a run name: in a multirun, `-key=value` for each override that varies
    across its jobs and that the name does not show already (`-m model.n_heads=1,3,4` ->
    `rope-micro-L128-s0-model.n_heads=3`; `pe=rope,alibi` adds nothing, the name has `${pe.name}`); "" in a
    single run."""
    from hydra.core.hydra_config import HydraConfig

    if not in_multirun():
        return ""
    hc = HydraConfig.get()
    swept = swept_keys(str(hc.sweep.dir)) | set((hc.sweeper.get("params") or {}).keys())
    raw = _root_._get_node("name")._value()  # the name's own interpolations: the keys it shows
    shown = re.findall(r"\$\{([\w.]+)\}", raw) if isinstance(raw, str) else []
    parts = []
    for override in hc.overrides.task:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in swept and not any(ref == key or ref.startswith(f"{key}.") for ref in shown):
            parts.append(f"-{key}={value}".replace("/", "_"))
    return "".join(parts)


def swept_keys(sweep_dir: str) -> frozenset[str]:
    """The keys a multirun sweeps on its command line, from the `multirun.yaml` Hydra's sweeper writes in the
    sweep folder before any job starts (a job's own config holds only its single values)."""
    path = Path(sweep_dir) / "multirun.yaml"
    return _swept_keys(str(path), path.stat().st_mtime_ns) if path.is_file() else frozenset()


@functools.lru_cache
def _swept_keys(path: str, mtime_ns: int) -> frozenset[str]:  # the name is resolved often: parse once
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OmegaConf.load(path).hydra.overrides.task
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return frozenset(o.key_or_group for o in parsed if o.is_sweep_override())


OmegaConf.register_new_resolver("pelab.sweep_suffix", sweep_suffix, replace=True)


def sweep_group() -> str | None:
    """All jobs of one multirun share a W&B group: the sweep folder (date/time)."""
    from hydra.core.hydra_config import HydraConfig

    if not in_multirun():
        return None
    sweep_dir = Path(HydraConfig.get().sweep.dir)
    return f"sweep-{sweep_dir.parent.name}-{sweep_dir.name}"
