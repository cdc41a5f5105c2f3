"""Positional encodings behind one contract (see ``base.py``), each selected by the ``_target_`` of its
``conf/pe/<name>.yaml`` and configured by its own schema (``Cls.Config``).

Add a scheme: a module with a ``PositionEncoding`` subclass (and its ``Config`` dataclass if it has knobs)
+ ``conf/pe/<name>.yaml`` naming it in ``_target_``. Nothing else changes.
"""

from __future__ import annotations

from pelab.encodings.base import PEConfig, PositionEncoding, PositionState
from pelab.encodings.config import (
    available_encodings,
    build_encoding,
    default_pe_config,
    pe_schema,
    pe_settings,
    pe_variant,
    resolve_pe_config,
)

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
