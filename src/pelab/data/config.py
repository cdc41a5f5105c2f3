"""The data layer's config schema: the loader keys every data config composes (`conf/data/_loader.yaml`) and
the keys every tokenizer config has, typed and range-checked before any data is built.

The loader keys are declared here once (types); their values (defaults) live in `conf/data/_loader.yaml`, which
Hydra composes into every data config. Code reads that file only as Hydra composes it (`pelab.conf_values.group_yaml`)
and only where a data config lacks a key: one built by hand (`LMDataModule` given a corpus name, a benchmark), one
recorded before the key existed (a checkpoint's: `pelab.tasks.evaluate.todays_form`), or one not read yet (eval.py
types probes.* against today's values before it opens the checkpoint). A corpus config adds its own keys (path,
name, ...) beside them; those are the corpus code's. `_target_` names the DataModule that reads them
(`pelab.runs.build.build_datamodule`): not a loader key, and not in the token cache key.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.checks import is_int, need, show, typed_group
from pelab.conf_values import group_yaml
from pelab.data.recall import PROBE_KINDS, kind_names, probe_kind
from pelab.data.recall.ruler_options import RulerOptions, as_ruler, check_ruler
from pelab.data.tokenizer import TOKENIZER_KINDS

# How the data loader scores synthetic recall rows (see pelab.data.datamodule).
RECALL_LOSSES = ("all", "answers", "two_means")
# Each reserved range is at most this many ids: every reserved id is an embedding row only recall rows train.
MAX_RESERVED = 1 << 16


@dataclass
class LoaderConfig:
    """The loader keys every data config composes from conf/data/_loader.yaml (types only: the values are
    there)."""

    seq_len: int
    batch_size: int
    val_windows: int | None
    val_batch_size: int | None
    recall_mix: float
    recall_kinds: list[str]
    recall_key_len: int
    recall_value_len: int
    recall_loss: str
    recall_pairs: int
    recall_curriculum: Any  # null or [[step, span], ...] (checked below: OmegaConf names nested errors poorly)
    recall_ruler: RulerOptions  # the RULER-style kinds' difficulty (pelab.data.recall.ruler_options)
    num_workers: int


LOADER_KEYS = tuple(f.name for f in fields(LoaderConfig))


@dataclass
class TokenizerConfig:
    """The keys every tokenizer config has; each kind adds its own (vocab_size, name, ...)."""

    kind: str
    reserved_keys: int
    reserved_values: int


@cache
def loader_defaults() -> dict[str, Any]:
    """conf/data/_loader.yaml's loader values, which a data config composes (the one place they are written); its
    `_target_` (the DataModule) is no loader key."""
    values = OmegaConf.to_container(group_yaml("data", "_loader"))
    return {k: v for k, v in values.items() if k in LOADER_KEYS}


def loader_settings(values: Mapping[str, Any]) -> DictConfig:
    """The loader keys of `values` (a data config; other keys are the corpus's), the defaults of
    conf/data/_loader.yaml for those it lacks, typed and range-checked."""
    mine = {k: values[k] for k in LOADER_KEYS if k in values}
    d = typed_group(LoaderConfig, {**loader_defaults(), **mine}, "data")
    check_loader(d)
    return d


def check_loader(d: DictConfig) -> None:
    need(d.seq_len >= 1, "data.seq_len", d.seq_len, "must be a positive number of tokens.")
    need(d.batch_size >= 1, "data.batch_size", d.batch_size, "must be a positive number of sequences.")
    for k in ("val_windows", "val_batch_size"):
        need(d[k] is None or d[k] >= 1, f"data.{k}", d[k], "must be >= 1 or null.")
    need(0.0 <= d.recall_mix <= 1.0, "data.recall_mix", d.recall_mix, "must be in [0, 1] (0 = pure text).")
    trainable = kind_names(trainable=True)
    need(len(d.recall_kinds) > 0 and set(d.recall_kinds) <= set(trainable), "data.recall_kinds", d.recall_kinds,
         f"must be a non-empty list of {show(trainable)}.")
    for k in ("recall_key_len", "recall_value_len"):
        need(d[k] >= 1, f"data.{k}", d[k], "must be >= 1 hex chars.")
    need(d.recall_loss in RECALL_LOSSES, "data.recall_loss", d.recall_loss, f"must be one of {show(RECALL_LOSSES)}.")
    need(d.recall_pairs >= 1, "data.recall_pairs", d.recall_pairs, "must be >= 1 key-value pairs per mqar row.")
    # kinds whose rows need a number of tokens set by data.recall_pairs (mqar: N pairs, N queries, N answers)
    sized = [probe_kind(k) for k in dict.fromkeys(d.recall_kinds) if probe_kind(k).row_min_length] \
        if d.recall_mix > 0 else []
    for e in sized:
        need(e.row_min_length(d.recall_pairs) <= d.seq_len + 1, "data.recall_pairs", d.recall_pairs,
             f"does not fit: an {e.family} row needs {e.row_min_length_rule} tokens and has data.seq_len + 1 = "
             f"{d.seq_len + 1}; lower data.recall_pairs or raise data.seq_len.")
    cur = d.recall_curriculum
    ok = cur is None or (OmegaConf.is_list(cur) and len(cur) > 0 and all(
        OmegaConf.is_list(e) and len(e) in (2, 3) and all(is_int(v) for v in e[:2])
        and (len(e) == 2 or (isinstance(e[2], (int, float)) and 0.0 <= e[2] <= 1.0)) for e in cur))
    need(ok, "data.recall_curriculum", cur, "must be null or a list of [step, span] (or [step, span, share], "
         "share in [0, 1]) entries, e.g. [[0, 32], [200, 64], [400, 128]] or [[0, 32, 0.5], [400, 128, 0.1]].")
    if cur is not None:
        steps = [e[0] for e in cur]
        need(steps[0] >= 0 and all(a < b for a, b in itertools.pairwise(steps)), "data.recall_curriculum", cur,
             "must list steps >= 0 in increasing order.")
        least = max([1] + [k.row_min_length(d.recall_pairs) for k in sized])
        why = [f" ({k.row_min_length_rule.replace('pairs', 'data.recall_pairs')} for {k.family})" for k in sized
               if k.row_min_length(d.recall_pairs) == least]
        need(all(e[1] >= least for e in cur), "data.recall_curriculum", cur,
             f"spans must be >= {least} tokens" + (why[0] if why else "") + ".")
    check_ruler(d.recall_ruler, "data.recall_ruler")
    need(d.num_workers >= 0, "data.num_workers", d.num_workers, "must be >= 0.")


def check_tokenizer(t: DictConfig) -> None:
    need(t.kind in TOKENIZER_KINDS, "tokenizer.kind", t.kind, f"must be one of {show(TOKENIZER_KINDS)}.")
    for k in ("reserved_keys", "reserved_values"):
        need(0 <= t[k] <= MAX_RESERVED, f"tokenizer.{k}", t[k],
             f"must be in [0, {MAX_RESERVED}] (ids appended after the tokenizer's vocabulary; each is an "
             "embedding row that only recall rows train).")


def check_reserved(tok: Any, d: DictConfig, probes: DictConfig | None) -> None:
    """The single-token recall kinds in use (training mix, probes) against the reserved ids: mqar needs N
    distinct keys and values, kv_single / passkey_single at least one. `tok`: the tokenizer config."""
    uses = []  # (setting naming the kinds, kinds, pairs setting, pairs, RULER setting, RULER options)
    if d.recall_mix > 0:
        uses.append(("data.recall_kinds", d.recall_kinds, "data.recall_pairs", d.recall_pairs, "data.recall_ruler",
                     d.recall_ruler))
    if probes is not None and probes.enabled:
        uses.append(("probes.kinds", probes.kinds, "probes.pairs", probes.pairs, "probes.ruler", probes.get("ruler")))
    for where, kinds, pairs_key, pairs, ruler_key, ruler in uses:
        for kind in dict.fromkeys(k for k in kinds if k in PROBE_KINDS):
            e = PROBE_KINDS[kind]
            if e.ruler_vocabulary is None:
                setting, needs = f"{pairs_key}={pairs}", e.vocabulary(pairs)
            else:
                setting, needs = ruler_key, e.ruler_vocabulary(as_ruler(ruler))
            for k, n in needs.items():
                have = int(tok[k])
                need(have >= n, f"tokenizer.{k}", have, f"is too small for {kind} in {where}: "
                     + (f"it needs {n} distinct ids ({setting}); raise it or lower {setting.split('=')[0]}."
                        if n > 1 else "it needs at least one id; raise it."))


__all__ = ["LOADER_KEYS", "LoaderConfig", "TokenizerConfig", "check_loader", "check_reserved",
           "check_tokenizer", "loader_settings"]
