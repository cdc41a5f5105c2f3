"""Positional encodings behind one contract (see ``base.py``), selected by name from ``conf/pe/<name>.yaml``.

Add a scheme: write a ``PositionEncoding`` subclass, register it in ``ENCODINGS``, add ``conf/pe/<name>.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pelab.encodings.absolute import Learned, NoPE, Sinusoidal
from pelab.encodings.base import PositionEncoding, PositionOutOfRange
from pelab.encodings.bias import ALiBi, T5Bias
from pelab.encodings.rotary import RoPE

ENCODINGS: dict[str, type[PositionEncoding]] = {
    "nope": NoPE,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "t5_bias": T5Bias,
    "rope": RoPE,
    "alibi": ALiBi,
}


def _plain(cfg: Any) -> dict:
    """DictConfig or mapping -> plain dict (resolving interpolations)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # omegaconf is a dependency, but the encodings do not need it
        pass
    if not isinstance(cfg, Mapping):
        raise TypeError(f"pe config must be a mapping with a 'name'; got {type(cfg).__name__}")
    return dict(cfg)


def build_encoding(cfg: Any, d_model: int, n_heads: int) -> PositionEncoding:
    """Build an encoding from ``{name: <scheme>, **knobs}`` (a dict or a DictConfig from conf/pe/)."""
    knobs = _plain(cfg)
    name = knobs.pop("name", None)
    if name not in ENCODINGS:
        raise ValueError(f"pe.name={name!r} is unknown; known encodings: {sorted(ENCODINGS)}")
    return ENCODINGS[name](d_model, n_heads, **knobs)


__all__ = [
    "ENCODINGS",
    "ALiBi",
    "Learned",
    "NoPE",
    "PositionEncoding",
    "PositionOutOfRange",
    "RoPE",
    "Sinusoidal",
    "T5Bias",
    "build_encoding",
]
