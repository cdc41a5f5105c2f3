"""mqar and mqar_offset: N single-token key-value pairs in filler text, then a query (probes) or all N
queries (training rows); vectorised, one numpy pass per probe cell / per training batch (see README.md, Kinds)."""

from __future__ import annotations

import functools
import random
import zlib

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.sample import RecallSample
from pelab.data.recall.spaces import reserved_ids
from pelab.errors import RecallLengthError

OFFSET_DEPTH = 0.5  # mqar_offset: the gold's depth inside its window (fixed distance to the query)


def _check_pairs(pairs: int, keys: range, values: range, setting: str) -> int:
    n = int(pairs)
    if n < 1:
        raise RecallLengthError(f"mqar needs {setting} >= 1 pairs; got {n}")
    if n > len(keys) or n > len(values):
        raise RecallLengthError(
            f"mqar with {setting}={n} needs {n} distinct keys and values but the tokenizer reserves {len(keys)} "
            f"keys / {len(values)} values; raise tokenizer.reserved_keys / reserved_values or lower {setting}"
        )
    return n


@functools.lru_cache(maxsize=64)
def _mqar_draws(
    seed: int, kind: str, length: int, n: int, pairs: int, n_keys: int, n_values: int, n_filler: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per probe instance i: N key offsets, N value offsets (each without replacement; pair 0 is the gold)
    and a filler start. Sample i's generator is seeded by (seed, kind, length, i): the same instance at
    every depth (and for any n), cached across the depths of a cell."""
    keys = np.empty((n, pairs), np.int64)
    values = np.empty((n, pairs), np.int64)
    starts = np.empty(n, np.int64)
    tag = zlib.crc32(kind.encode())
    for i in range(n):
        g = np.random.default_rng([int(seed) % 2**64, tag, int(length), i])
        keys[i] = g.choice(n_keys, pairs, replace=False)
        values[i] = g.choice(n_values, pairs, replace=False)
        starts[i] = g.integers(n_filler)
    for a in (keys, values, starts):
        a.flags.writeable = False
    return keys, values, starts


def mqar_probe(
    pc: Pieces, kind: str, length: int, depth: float, n: int, seed: int, opts: RecallOptions, offset: bool = False
) -> list[RecallSample]:
    """mqar / mqar_offset (``offset=True``: the gold at OFFSET_DEPTH of a ``length``-token window after
    ``opts.prefix_multiple * length`` filler tokens) probe samples (see README.md, Kinds), built for all n
    instances at once."""
    K, M = reserved_ids(pc)
    N = _check_pairs(opts.pairs, K, M, "probes.pairs")
    H = length - 2 * N - 2  # filler tokens of the window
    if H < 0:
        raise RecallLengthError(
            f"mqar with probes.pairs={N} needs at least {2 * N + 2} tokens; got length={length}"
        )
    if offset:
        depth, P = OFFSET_DEPTH, int(opts.prefix_multiple) * length
    else:
        P = 0
    F = pc.filler_array(opts.filler_ids)
    keys, values, starts = _mqar_draws(int(seed), kind, length, n, N, len(K), len(M), len(F))

    slots = np.array([round(j * H / (N - 1)) for j in range(N)] if N > 1 else [round(depth * H)])
    g = round(depth * (N - 1))
    order = [0 if j == g else j + (j < g) for j in range(N)]  # slot j holds pair order[j]: gold at g
    kpos = slots + 2 * np.arange(N)  # (N,) in the window's haystack of H + 2N tokens
    pair_at = np.zeros(H + 2 * N, dtype=bool)
    pair_at[kpos] = pair_at[kpos + 1] = True

    T = P + H + 2 * N + 1  # prompt tokens: prefix, haystack with the pairs, query key
    text = F[(starts[:, None] + np.arange(-P, H)) % len(F)]  # (n, P + H): the prefix precedes the window's text
    x = np.empty((n, T), dtype=np.int64)
    x[:, :P] = text[:, :P]
    body = x[:, P : P + H + 2 * N]  # a view
    body[:, ~pair_at] = text[:, P:]
    body[:, kpos] = K.start + keys[:, order]
    body[:, kpos + 1] = M.start + values[:, order]
    x[:, -1] = K.start + keys[:, 0]  # the query: the gold key
    answers = M.start + values[:, 0]
    vpos = P + kpos + 1
    gold_index = int(vpos[g])
    cand_depths = (vpos / (T - 1)).tolist()
    cands = x[:, vpos]
    return [
        RecallSample(
            row, [int(a)], gold_index, float(depth), T + 1, kind, N, len(M), c, list(cand_depths),
            T - gold_index, P,
        )
        for row, a, c in zip(x.tolist(), answers.tolist(), cands.tolist(), strict=True)
    ]


def mqar_rows(
    text: np.ndarray, pairs: int, keys: range, values: range, rng: np.random.Generator, span: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """mqar training rows on top of ``text`` (n, T) real text ids: N pairs at uniformly random places of a
    text haystack, then all N keys asked in random order, each followed by its value. The pairs and queries
    occupy the first ``span`` tokens (None = the whole row; the curriculum), the row's text after them is
    kept. Returns (rows, answer mask), both (n, T); the mask is True on the N answered values."""
    n, T = text.shape
    S = T if span is None else min(int(span), T)
    N = _check_pairs(pairs, keys, values, "data.recall_pairs")
    H = S - 4 * N  # filler tokens inside the span
    if H < 0:
        raise RecallLengthError(
            f"mqar with data.recall_pairs={N} needs {4 * N} tokens for its pairs and queries; got {S}"
        )
    k = keys.start + np.argsort(rng.random((n, len(keys))), axis=1)[:, :N]  # without replacement
    v = values.start + np.argsort(rng.random((n, len(values))), axis=1)[:, :N]
    at = np.sort(rng.integers(0, H + 1, size=(n, N)), axis=1) + 2 * np.arange(N)  # key positions
    r = np.arange(n)[:, None]
    pair_at = np.zeros((n, H + 2 * N), dtype=bool)
    pair_at[r, at] = pair_at[r, at + 1] = True
    hay = np.empty((n, H + 2 * N), dtype=np.int64)
    hay[~pair_at] = text[:, :H].reshape(-1)  # row-major: each row gets its own H tokens
    hay[r, at], hay[r, at + 1] = k, v
    q = np.argsort(rng.random((n, N)), axis=1)  # query order
    queries = np.stack([np.take_along_axis(k, q, 1), np.take_along_axis(v, q, 1)], axis=-1).reshape(n, 2 * N)
    rows = np.concatenate([hay, queries, np.asarray(text[:, S:], dtype=np.int64)], axis=1)
    mask = np.zeros((n, T), dtype=bool)
    mask[:, S - 2 * N + 1 : S : 2] = True
    return rows, mask


def mqar_row(pc: Pieces, length: int, rng: random.Random, opts: RecallOptions) -> tuple[list[int], list[bool]]:
    """One mqar training sequence of ``length`` tokens (filler: ``opts.filler_ids`` or the sentence, at a
    random offset) and its answer mask: all its ``opts.pairs`` keys asked."""
    F = pc.filler_array(opts.filler_ids)
    g = np.random.default_rng(rng.getrandbits(64))
    text = F[(g.integers(len(F)) + np.arange(length)) % len(F)][None]
    rows, mask = mqar_rows(text, opts.pairs, *reserved_ids(pc), g)
    return rows[0].tolist(), mask[0].tolist()


def mqar_batch_rows(
    pc: Pieces, text: np.ndarray, g: np.random.Generator, span: int, opts: RecallOptions
) -> tuple[np.ndarray, np.ndarray]:
    """mqar training rows over a batch's real text rows (``mqar_rows`` with the tokenizer's reserved ids)."""
    return mqar_rows(text, opts.pairs, *reserved_ids(pc), g, span)
