"""Synthetic recall sequences on token ids: associative recall (mqar), key-value retrieval (kv), passkey.

Used by the lost-in-the-middle probes (``space="probe"``) and by the optional training mix
``data.recall_mix`` (``space="train"``, ``make_recall_batch``).

Kinds (``KINDS``; all but ``mqar_offset`` can be trained on, ``TRAIN_KINDS``):

* **mqar** (multi-query associative recall, Arora et al. 2023, "Zoology", ``multiquery_ar``): N = ``pairs``
  single-token pairs ``<k><v>`` (keys from the tokenizer's reserved key ids, values from its reserved value
  ids, both without replacement within an instance, so every value names exactly one pair) inserted into a
  haystack of H filler tokens (real text) at N evenly spaced slots: pair at slot j goes after
  ``s_j = round(j * H / (N - 1))`` filler tokens (``round(depth * H)`` when N = 1). The gold pair takes slot
  ``round(depth * (N - 1))``, the distractors the other slots in an order fixed per instance. Query: the gold
  key; answer: the gold value (one token). Training rows ask all N keys after the haystack in random order,
  each followed by its value (the answers), pairs at uniformly random places in the haystack.
* **kv** (after Liu et al., "Lost in the Middle"): ``{"k1": "v1", "k2": "v2", ...}`` with random hex
  keys (unique) and values, the gold pair at a chosen depth, then ``\nKey: "k" Value: "``; the answer
  is the value's tokens. **kv_single**: the same format with one reserved key id and one reserved value id
  in place of the hex strings (keys and values distinct within an instance); when the context has room for
  more pairs than there are reserved keys, the leftover is spread evenly as one-token whitespace between the
  pairs (still valid JSON), so the pairs span the whole context.
* **passkey** (after Mohtashami & Jaggi): filler text (real text from the validation split, or the
  classic repeated sentence), ``The pass key is NNNNN. Remember it. NNNNN is the pass key.`` inserted
  at a chosen depth, then ``What is the pass key? The pass key is``; the answer is `` NNNNN``.
  **passkey_single**: the pass key is one reserved value id (the answer is that one token).
* **mqar_offset** (probe only; position vs distance): an mqar instance of ``length`` tokens (the training
  length) with the gold at the fixed in-window depth ``OFFSET_DEPTH``, preceded by ``prefix_multiple *
  length`` filler tokens (the text that precedes the window's filler). The gold's distance to its query is
  the same at every prefix; only its absolute position grows. ``depth`` is not used.

Conventions (shared by probes and the training mix):

* **Length.** ``length`` = ``len(input_ids) + len(answer_ids)``: the model is fed exactly ``length``
  tokens when scoring teacher-forced (prompt + answer), i.e. one window of L tokens at positions
  ``0..L-1``. For the training mix a sequence of ``seq_len + 1`` tokens is one sample of that length.
  (mqar_offset: ``(1 + prefix_multiple) * length``.)
* **Segment tokenization.** Texts are tokenized piece by piece (quote, key, ``": "``, value, ...) and
  the ids concatenated, each piece once per tokenizer (cached). That fixes the length exactly and makes
  the value's ids in the context identical to the answer ids (retrieval is a copy of token ids), whatever
  the tokenizer's merges. Leftover tokens (less than one pair) are filled with a one-token whitespace pad
  before the ``{``.
* **Depth.** ``depth`` in [0, 1] is the relative position of the gold item in the haystack: kv puts the
  gold pair at pair index ``round(depth * (n_pairs - 1))``, mqar at slot ``round(depth * (N - 1))``;
  passkey inserts the needle after ``round(depth * H)`` filler tokens (H = filler length).
  ``gold_index`` = token index of the first answer token's copy inside the context.
* **Candidates.** ``candidates``: the first answer token of every value in the context, in context order,
  the gold's included (passkey kinds: just the gold; hex kv values may repeat a first token);
  ``candidate_depths``: each one's index in ``input_ids`` / (len(input_ids) - 1); ``gold_distance``:
  ``len(input_ids) - gold_index``, tokens from the gold value's copy to the first answer position.
* **Paired design.** The random draws of a probe sample depend on (seed, kind, length, sample index)
  but not on the depth: across depths the same pairs / passkey / filler are used, only the position
  of the gold item moves (as in Liu et al.), so depth effects are not sampling noise.
* **Disjoint instances.** A hex kv key or a passkey belongs to ``space="train"`` when ``crc32(text)`` is
  even and to ``space="probe"`` when it is odd: same token distribution, no common element, so no probe
  instance (a key -> value pair, a passkey) ever appears in the training mix. kv *values* are drawn
  from all hex strings in both: the answer's prior must be the same in training and probes, otherwise
  a small model learns the training space's structure and the probe measures that prior instead of
  retrieval (observed: a micro model trained on parity-split 2-char values scored -5.4 nats/token on
  probe values, far below uniform's -2.8). Passkeys have 5 digits, whose parity split is not learnable.
  The single-token kinds draw keys and values from the same reserved ranges in training and probes (the
  ranges are too small to split); their instances differ instead: the probes come from their own seed
  stream (``probes.seed``, per sample) and their filler from the validation split, the training rows from
  the batch generator with training text. An mqar probe instance is (its set of N pairs, its filler); two
  random sets of 8 pairs over 64 x 64 ids coincide with probability ~1e-24 (and a test checks real batches).
"""

