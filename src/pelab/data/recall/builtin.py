"""The built-in probe kinds, registered in the order the config and error messages list them (see README.md,
Kinds). A new kind = a module with its builders + one `register_probe_kind` call (here, or in a module named in
``probes.plugins``). The RULER-style kinds (niah_*, vt, cwe) come last: one builder each, turned into the three
hooks by `pelab.data.recall.ruler`."""

from __future__ import annotations

from functools import partial

from pelab.data.recall.common_words import CWE, build_cwe, cwe_vocabulary
from pelab.data.recall.induction import INDUCTION_HEADS, induction_probe, induction_probe_length
from pelab.data.recall.kinds import (
    KV,
    KV_SINGLE,
    MQAR,
    MQAR_OFFSET,
    OFFSET,
    PASSKEY,
    PASSKEY_SINGLE,
    ProbeKind,
    register_probe_kind,
)
from pelab.data.recall.kv import hex_samplers, kv_probe, kv_row, reserved_samplers
from pelab.data.recall.mqar import mqar_batch_rows, mqar_probe, mqar_row
from pelab.data.recall.niah import (
    NIAH_MULTIKEY,
    NIAH_MULTIQUERY,
    NIAH_MULTIVALUE,
    NIAH_SINGLE,
    build_niah,
    niah_vocabulary,
)
from pelab.data.recall.passkey import passkey_probe, passkey_row
from pelab.data.recall.ruler import ruler_probe, ruler_row, ruler_rows
from pelab.data.recall.variable_tracking import VT, build_vt, vt_vocabulary


def one_key_one_value(pairs: int) -> dict[str, int]:
    return {"reserved_keys": 1, "reserved_values": 1}


def one_value(pairs: int) -> dict[str, int]:
    return {"reserved_values": 1}


def a_key_and_value_per_pair(pairs: int) -> dict[str, int]:
    return {"reserved_keys": pairs, "reserved_values": pairs}


def mqar_probe_length(pairs: int) -> int:
    """An mqar probe holds N pairs, the query and the answer: 2N + 2 tokens."""
    return 2 * pairs + 2


def mqar_row_length(pairs: int) -> int:
    """An mqar training row holds N pairs and N queries with their answers: 4N tokens."""
    return 4 * pairs


register_probe_kind(ProbeKind(
    KV, "kv", partial(kv_probe, samplers=hex_samplers), row=partial(kv_row, samplers=hex_samplers),
))
register_probe_kind(ProbeKind(PASSKEY, "passkey", passkey_probe, row=passkey_row))
register_probe_kind(ProbeKind(
    MQAR, "mqar", mqar_probe, row=mqar_row, rows=mqar_batch_rows, vocabulary=a_key_and_value_per_pair,
    single_token=True, min_length=mqar_probe_length, min_length_rule="2 x pairs + 2", row_min_length=mqar_row_length,
    row_min_length_rule="4 x pairs",
))
register_probe_kind(ProbeKind(
    KV_SINGLE, "kv", partial(kv_probe, samplers=reserved_samplers), row=partial(kv_row, samplers=reserved_samplers),
    vocabulary=one_key_one_value, single_token=True,
))
register_probe_kind(ProbeKind(
    PASSKEY_SINGLE, "passkey", partial(passkey_probe, single=True), row=partial(passkey_row, single=True),
    vocabulary=one_value, single_token=True,
))
register_probe_kind(ProbeKind(
    MQAR_OFFSET, "mqar", partial(mqar_probe, offset=True), vocabulary=a_key_and_value_per_pair, single_token=True,
    min_length=mqar_probe_length, min_length_rule="2 x pairs + 2", layout=OFFSET, title="position vs distance",
))
register_probe_kind(ProbeKind(
    INDUCTION_HEADS, "induction", induction_probe, single_token=True, min_length=induction_probe_length,
    min_length_rule="3 (a task length L >= 3)", title="Mamba's induction heads, own 16-token vocabulary",
))


def register_ruler_kind(name: str, family: str, build, vocabulary, title: str) -> None:
    """A RULER-style kind: its builder as the probe, training-row and batch-rows hooks (`pelab.data.recall.ruler`)."""
    register_probe_kind(ProbeKind(
        name, family, partial(ruler_probe, build=build), row=partial(ruler_row, build=build, name=name),
        rows=partial(ruler_rows, build=build, name=name), ruler_vocabulary=vocabulary, single_token=True, title=title,
    ))


for _name, _title in ((NIAH_SINGLE, "RULER needle, single"), (NIAH_MULTIKEY, "RULER needle, multi-key"),
                      (NIAH_MULTIVALUE, "RULER needle, multi-value"), (NIAH_MULTIQUERY, "RULER needle, multi-query")):
    register_ruler_kind(_name, "niah", build_niah, partial(niah_vocabulary, _name), _title)
register_ruler_kind(VT, "vt", build_vt, vt_vocabulary, "RULER variable tracking")
register_ruler_kind(CWE, "cwe", build_cwe, cwe_vocabulary, "RULER common-words extraction")
