"""Key spaces: the disjoint "train" / "probe" halves of hex keys and passkeys, the samplers that draw keys and
values from them, and the tokenizer's reserved ids that the single-token kinds draw from (see README.md,
Disjoint instances)."""

from __future__ import annotations

import random
import zlib
from typing import Any

from pelab.data.recall.pieces import Pieces
from pelab.errors import RecallLengthError

TRAIN_SPACE, PROBE_SPACE = "train", "probe"
SPACES = (TRAIN_SPACE, PROBE_SPACE)
ANY_SPACE = "any"  # kv values: every hex string, in training and probes alike
RESERVED_SPACE = "reserved"  # the single-token kinds: the same reserved ids in training and probes
HEX = "0123456789abcdef"
PASSKEY_MIN, PASSKEY_MAX = 10000, 99999  # 5-digit numbers, split between spaces by hash parity


def in_space(text: str, space: str) -> bool:
    """Membership of a kv key or passkey string in the "train" (crc32 even) or "probe" (odd) space."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    return (zlib.crc32(text.encode()) & 1) == (0 if space == TRAIN_SPACE else 1)


def hex_space_size(n_chars: int) -> int:
    """Approximate number of hex strings of n_chars in one space (half of 16**n)."""
    return 16**n_chars // 2


def passkey_in_space(rng: random.Random, space: str) -> str:
    while True:
        s = str(rng.randint(PASSKEY_MIN, PASSKEY_MAX))
        if in_space(s, space):
            return s


class HexSampler:
    """Draws hex strings of one length from one space ("train", "probe" or "any"); keys are drawn
    without replacement per sample."""

    distinct = False  # values may repeat within an instance (kv)
    spread = False  # too few keys for the context is an error (raise probes.key_len)

    def __init__(self, n_chars: int, space: str):
        if n_chars < 1:
            raise ValueError(f"key/value length must be >= 1 hex chars, got {n_chars}")
        self.n_chars, self.space = n_chars, space
        # small spaces are enumerated once (exact sampling without replacement); large ones rejection-sampled
        self.pool: list[str] | None = None
        if 16**n_chars <= 1 << 16:
            strings = (format(i, f"0{n_chars}x") for i in range(16**n_chars))
            self.pool = [s for s in strings if space == ANY_SPACE or in_space(s, space)]

    def ids(self, pc: Pieces, item: str) -> list[int]:
        return pc(item)

    def one(self, rng: random.Random) -> str:
        if self.pool is not None:
            return self.pool[rng.randrange(len(self.pool))]
        while True:
            s = "".join(rng.choice(HEX) for _ in range(self.n_chars))
            if self.space == ANY_SPACE or in_space(s, self.space):
                return s

    def unique(self, rng: random.Random, count: int) -> list[str]:
        """``count`` distinct strings (order random)."""
        if self.pool is not None:
            if count > len(self.pool):
                raise RecallLengthError(
                    f"kv needs {count} unique keys but {self.n_chars}-hex-char keys give only {len(self.pool)} "
                    f"in the {self.space!r} space; raise probes.key_len (or shorten the context)"
                )
            return rng.sample(self.pool, count)
        seen: set[str] = set()
        out: list[str] = []
        while len(out) < count:
            s = self.one(rng)
            if s not in seen:
                seen.add(s)
                out.append(s)
        return out

    @property
    def size(self) -> int:
        if self.pool is not None:
            return len(self.pool)
        return 16**self.n_chars if self.space == ANY_SPACE else hex_space_size(self.n_chars)


_SAMPLERS: dict[tuple[int, str], HexSampler] = {}


def hex_sampler(n_chars: int, space: str) -> HexSampler:
    """Hex samplers are tokenizer-independent, so they are shared (the enumerated pool is built once)."""
    key = (n_chars, space)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = HexSampler(n_chars, space)
    return _SAMPLERS[key]


class ReservedSampler:
    """Single reserved token ids (kv_single): the same ranges for training and probes."""

    distinct = True  # values distinct within an instance: an answer names exactly one pair
    spread = True  # more room than keys: whitespace between the pairs

    def __init__(self, ids: range, what: str):
        if len(ids) == 0:
            raise RecallLengthError(f"kv_single needs reserved {what}; set tokenizer.reserved_{what} >= 1")
        self.pool, self.space = ids, RESERVED_SPACE

    def ids(self, pc: Pieces, item: int) -> list[int]:
        return [item]

    def one(self, rng: random.Random) -> int:
        return self.pool[rng.randrange(len(self.pool))]

    def unique(self, rng: random.Random, count: int) -> list[int]:
        return rng.sample(self.pool, min(count, len(self.pool)))

    @property
    def size(self) -> int:
        return len(self.pool)


def reserved_ids(tok: Any) -> tuple[range, range]:
    """The tokenizer's reserved key and value id ranges (pelab.data.tokenizer)."""
    if isinstance(tok, Pieces):
        tok = tok.tok
    keys, values = getattr(tok, "reserved_key_ids", None), getattr(tok, "reserved_value_ids", None)
    if keys is None or values is None:
        raise ValueError("the single-token recall kinds need a pelab tokenizer with reserved ids")
    return keys, values