from __future__ import annotations

import functools
import random
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

KINDS = ("kv", "passkey", "mqar", "kv_single", "passkey_single", "mqar_offset")
TRAIN_KINDS = KINDS[:-1]  # mqar_offset is a probe (the training rows of mqar cover it)
SINGLE_KINDS = ("mqar", "kv_single", "passkey_single", "mqar_offset")  # keys / values are reserved ids
SPACES = ("train", "probe")
HEX = "0123456789abcdef"
OFFSET_DEPTH = 0.5  # mqar_offset: the gold's depth inside its window (fixed distance to the query)

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_MIN, PASSKEY_MAX = 10000, 99999  # 5-digit numbers, split between spaces by hash parity


class Tokenizer(Protocol):
    vocab_size: int
    eot_id: int
    reserved_key_ids: range
    reserved_value_ids: range

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class RecallSample:
    """One probe / training instance. The model sees ``input_ids + answer_ids`` (``length`` tokens);
    the answer is scored teacher-forced. ``gold_index``: index in ``input_ids`` of the first token of
    the gold value / passkey inside the context. ``n_items``: pairs in the context (1 for passkey).
    ``answer_space``: number of possible answers in the sample's space (for the chance level).
    ``candidates`` / ``candidate_depths`` / ``gold_distance``: see the module doc. ``prefix``: filler
    tokens before the window (mqar_offset: ``prefix_multiple * window``; 0 otherwise)."""

    input_ids: list[int]
    answer_ids: list[int]
    gold_index: int
    depth: float
    length: int
    kind: str
    n_items: int = 1
    answer_space: int = 1
    candidates: list[int] = field(default_factory=list)
    candidate_depths: list[float] = field(default_factory=list)
    gold_distance: int = 0
    prefix: int = 0


class RecallLengthError(ValueError):
    """The requested length cannot hold one recall instance."""


# ---------------------------------------------------------------------------------------------
# key spaces


