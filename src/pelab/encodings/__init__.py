"""Positional encodings behind one contract (see ``base.py``), each selected by the ``_target_`` of its
``conf/pe/<name>.yaml`` and configured by its own schema (``Cls.Config``; the built-in ones in ``settings.py``).

Add a scheme: a module with a ``PositionEncoding`` subclass (and its ``Config`` dataclass if it has knobs)
+ ``conf/pe/<name>.yaml`` naming it in ``_target_``. Nothing else changes.

The config functions are torch-free (the command line validates ``pe`` before importing torch); the
``nn.Module`` names load torch on first use.
"""

from __future__ import annotations

from typing import Any

from pelab.encodings.config import (
    available_encodings,
    build_encoding,
    default_pe_config,
    pe_schema,
    pe_settings,
    pe_variant,
    resolve_pe_config,
)
from pelab.encodings.settings import PEConfig

_LAZY = {"PositionEncoding", "PositionState"}  # in base.py, which imports torch


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pelab.encodings' has no attribute {name!r}")
    from pelab.encodings import base

    return getattr(base, name)


__all__ = [
    "PEConfig",
    "PositionEncoding",
    "PositionState",
    "available_encodings",
    "build_encoding",
    "default_pe_config",
    "pe_schema",
    "pe_settings",
    "pe_variant",
    "resolve_pe_config",
]
