"""Synthetic recall sequences on token ids (mqar, kv, passkey and their single-token variants) for the
lost-in-the-middle probes and the training mix. The format they share is in README.md next to this file.

The kind names (`kinds`) load at once; the generators (which need torch) when first asked for, so that
`pelab.report` can name a kind without importing torch."""

from pelab.data.recall.kinds import (
    KV,
    KV_KINDS,
    KV_SINGLE,
    MQAR,
    MQAR_KINDS,
    MQAR_OFFSET,
    PASSKEY,
    PASSKEY_KINDS,
    PASSKEY_SINGLE,
    RECALL_KINDS,
    SINGLE_KINDS,
    TRAIN_KINDS,
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
    "KV",
    "KV_KINDS",
    "KV_SINGLE",
    "MQAR",
    "MQAR_KINDS",
    "MQAR_OFFSET",
    "OFFSET_DEPTH",
    "PASSKEY",
    "PASSKEY_FILLER",
    "PASSKEY_KINDS",
    "PASSKEY_SINGLE",
    "RECALL_KINDS",
    "SINGLE_KINDS",
    "TRAIN_KINDS",
    "RecallSample",
    "as_id_list",
    "in_space",
    "make_probe_samples",
    "make_recall_batch",
]
