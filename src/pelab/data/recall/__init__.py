"""Synthetic recall sequences on token ids (mqar, kv, passkey and their single-token variants) for the
lost-in-the-middle probes and the training mix. The format they share is in README.md next to this file."""

from pelab.data.recall.factories import make_probe_samples, make_recall_batch
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
from pelab.data.recall.mqar import OFFSET_DEPTH
from pelab.data.recall.pieces import PASSKEY_FILLER, as_id_list
from pelab.data.recall.sample import RecallLengthError, RecallSample
from pelab.data.recall.spaces import in_space

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
    "RecallLengthError",
    "RecallSample",
    "as_id_list",
    "in_space",
    "make_probe_samples",
    "make_recall_batch",
]
