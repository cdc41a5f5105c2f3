"""The recall kinds: one constant per kind and the tuples the rest of the code checks against (see README.md)."""

from __future__ import annotations

KV = "kv"
PASSKEY = "passkey"
MQAR = "mqar"
KV_SINGLE = "kv_single"
PASSKEY_SINGLE = "passkey_single"
MQAR_OFFSET = "mqar_offset"

RECALL_KINDS = (KV, PASSKEY, MQAR, KV_SINGLE, PASSKEY_SINGLE, MQAR_OFFSET)
TRAIN_KINDS = RECALL_KINDS[:-1]  # mqar_offset is a probe (the training rows of mqar cover it)
SINGLE_KINDS = (MQAR, KV_SINGLE, PASSKEY_SINGLE, MQAR_OFFSET)  # keys / values are reserved ids
# The families: one generator each (kv.py, passkey.py, mqar.py).
KV_KINDS = (KV, KV_SINGLE)
PASSKEY_KINDS = (PASSKEY, PASSKEY_SINGLE)
MQAR_KINDS = (MQAR, MQAR_OFFSET)
