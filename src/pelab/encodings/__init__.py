"""Positional encodings behind one contract (see ``base.py``), selected by name from ``conf/pe/<name>.yaml``.

Add a scheme: write a ``PositionEncoding`` subclass, register it in ``ENCODINGS``, add ``conf/pe/<name>.yaml``.
Any scheme can be wrapped in randomized positions (Ruoss et al. 2023) with ``randomized.max_position``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pelab.encodings.absolute import Learned, NoPE, Sinusoidal
from pelab.encodings.base import PositionEncoding, PositionOutOfRange
from pelab.encodings.bias import FIRE, KERPLE, ALiBi, Sandwich, T5Bias
from pelab.encodings.contextual import CoPE
from pelab.encodings.randomized import Randomized
from pelab.encodings.rotary import RoPE, XPos

ENCODINGS: dict[str, type[PositionEncoding]] = {
    "nope": NoPE,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "t5_bias": T5Bias,
    "rope": RoPE,
    "alibi": ALiBi,
    "xpos": XPos,
    "kerple": KERPLE,
    "sandwich": Sandwich,
    "fire": FIRE,
    "cope": CoPE,
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
    """Build an encoding from ``{name: <scheme>, **knobs}`` (a dict or a DictConfig from conf/pe/);
    ``randomized: {max_position: N}`` wraps it in randomized training positions (null = off)."""
    knobs = _plain(cfg)
    name = knobs.pop("name", None)
    if name not in ENCODINGS:
        raise ValueError(f"pe.name={name!r} is unknown; known encodings: {sorted(ENCODINGS)}")
    randomized = knobs.pop("randomized", None) or {}
    unknown = set(randomized) - {"max_position"}
    if unknown:
        raise ValueError(f"pe.randomized got unknown keys {sorted(unknown)}; known: ['max_position']")
    pe = ENCODINGS[name](d_model, n_heads, **knobs)
    if randomized.get("max_position") is not None:
        return Randomized(pe, randomized["max_position"])
    return pe


__all__ = [
    "ENCODINGS",
    "FIRE",
    "KERPLE",
    "ALiBi",
    "CoPE",
    "Learned",
    "NoPE",
    "PositionEncoding",
    "PositionOutOfRange",
    "Randomized",
    "RoPE",
    "Sandwich",
    "Sinusoidal",
    "T5Bias",
    "XPos",
    "build_encoding",
]