def in_space(text: str, space: str) -> bool:
    """Membership of a kv key or passkey string in the "train" (crc32 even) or "probe" (odd) space."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    return (zlib.crc32(text.encode()) & 1) == (0 if space == "train" else 1)


def hex_space_size(n_chars: int) -> int:
    """Approximate number of hex strings of n_chars in one space (half of 16**n)."""
    return 16**n_chars // 2


class _HexSampler:
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
            self.pool = [s for s in strings if space == "any" or in_space(s, space)]

    def ids(self, pc: _Pieces, item: str) -> list[int]:
        return pc(item)

    def one(self, rng: random.Random) -> str:
        if self.pool is not None:
            return self.pool[rng.randrange(len(self.pool))]
        while True:
            s = "".join(rng.choice(HEX) for _ in range(self.n_chars))
            if self.space == "any" or in_space(s, self.space):
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
        return 16**self.n_chars if self.space == "any" else hex_space_size(self.n_chars)


class _ReservedSampler:
    """Single reserved token ids (kv_single): the same ranges for training and probes."""

    distinct = True  # values distinct within an instance: an answer names exactly one pair
    spread = True  # more room than keys: whitespace between the pairs

    def __init__(self, ids: range, what: str):
        if len(ids) == 0:
            raise RecallLengthError(f"kv_single needs reserved {what}; set tokenizer.reserved_{what} >= 1")
        self.pool, self.space = ids, "reserved"

    def ids(self, pc: _Pieces, item: int) -> list[int]:
        return [item]

    def one(self, rng: random.Random) -> int:
        return self.pool[rng.randrange(len(self.pool))]

    def unique(self, rng: random.Random, count: int) -> list[int]:
        return rng.sample(self.pool, min(count, len(self.pool)))

    @property
    def size(self) -> int:
        return len(self.pool)


def passkey_in_space(rng: random.Random, space: str) -> str:
    while True:
        s = str(rng.randint(PASSKEY_MIN, PASSKEY_MAX))
        if in_space(s, space):
            return s


# ---------------------------------------------------------------------------------------------
# tokenized pieces


class _Pieces:
    """Caches the token ids of the fixed text pieces and of hex strings for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self._cache: dict[str, list[int]] = {}
        self.pad = self._find_pad()
        self._sentence: np.ndarray | None = None

    def __call__(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = list(self.tok.encode(text))
            if len(self._cache) < 200_000:
                self._cache[text] = ids
        return ids

    def _find_pad(self) -> int:
        """A text that encodes to exactly one token: used to pad a context to the exact length."""
        for text in (" ", "\n", ".", "-", "_", "x"):
            ids = self.tok.encode(text)
            if len(ids) == 1:
                return int(ids[0])
        raise ValueError("recall: the tokenizer encodes none of ' ', '\\n', '.' as a single token")

    def filler_array(self, filler_ids: Sequence[int] | np.ndarray | None) -> np.ndarray:
        """Filler as an int64 array: the given ids, or the classic sentence."""
        if filler_ids is None:
            if self._sentence is None:
                self._sentence = np.asarray(self(PASSKEY_FILLER + " "), dtype=np.int64)
            return self._sentence
        arr = np.asarray(filler_ids, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            raise ValueError("recall filler_ids is empty; pass real text token ids or None for the sentence")
        return arr


# One _Pieces per tokenizer object: the text pieces are tokenised once, not once per cell or batch.
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pieces(tokenizer: Tokenizer | _Pieces) -> _Pieces:
    if isinstance(tokenizer, _Pieces):
        return tokenizer
    try:
        pc = _PIECES.get(tokenizer)
        if pc is None:
            pc = _PIECES[tokenizer] = _Pieces(tokenizer)
        return pc
    except TypeError:  # not weak-referenceable
        return _Pieces(tokenizer)


def _reserved(tok: Any) -> tuple[range, range]:
    """The tokenizer's reserved key and value id ranges (pelab.data.tokenizer)."""
    if isinstance(tok, _Pieces):
        tok = tok.tok
    keys, values = getattr(tok, "reserved_key_ids", None), getattr(tok, "reserved_value_ids", None)
    if keys is None or values is None:
        raise ValueError("the single-token recall kinds need a pelab tokenizer with reserved ids")
    return keys, values


# ---------------------------------------------------------------------------------------------
# kv retrieval


def _kv_pair(pc: _Pieces, key: list[int], value: list[int]) -> tuple[list[int], int]:
    """Ids of ``"key": "value"`` and the offset of the value's first token inside them."""
    head = pc('"') + key + pc('": "')
    return head + value + pc('"'), len(head)


def _kv_query(pc: _Pieces, key: list[int]) -> list[int]:
    return pc('\nKey: "') + key + pc('" Value: "')


def _build_kv(
    pc: _Pieces,
    rng: random.Random,
    length: int,
    depth: float,
    keys: _HexSampler | _ReservedSampler,
    values: _HexSampler | _ReservedSampler,
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


# ---------------------------------------------------------------------------------------------
# passkey


def _passkey_parts(pc: _Pieces, key: str | int) -> tuple[list[int], int, list[int], list[int]]:
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


def _filler(pc: _Pieces, rng: random.Random, n: int, filler_ids: Sequence[int] | None) -> list[int]:
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


def as_id_list(ids: Sequence[int] | torch.Tensor | None) -> list[int] | None:
    """Filler ids as a plain list of ints (accepts a LongTensor or numpy array, e.g. from eval_tokens)."""
    if ids is None or isinstance(ids, list):
        return ids
    if hasattr(ids, "tolist"):
        return [int(t) for t in ids.tolist()]
    return [int(t) for t in ids]


def _build_passkey(
    pc: _Pieces,
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


# ---------------------------------------------------------------------------------------------
# mqar (vectorised: one numpy pass per probe cell / per training batch)


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


def _mqar_probe(
    pc: _Pieces,
    kind: str,
    length: int,
    depth: float,
    n: int,
    seed: int,
    filler_ids: Any,
    pairs: int,
    prefix_multiple: int = 0,
) -> list[RecallSample]:
    """mqar / mqar_offset probe samples (see the module doc), built for all n instances at once."""
    K, M = _reserved(pc)
    N = _check_pairs(pairs, K, M, "probes.pairs")
    H = length - 2 * N - 2  # filler tokens of the window
    if H < 0:
        raise RecallLengthError(
            f"mqar with probes.pairs={N} needs at least {2 * N + 2} tokens; got length={length}"
        )
    if kind == "mqar_offset":
        depth, P = OFFSET_DEPTH, int(prefix_multiple) * length
    else:
        P = 0
    F = pc.filler_array(filler_ids)
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


# ---------------------------------------------------------------------------------------------
# public API


def _check_depth(depth: float) -> float:
    d = float(depth)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"probes.depths entries must be in [0, 1], got {depth}")
    return d


def _kv_samplers(pc: _Pieces, kind: str, space: str, key_len: int, value_len: int) -> tuple[Any, Any]:
    if kind == "kv_single":
        K, M = _reserved(pc)
        return _ReservedSampler(K, "keys"), _ReservedSampler(M, "values")
    return _sampler(key_len, space), _sampler(value_len, "any")


def make_probe_samples(
    kind: str,
    tokenizer: Tokenizer,
    length: int,
    depth: float,
    n: int,
    seed: int,
    filler_ids: Sequence[int] | None = None,
    space: str = "probe",
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
    ``(1 + prefix_multiple) * length`` tokens long and ``depth`` is not used (see the module doc).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown probes.kinds entry {kind!r}; known: {list(KINDS)}")
    depth = _check_depth(depth)
    pc = pieces(tokenizer)
    length = int(length)
    if kind in ("mqar", "mqar_offset"):
        return _mqar_probe(pc, kind, length, depth, n, seed, filler_ids, pairs, prefix_multiple)
    filler_ids = as_id_list(filler_ids)
    single = _reserved(pc)[1] if kind == "passkey_single" else None
    keys, values = _kv_samplers(pc, kind, space, key_len, value_len) if kind.startswith("kv") else (None, None)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{kind}/{length}/{i}")
        if keys is not None:
            ids, ans, gold, n_pairs, _, starts = _build_kv(pc, rng, length, depth, keys, values)
            s = RecallSample(ids, ans, gold, depth, length, kind, n_pairs, values.size)
            s.candidates = [ids[j] for j in starts]
            s.candidate_depths = [j / (len(ids) - 1) for j in starts]
        else:
            ids, ans, gold = _build_passkey(pc, rng, length, depth, space, filler_ids, single)
            n_keys = len(single) if single is not None else (PASSKEY_MAX - PASSKEY_MIN + 1) // 2
            s = RecallSample(ids, ans, gold, depth, length, kind, 1, n_keys)
            s.candidates, s.candidate_depths = [ans[0]], [gold / (len(ids) - 1)]
        s.gold_distance = len(ids) - gold
        out.append(s)
    return out


def make_recall_sequence(
    tokenizer: Tokenizer | _Pieces,
    length: int,
    rng: random.Random,
    kind: str = "kv",
    space: str = "train",
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
    pc = pieces(tokenizer)
    if kind == "mqar":
        F = pc.filler_array(filler_ids)
        g = np.random.default_rng(rng.getrandbits(64))
        text = F[(g.integers(len(F)) + np.arange(length)) % len(F)][None]
        rows, mask = mqar_rows(text, pairs, *_reserved(pc), g)
        return rows[0].tolist(), mask[0].tolist()
    depth = rng.random()
    if kind in ("kv", "kv_single"):
        keys, values = _kv_samplers(pc, kind, space, key_len, value_len)
        ids, ans, _, _, spans, _ = _build_kv(
            pc, rng, length, depth, keys, values, n_extra_queries=rng.randint(0, max_extra_queries)
        )
    elif kind in ("passkey", "passkey_single"):
        single = _reserved(pc)[1] if kind == "passkey_single" else None
        ids, ans, _ = _build_passkey(pc, rng, length, depth, space, filler_ids, single)
        spans = [(len(ids), len(ids) + len(ans))]
    else:
        raise ValueError(f"unknown recall kind {kind!r}; known: {list(TRAIN_KINDS)}")
    seq = ids + ans
    mask = [False] * len(seq)
    for a, b in spans:
        mask[a:b] = [True] * (b - a)
    return seq, mask


_SAMPLERS: dict[tuple[int, str], _HexSampler] = {}


def _sampler(n_chars: int, space: str) -> _HexSampler:
    """Hex samplers are tokenizer-independent, so they are shared (the enumerated pool is built once)."""
    key = (n_chars, space)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = _HexSampler(n_chars, space)
    return _SAMPLERS[key]


def make_recall_batch(
    tokenizer: Tokenizer,
    seq_len: int,
    n: int,
    rng: random.Random | int,
    kinds: Sequence[str] = ("kv", "passkey"),
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
    (Recall placed after text instead kept a rope model on the 1/N copy plateau for 1,000+ steps where
    short sequences learned 8-pair mqar in ~300.) ``text`` (n, seq_len + 1): the real text rows the recall
    rows replace, used as that trailing text and as mqar filler (None: ``filler_ids`` or the sentence at
    random offsets).
    """
    if isinstance(rng, int):
        rng = random.Random(rng)
    T = seq_len + 1
    S = T if span is None else max(1, min(int(span), T))
    last_error: Exception | None = None
    filler_ids = as_id_list(filler_ids)
    pc = pieces(tokenizer)
    kinds = list(kinds)
    if "mqar" in kinds and 4 * pairs > S:  # checked up front: mqar rows are built after the loop
        kinds.remove("mqar")
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
        if kind == "mqar":
            mqar_at.append(i)
            i += 1
            continue
        try:
            seq, mask = make_recall_sequence(
                pc, S, rng, kind=kind, space="train", filler_ids=filler_ids, key_len=key_len,
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
            x[mqar_at], m[mqar_at] = mqar_rows(text[mqar_at], pairs, *_reserved(pc), g, S)
    x_t = torch.from_numpy(x)
    return (x_t, torch.from_numpy(m)) if return_mask else x_t

