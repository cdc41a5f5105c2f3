"""Synthetic recall sequences on token ids (mqar, kv, passkey and their single-token variants) for the
lost-in-the-middle probes and the training mix. The format they share is in README.md next to this file.

The probe-kind table (`kinds.PROBE_KINDS`, filled by `builtin` on import) and the generators (numpy only) load
at once; the factories (which need torch) when first asked for, so that `pelab.report` can read the table
without importing torch."""

from pelab.data.recall import builtin  # noqa: F401 - registers the built-in kinds
from pelab.data.recall.kinds import (
    DEPTH,
    KV,
    KV_SINGLE,
    MQAR,
    MQAR_OFFSET,
    OFFSET,
    PASSKEY,
    PASSKEY_SINGLE,
    PROBE_KINDS,
    ProbeKind,
    RecallOptions,
    import_plugins,
    kind_names,
    probe_kind,
    register_probe_kind,
)

_LAZY = {  # name -> submodule
    "make_probe_samples": "factories", "make_recall_batch": "factories", "OFFSET_DEPTH": "mqar",
    "PASSKEY_FILLER": "pieces", "as_id_list": "pieces", "RecallSample": "sample",
    "in_space": "spaces",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pelab.data.recall' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"pelab.data.recall.{_LAZY[name]}"), name)

__all__ = [
    "DEPTH",
    "KV",
    "KV_SINGLE",
    "MQAR",
    "MQAR_OFFSET",
    "OFFSET",
    "OFFSET_DEPTH",
    "PASSKEY",
    "PASSKEY_FILLER",
    "PASSKEY_SINGLE",
    "PROBE_KINDS",
    "ProbeKind",
    "RecallOptions",
    "RecallSample",
    "as_id_list",
    "import_plugins",
    "in_space",
    "kind_names",
    "make_probe_samples",
    "make_recall_batch",
    "probe_kind",
    "register_probe_kind",
]
