"""kv and kv_single: a JSON object of key-value pairs with the gold pair at a chosen depth, then the query
``Key: "k" Value: "`` (see README.md, Kinds). kv draws hex keys and values, kv_single reserved ids: the
same builders with other samplers (`hex_samplers`, `reserved_samplers`)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.sample import RecallSample, with_mask
from pelab.data.recall.spaces import ANY_SPACE, HexSampler, ReservedSampler, hex_sampler, reserved_ids
from pelab.errors import RecallLengthError

Samplers = Callable[[Pieces, RecallOptions], tuple[Any, Any]]


def hex_samplers(pc: Pieces, opts: RecallOptions) -> tuple[HexSampler, HexSampler]:
    """kv: hex keys from ``opts.space``, hex values from all hex strings."""
    return hex_sampler(opts.key_len, opts.space), hex_sampler(opts.value_len, ANY_SPACE)


def reserved_samplers(pc: Pieces, opts: RecallOptions) -> tuple[ReservedSampler, ReservedSampler]:
    """kv_single: the tokenizer's reserved key and value ids."""
    K, M = reserved_ids(pc)
    return ReservedSampler(K, "keys"), ReservedSampler(M, "values")


def kv_probe(
    pc: Pieces, name: str, length: int, depth: float, n: int, seed: int, opts: RecallOptions, samplers: Samplers
) -> list[RecallSample]:
    """``n`` kv probe samples of one cell; sample i draws from ``random.Random(f"{seed}/{name}/{length}/{i}")``."""
    keys, values = samplers(pc, opts)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{name}/{length}/{i}")
        ids, ans, gold, n_pairs, _, starts = build_kv(pc, rng, length, depth, keys, values)
        s = RecallSample(ids, ans, gold, depth, length, name, n_pairs, values.size)
        s.candidates = [ids[j] for j in starts]
        s.candidate_depths = [j / (len(ids) - 1) for j in starts]
        s.gold_distance = len(ids) - gold
        out.append(s)
    return out


def kv_row(
    pc: Pieces, length: int, rng: random.Random, opts: RecallOptions, samplers: Samplers
) -> tuple[list[int], list[bool]]:
    """One kv training sequence (depth uniform in [0, 1]) with ``0..opts.max_extra_queries`` extra questions
    about distractor pairs before the final one, and its answer mask."""
    depth = rng.random()
    keys, values = samplers(pc, opts)
    ids, ans, _, _, spans, _ = build_kv(
        pc, rng, length, depth, keys, values, n_extra_queries=rng.randint(0, opts.max_extra_queries)
    )
    return with_mask(ids, ans, spans)


def _kv_pair(pc: Pieces, key: list[int], value: list[int]) -> tuple[list[int], int]:
    """Ids of ``"key": "value"`` and the offset of the value's first token inside them."""
    head = pc('"') + key + pc('": "')
    return head + value + pc('"'), len(head)


def _kv_query(pc: Pieces, key: list[int]) -> list[int]:
    return pc('\nKey: "') + key + pc('" Value: "')


