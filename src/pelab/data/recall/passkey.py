"""passkey and passkey_single: a needle with the pass key in filler text, then the question (see README.md,
Kinds). passkey draws a 5-digit key, passkey_single one reserved value id (``single=True``)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import PASSKEY_FILLER, Pieces, as_id_list
from pelab.data.recall.sample import RecallSample, with_mask
from pelab.data.recall.spaces import PASSKEY_MAX, PASSKEY_MIN, passkey_in_space, reserved_ids
from pelab.errors import RecallLengthError


def _passkey_parts(pc: Pieces, key: str | int) -> tuple[list[int], int, list[int], list[int]]:
    """(needle ids, offset of the first passkey token in the needle, query ids, answer ids).
    ``key``: a 5-digit string (passkey) or one reserved value id (passkey_single)."""
    if isinstance(key, str):
        p = pc(" " + key)
        a = pc(" The pass key is")
        needle = a + p + pc(". Remember it.") + p + pc(" is the pass key.")
        return needle, len(a), pc(" What is the pass key? The pass key is"), p
    p, a = [int(key)], pc(" The pass key is ")
    needle = a + p + pc(". Remember it. ") + p + pc(" is the pass key.")
    return needle, len(a), pc(" What is the pass key? The pass key is "), p


def _filler(pc: Pieces, rng: random.Random, n: int, filler_ids: Sequence[int] | None) -> list[int]:
    """Exactly n filler tokens: a random span of ``filler_ids`` (wrapping around if shorter) or the
    classic sentence repeated."""
    if n <= 0:
        return []
    if filler_ids is not None:
        if len(filler_ids) == 0:
            raise ValueError(
                "passkey filler_ids is empty; pass real text token ids or None for the fixed sentence"
            )
        src, start = filler_ids, rng.randrange(len(filler_ids))
    else:
        src, start = pc(PASSKEY_FILLER + " "), 0
    out: list[int] = []
    while len(out) < n:  # wrap around a short source
        out += src[start : start + n - len(out)]
        start = 0
    return out


def build_passkey(
    pc: Pieces,
    rng: random.Random,
    length: int,
    depth: float,
    space: str,
    filler_ids: Sequence[int] | None,
    single: range | None = None,
) -> tuple[list[int], list[int], int]:
    """One passkey sequence of exactly ``length`` tokens. Returns (prompt ids, answer ids, gold_index).
    ``single``: the reserved value ids (passkey_single) instead of a 5-digit key."""
    if single is None:
        key: str | int = passkey_in_space(rng, space)
    else:
        if len(single) == 0:
            raise RecallLengthError("passkey_single needs reserved values; set tokenizer.reserved_values >= 1")
        key = single[rng.randrange(len(single))]
    needle, key_off, query, answer = _passkey_parts(pc, key)
    h = length - len(needle) - len(query) - len(answer)
    if h < 0:
        raise RecallLengthError(
            f"passkey needs at least {length - h} tokens for the needle and the question; got length={length}"
        )
    filler = _filler(pc, rng, h, filler_ids)
    at = round(float(depth) * h)
    ids = filler[:at] + needle + filler[at:] + query
    assert len(ids) + len(answer) == length
    return ids, list(answer), at + key_off


def passkey_probe(
    pc: Pieces, name: str, length: int, depth: float, n: int, seed: int, opts: RecallOptions, single: bool = False
) -> list[RecallSample]:
    """``n`` passkey probe samples of one cell; sample i draws from ``random.Random(f"{seed}/{name}/{length}/{i}")``."""
    filler_ids = as_id_list(opts.filler_ids)
    ids_range = reserved_ids(pc)[1] if single else None
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{name}/{length}/{i}")
        ids, ans, gold = build_passkey(pc, rng, length, depth, opts.space, filler_ids, ids_range)
        n_keys = len(ids_range) if ids_range is not None else (PASSKEY_MAX - PASSKEY_MIN + 1) // 2
        s = RecallSample(ids, ans, gold, depth, length, name, 1, n_keys)
        s.candidates, s.candidate_depths = [ans[0]], [gold / (len(ids) - 1)]
        s.gold_distance = len(ids) - gold
        out.append(s)
    return out


def passkey_row(
    pc: Pieces, length: int, rng: random.Random, opts: RecallOptions, single: bool = False
) -> tuple[list[int], list[bool]]:
    """One passkey training sequence (depth uniform in [0, 1]) and its answer mask."""
    depth = rng.random()
    ids_range = reserved_ids(pc)[1] if single else None
    ids, ans, _ = build_passkey(pc, rng, length, depth, opts.space, opts.filler_ids, ids_range)
    return with_mask(ids, ans, [(len(ids), len(ids) + len(ans))])
