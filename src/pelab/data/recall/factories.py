"""The factories: probe samples by kind, length and depth (`make_probe_samples`), training-mix sequences and
batches (`make_recall_sequence`, `make_recall_batch`); each asks its kind's entry in the probe-kind table
(`kinds.PROBE_KINDS`) for the builder."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pelab.data.recall.kinds import KV, PASSKEY, RecallOptions, kind_names, probe_kind
from pelab.data.recall.pieces import Pieces, as_id_list, pieces_of
from pelab.data.recall.ruler_options import RulerOptions, as_ruler
from pelab.data.recall.sample import RecallSample, Tokenizer
from pelab.data.recall.spaces import PROBE_SPACE, TRAIN_SPACE
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
    ruler: RulerOptions | Mapping[str, Any] | None = None,
) -> list[RecallSample]:
    """``n`` probe samples of exactly ``length`` tokens (prompt + answer) with the gold item at ``depth``.

    Sample i draws from ``random.Random(f"{seed}/{kind}/{length}/{i}")`` (mqar kinds: a numpy generator
    seeded by (seed, kind, length, i)): fixed across runs and encodings, and the same instance at every
    depth (only the gold position moves). ``filler_ids``: passkey / mqar filler (real text token ids);
    None = the fixed repeated sentence. ``key_len`` / ``value_len``: hex characters of kv keys / values.
    ``pairs``: N of mqar. mqar_offset: ``length`` is the window (the training length), the samples are
    ``(1 + prefix_multiple) * length`` tokens long and ``depth`` is not used (see README.md). ``ruler``: the
    RULER-style kinds' difficulty (`RulerOptions` or a mapping of its keys; None: its defaults).
    """
    entry = probe_kind(kind)
    depth = _check_depth(depth)
    opts = RecallOptions(space=space, filler_ids=filler_ids, key_len=key_len, value_len=value_len, pairs=pairs,
                         prefix_multiple=prefix_multiple, ruler=as_ruler(ruler))
    return entry.probe(pieces_of(tokenizer), kind, int(length), depth, n, seed, opts)


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
    ruler: RulerOptions | Mapping[str, Any] | None = None,
) -> tuple[list[int], list[bool]]:
    """One training-mix sequence of exactly ``length`` tokens and its answer mask (True on answer tokens).

    kv sequences also ask ``0..max_extra_queries`` extra questions (``Key: "k" Value: "v"``) about
    distractor pairs before the final one: more retrieval signal per sequence. Depth is uniform in [0, 1].
    mqar asks all its ``pairs`` keys (filler: ``filler_ids`` or the sentence). ``ruler``: as in make_probe_samples.
    """
    entry = probe_kind(kind, "recall kind")
    if entry.row is None:
        raise ValueError(f"recall kind {kind!r} is probe-only; the training mix can draw {list(kind_names(True))}")
    opts = RecallOptions(space=space, filler_ids=filler_ids, key_len=key_len, value_len=value_len, pairs=pairs,
                         max_extra_queries=max_extra_queries, ruler=as_ruler(ruler))
    return entry.row(pieces_of(tokenizer), length, rng, opts)


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
    ruler: RulerOptions | Mapping[str, Any] | None = None,
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
    random offsets). ``ruler``: the RULER-style kinds' difficulty, as in make_probe_samples.
    """
    if isinstance(rng, int):
        rng = random.Random(rng)
    T = seq_len + 1
    S = T if span is None else max(1, min(int(span), T))
    last_error: Exception | None = None
    filler_ids = as_id_list(filler_ids)
    pc = pieces_of(tokenizer)
    kinds = list(kinds)
    opts = RecallOptions(space=TRAIN_SPACE, filler_ids=filler_ids, key_len=key_len, value_len=value_len,
                         pairs=pairs, max_extra_queries=max_extra_queries, ruler=as_ruler(ruler))
    for kind in [k for k in kinds if probe_kind(k, "recall kind").rows is not None]:
        entry = probe_kind(kind)
        need = entry.row_min_length(pairs) if entry.row_min_length else 0
        if need > S:  # checked up front: vectorised rows are built after the loop
            kinds.remove(kind)
            last_error = RecallLengthError(f"{kind} with data.recall_pairs={pairs} needs {need} tokens, got {S}")
    batched: dict[str, list[int]] = {k: [] for k in kinds if probe_kind(k).rows is not None}  # kind -> its rows
    rows: list[list[int] | None] = [None] * n
    masks: list[list[bool] | None] = [None] * n
    i = 0
    while i < n:
        if not kinds:
            raise RecallLengthError(
                f"data.recall_mix: no recall kind fits in data.seq_len={seq_len} tokens ({last_error}); "
                "use a longer data.seq_len or set data.recall_mix=0"
            )
        kind = kinds[rng.randrange(len(kinds))]
        if kind in batched:
            batched[kind].append(i)
            i += 1
            continue
        try:
            seq, mask = make_recall_sequence(
                pc, S, rng, kind=kind, space=TRAIN_SPACE, filler_ids=filler_ids, key_len=key_len,
                value_len=value_len, max_extra_queries=max_extra_queries, ruler=opts.ruler,
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
    if any(batched.values()) or S < T:  # real text needed (drawn here only then: other rows stay as they were)
        g = np.random.default_rng(rng.getrandbits(64))
        if text is None:
            F = pc.filler_array(filler_ids)
            text = F[(g.integers(len(F), size=(n, 1)) + np.arange(T)) % len(F)]
        text = np.asarray(text, dtype=np.int64)
        x[done, S:] = text[done, S:]
        for kind, at in batched.items():
            if at:
                x[at], m[at] = probe_kind(kind).rows(pc, text[at], g, S, opts)
    x_t = torch.from_numpy(x)
    return (x_t, torch.from_numpy(m)) if return_mask else x_t