def build_kv(
    pc: Pieces,
    rng: random.Random,
    length: int,
    depth: float,
    keys: HexSampler | ReservedSampler,
    values: HexSampler | ReservedSampler,
    n_extra_queries: int = 0,
) -> tuple[list[int], list[int], int, int, list[tuple[int, int]], list[int]]:
    """One kv sequence of exactly ``length`` tokens (prompt + final answer).

    Returns (prompt ids, answer ids, gold_index, n_pairs, answer spans, value starts), answer spans being
    the (start, end) index ranges in prompt + answer of every answered value (extra training queries and
    the final answer), value starts the index of every value's first token in the context, in order.
    The random draws do not depend on ``depth`` (only the gold position does).
    """
    gold_key, gold_val = keys.one(rng), values.one(rng)
    gk, gv = keys.ids(pc, gold_key), values.ids(pc, gold_val)
    gold_pair, val_off = _kv_pair(pc, gk, gv)
    query, answer, quote = _kv_query(pc, gk), gv, pc('"')
    open_, close, sep = pc("{"), pc("}"), pc(", ")
    budget = length - len(open_) - len(close) - len(query) - len(answer) - len(gold_pair)
    if budget < 0:
        raise RecallLengthError(
            f"kv needs at least {length - budget} tokens for one pair and the query; got length={length}"
        )
    # Room for the extra (training) queries, each about as long as the final query + value + quote.
    per_extra = len(query) + len(answer) + len(quote)
    n_extra = max(0, min(n_extra_queries, budget // max(1, per_extra + len(gold_pair) + len(sep))))
    budget -= n_extra * per_extra

    # Upper bound on the number of distractors that can fit (every pair costs at least min_cost).
    min_cost = 2 * len(quote) + len(pc('": "')) + len(sep) + 2
    want = budget // min_cost + 1
    capped = want > keys.size - 1
    distractor_keys = [k for k in keys.unique(rng, min(want, keys.size - 1) + 1) if k != gold_key]
    if values.distinct:  # one value per pair, none equal to the gold's
        others = [v for v in values.unique(rng, len(distractor_keys) + 1) if v != gold_val]
        draw_value = iter(others).__next__
    else:
        draw_value = functools.partial(values.one, rng)
    pairs: list[tuple[Any, Any, list[int], int]] = []  # (key, value, ids, value offset in ids)
    for k in distractor_keys:
        try:
            v = draw_value()
        except StopIteration:  # fewer distinct values than keys
            break
        ids, off = _kv_pair(pc, keys.ids(pc, k), values.ids(pc, v))
        if len(ids) + len(sep) > budget:
            break
        pairs.append((k, v, ids, off))
        budget -= len(ids) + len(sep)
    else:
        if capped and budget >= len(gold_pair) + len(sep) and not keys.spread:
            raise RecallLengthError(
                f"kv at length={length} needs more unique keys than {keys.n_chars}-hex-char keys offer in the "
                f"{keys.space!r} space ({keys.size}); raise probes.key_len"
            )
    budget += n_extra * per_extra

    # Extra queries (training mix) about random distractors, in random order; dropped if they do not fit.
    extra: list[tuple[list[int], int, int]] = []  # (ids, value offset, value length)
    for j in rng.sample(range(len(pairs)), min(n_extra, len(pairs))):
        k, v = pairs[j][0], pairs[j][1]
        q, vi = _kv_query(pc, keys.ids(pc, k)), values.ids(pc, v)
        ids = q + vi + quote
        if len(ids) <= budget:
            extra.append((ids, len(q), len(vi)))
            budget -= len(ids)

    n_pairs = len(pairs) + 1
    gold_at = round(float(depth) * (n_pairs - 1))
    items = [(p[2], p[3]) for p in pairs]
    items.insert(gold_at, (gold_pair, val_off))

    # Leftover: before the "{" (less than one pair), or spread between the pairs (reserved keys ran out).
    gaps = [0] * (n_pairs + 1)
    if keys.spread:
        gaps = [budget // (n_pairs + 1)] * (n_pairs + 1)
    gaps[0] += budget - sum(gaps)
    ids: list[int] = [pc.pad] * gaps[0] + list(open_)
    gold_index, value_starts = -1, []
    for i, (it, off) in enumerate(items):
        if i:
            ids += sep + [pc.pad] * gaps[i]
        value_starts.append(len(ids) + off)
        if i == gold_at:
            gold_index = len(ids) + off
        ids += it
    ids += [pc.pad] * gaps[n_pairs] + close
    spans: list[tuple[int, int]] = []
    for q_ids, voff, vlen in extra:
        spans.append((len(ids) + voff, len(ids) + voff + vlen))
        ids += q_ids
    ids += query
    spans.append((len(ids), len(ids) + len(answer)))
    assert len(ids) + len(answer) == length, (len(ids), len(answer), length)
    return ids, list(answer), gold_index, n_pairs, spans, value_starts
