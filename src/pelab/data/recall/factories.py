"""The factories: probe samples by kind, length and depth (`make_probe_samples`), training-mix sequences and
batches (`make_recall_sequence`, `make_recall_batch`); each dispatches to its kind's family module."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch

from pelab.data.recall.kinds import (
    KV,
    KV_KINDS,
    MQAR,
    MQAR_KINDS,
    PASSKEY,
    PASSKEY_KINDS,
    PASSKEY_SINGLE,
    RECALL_KINDS,
    TRAIN_KINDS,
)
from pelab.data.recall.kv import build_kv, kv_samplers
from pelab.data.recall.mqar import mqar_probe, mqar_rows
from pelab.data.recall.passkey import build_passkey
from pelab.data.recall.pieces import Pieces, as_id_list, pieces_of
from pelab.data.recall.sample import RecallSample, Tokenizer
from pelab.data.recall.spaces import PASSKEY_MAX, PASSKEY_MIN, PROBE_SPACE, TRAIN_SPACE, reserved_ids
from pelab.errors import RecallLengthError


def _check_depth(depth: float) -> float:
    d = float(depth)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"probes.depths entries must be in [0, 1], got {depth}")
    return d


def make_probe_samples(
    kind: str,
    tokenizer: Tokenizer,
    length: int,
    depth: float,
    n: int,
    seed: int,
    filler_ids: Sequence[int] | None = None,
    space: str = PROBE_SPACE,
    key_len: int = 3,
    value_len: int = 3,
    pairs: int = 8,
    prefix_multiple: int = 0,
) -> list[RecallSample]:
    """``n`` probe samples of exactly ``length`` tokens (prompt + answer) with the gold item at ``depth``.

    Sample i draws from ``random.Random(f"{seed}/{kind}/{length}/{i}")`` (mqar kinds: a numpy generator
    seeded by (seed, kind, length, i)): fixed across runs and encodings, and the same instance at every
    depth (only the gold position moves). ``filler_ids``: passkey / mqar filler (real text token ids);
    None = the fixed repeated sentence. ``key_len`` / ``value_len``: hex characters of kv keys / values.
    ``pairs``: N of mqar. mqar_offset: ``length`` is the window (the training length), the samples are
    ``(1 + prefix_multiple) * length`` tokens long and ``depth`` is not used (see README.md).
    """
    if kind not in RECALL_KINDS:
        raise ValueError(f"unknown probes.kinds entry {kind!r}; known: {list(RECALL_KINDS)}")
    depth = _check_depth(depth)
    pc = pieces_of(tokenizer)
    length = int(length)
    if kind in MQAR_KINDS:
        return mqar_probe(pc, kind, length, depth, n, seed, filler_ids, pairs, prefix_multiple)
    filler_ids = as_id_list(filler_ids)
    single = reserved_ids(pc)[1] if kind == PASSKEY_SINGLE else None
    keys, values = kv_samplers(pc, kind, space, key_len, value_len) if kind in KV_KINDS else (None, None)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{kind}/{length}/{i}")
        if keys is not None:
            ids, ans, gold, n_pairs, _, starts = build_kv(pc, rng, length, depth, keys, values)
            s = RecallSample(ids, ans, gold, depth, length, kind, n_pairs, values.size)
            s.candidates = [ids[j] for j in starts]
            s.candidate_depths = [j / (len(ids) - 1) for j in starts]
        else:
            ids, ans, gold = build_passkey(pc, rng, length, depth, space, filler_ids, single)
            n_keys = len(single) if single is not None else (PASSKEY_MAX - PASSKEY_MIN + 1) // 2
            s = RecallSample(ids, ans, gold, depth, length, kind, 1, n_keys)
            s.candidates, s.candidate_depths = [ans[0]], [gold / (len(ids) - 1)]
        s.gold_distance = len(ids) - gold
        out.append(s)
    return out


def make_recall_sequence(
    tokenizer: Tokenizer | Pieces,
    length: int,
    rng: random.Random,
    kind: str = KV,
    space: str = TRAIN_SPACE,
    filler_ids: Sequence[int] | None = None,
    key_len: int = 3,
    value_len: int = 3,
    max_extra_queries: int = 3,
    pairs: int = 8,
) -> tuple[list[int], list[bool]]:
    """One training-mix sequence of exactly ``length`` tokens and its answer mask (True on answer tokens).

    kv sequences also ask ``0..max_extra_queries`` extra questions (``Key: "k" Value: "v"``) about
    distractor pairs before the final one: more retrieval signal per sequence. Depth is uniform in [0, 1].
    mqar asks all its ``pairs`` keys (filler: ``filler_ids`` or the sentence).
    """
    pc = pieces_of(tokenizer)
    if kind == MQAR:
        F = pc.filler_array(filler_ids)
        g = np.random.default_rng(rng.getrandbits(64))
        text = F[(g.integers(len(F)) + np.arange(length)) % len(F)][None]
        rows, mask = mqar_rows(text, pairs, *reserved_ids(pc), g)
        return rows[0].tolist(), mask[0].tolist()
    depth = rng.random()
    if kind in KV_KINDS:
        keys, values = kv_samplers(pc, kind, space, key_len, value_len)
        ids, ans, _, _, spans, _ = build_kv(
            pc, rng, length, depth, keys, values, n_extra_queries=rng.randint(0, max_extra_queries)
        )
    elif kind in PASSKEY_KINDS:
        single = reserved_ids(pc)[1] if kind == PASSKEY_SINGLE else None
        ids, ans, _ = build_passkey(pc, rng, length, depth, space, filler_ids, single)
        spans = [(len(ids), len(ids) + len(ans))]
    else:
        raise ValueError(f"unknown recall kind {kind!r}; known: {list(TRAIN_KINDS)}")
    seq = ids + ans
    mask = [False] * len(seq)
    for a, b in spans:
        mask[a:b] = [True] * (b - a)
    return seq, mask


def make_recall_batch(
    tokenizer: Tokenizer,
    seq_len: int,
    n: int,
    rng: random.Random | int,
    kinds: Sequence[str] = (KV, PASSKEY),
    filler_ids: Sequence[int] | None = None,
    key_len: int = 3,
    value_len: int = 3,
    return_mask: bool = False,
    max_extra_queries: int = 3,
    pairs: int = 8,
    span: int | None = None,
    text: np.ndarray | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Training-mix batch: LongTensor (n, seq_len + 1) of synthetic recall sequences from the "train"
    space (kind drawn uniformly from ``kinds`` per row; kinds too long are skipped, and
    ``RecallLengthError`` names the setting when none fits). ``rng``: a ``random.Random`` or an int seed.
    With ``return_mask`` also a BoolTensor (n, seq_len + 1) marking answer tokens (as targets: row
    ``[:, 1:]`` aligns with the shifted targets). ``max_extra_queries``: see ``make_recall_sequence``.

    ``pairs``: N of mqar rows (built together, vectorised). ``span`` (the curriculum): each recall sequence
    occupies only the first ``span`` tokens of its row, followed by the row's own text (None = the whole
    row). Under causal attention the recall tokens never see what follows, so a span-S row trains exactly
    as a sequence of S tokens at positions 0..S-1: a short-sequence curriculum in fixed-shape batches.
    (Short sequences first, because recall placed after text learned far more slowly: the measurement is in
    experiments/lost_in_the_middle/README.md.) ``text`` (n, seq_len + 1): the real text rows the recall
    rows replace, used as that trailing text and as mqar filler (None: ``filler_ids`` or the sentence at
    random offsets).
    """
    if isinstance(rng, int):
        rng = random.Random(rng)
    T = seq_len + 1
    S = T if span is None else max(1, min(int(span), T))
    last_error: Exception | None = None
    filler_ids = as_id_list(filler_ids)
    pc = pieces_of(tokenizer)
    kinds = list(kinds)
    if MQAR in kinds and 4 * pairs > S:  # checked up front: mqar rows are built after the loop
        kinds.remove(MQAR)
        last_error = RecallLengthError(f"mqar with data.recall_pairs={pairs} needs {4 * pairs} tokens, got {S}")
    rows: list[list[int] | None] = [None] * n
    masks: list[list[bool] | None] = [None] * n
    mqar_at: list[int] = []
    i = 0
    while i < n:
        if not kinds:
            raise RecallLengthError(
                f"data.recall_mix: no recall kind fits in data.seq_len={seq_len} tokens ({last_error}); "
                "use a longer data.seq_len or set data.recall_mix=0"
            )
        kind = kinds[rng.randrange(len(kinds))]
        if kind == MQAR:
            mqar_at.append(i)
            i += 1
            continue
        try:
            seq, mask = make_recall_sequence(
                pc, S, rng, kind=kind, space=TRAIN_SPACE, filler_ids=filler_ids, key_len=key_len,
                value_len=value_len, max_extra_queries=max_extra_queries,
            )
        except RecallLengthError as exc:  # this kind does not fit: use the others
            kinds.remove(kind)
            last_error = exc
            continue
        rows[i], masks[i] = seq, mask
        i += 1
    x = np.empty((n, T), dtype=np.int64)
    m = np.zeros((n, T), dtype=bool)
    done = [j for j in range(n) if rows[j] is not None]
    if done:
        x[done, :S] = np.asarray([rows[j] for j in done], dtype=np.int64)
        m[done, :S] = np.asarray([masks[j] for j in done], dtype=bool)
    if mqar_at or S < T:  # real text needed (drawn here only then: kv / passkey rows stay as they were)
        g = np.random.default_rng(rng.getrandbits(64))
        if text is None:
            F = pc.filler_array(filler_ids)
            text = F[(g.integers(len(F), size=(n, 1)) + np.arange(T)) % len(F)]
        text = np.asarray(text, dtype=np.int64)
        x[done, S:] = text[done, S:]
        if mqar_at:
            x[mqar_at], m[mqar_at] = mqar_rows(text[mqar_at], pairs, *reserved_ids(pc), g, S)
    x_t = torch.from_numpy(x)
    return (x_t, torch.from_numpy(m)) if return_mask else x_t

