"""Synthetic recall sequences on token ids: key-value retrieval and passkey.

Used by the lost-in-the-middle probes (``space="probe"``) and by the optional training mix
``data.recall_mix`` (``space="train"``, ``make_recall_batch``).

* **kv** (after Liu et al., "Lost in the Middle"): ``{"k1": "v1", "k2": "v2", ...}`` with random hex
  keys (unique) and values, the gold pair at a chosen depth, then ``\\nKey: "k" Value: "``; the answer
  is the value's tokens.
* **passkey** (after Mohtashami & Jaggi): filler text (real text from the validation split, or the
  classic repeated sentence), ``The pass key is NNNNN. Remember it. NNNNN is the pass key.`` inserted
  at a chosen depth, then ``What is the pass key? The pass key is``; the answer is `` NNNNN``.

Conventions (shared by probes and the training mix):

* **Length.** ``length`` = ``len(input_ids) + len(answer_ids)``: the model is fed exactly ``length``
  tokens when scoring teacher-forced (prompt + answer), i.e. one window of L tokens at positions
  ``0..L-1``. For the training mix a sequence of ``seq_len + 1`` tokens is one sample of that length.
* **Segment tokenization.** Texts are tokenized piece by piece (quote, key, ``": "``, value, ...) and
  the ids concatenated. That fixes the length exactly and makes the value's ids in the context
  identical to the answer ids (retrieval is a copy of token ids), whatever the tokenizer's merges.
  Leftover tokens (less than one pair) are filled with a one-token whitespace pad before the ``{``.
* **Depth.** ``depth`` in [0, 1] is the relative position of the gold item in the haystack: kv puts the
  gold pair at pair index ``round(depth * (n_pairs - 1))``; passkey inserts the needle after
  ``round(depth * H)`` filler tokens (H = filler length). ``gold_index`` = token index of the first
  answer token's copy inside the context.
* **Paired design.** The random draws of a probe sample depend on (seed, kind, length, sample index)
  but not on the depth: across depths the same pairs / passkey / filler are used, only the position
  of the gold item moves (as in Liu et al.), so depth effects are not sampling noise.
* **Disjoint spaces.** A kv key or a passkey belongs to ``space="train"`` when ``crc32(text)`` is even
  and to ``space="probe"`` when it is odd: same token distribution, no common element, so no probe
  instance (a key -> value pair, a passkey) ever appears in the training mix. kv *values* are drawn
  from all hex strings in both: the answer's prior must be the same in training and probes, otherwise
  a small model learns the training space's structure and the probe measures that prior instead of
  retrieval (observed: a micro model trained on parity-split 2-char values scored -5.4 nats/token on
  probe values, far below uniform's -2.8). Passkeys have 5 digits, whose parity split is not learnable.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

KINDS = ("kv", "passkey")
SPACES = ("train", "probe")
HEX = "0123456789abcdef"

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_MIN, PASSKEY_MAX = 10000, 99999  # 5-digit numbers, split between spaces by hash parity


class Tokenizer(Protocol):
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class RecallSample:
    """One probe / training instance. The model sees ``input_ids + answer_ids`` (``length`` tokens);
    the answer is scored teacher-forced. ``gold_index``: index in ``input_ids`` of the first token of
    the gold value / passkey inside the context. ``n_items``: kv pairs in the context (1 for passkey).
    ``answer_space``: number of possible answers in the sample's space (for the chance level)."""

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

    def __init__(self, n_chars: int, space: str):
        if n_chars < 1:
            raise ValueError(f"key/value length must be >= 1 hex chars, got {n_chars}")
        self.n_chars, self.space = n_chars, space
        # small spaces are enumerated once (exact sampling without replacement); large ones rejection-sampled
        self.pool: list[str] | None = None
        if 16**n_chars <= 1 << 16:
            strings = (format(i, f"0{n_chars}x") for i in range(16**n_chars))
            self.pool = [s for s in strings if space == "any" or in_space(s, space)]

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


# ---------------------------------------------------------------------------------------------
# kv retrieval


def _kv_pair(pc: _Pieces, key: str, value: str) -> tuple[list[int], int]:
    """Ids of ``"key": "value"`` and the offset of the value's first token inside them."""
    head = pc('"') + pc(key) + pc('": "')
    return head + pc(value) + pc('"'), len(head)


def _kv_query(pc: _Pieces, key: str) -> list[int]:
    return pc('\nKey: "') + pc(key) + pc('" Value: "')


def _build_kv(
    pc: _Pieces,
    rng: random.Random,
    length: int,
    depth: float,
    keys: _HexSampler,
    values: _HexSampler,
    n_extra_queries: int = 0,
) -> tuple[list[int], list[int], int, int, list[tuple[int, int]]]:
    """One kv sequence of exactly ``length`` tokens (prompt + final answer).

    Returns (prompt ids, answer ids, gold_index, n_pairs, answer spans), answer spans being the
    (start, end) index ranges in prompt + answer of every answered value (extra training queries and
    the final answer). The random draws do not depend on ``depth`` (only the gold position does).
    """
    gold_key, gold_val = keys.one(rng), values.one(rng)
    gold_pair, val_off = _kv_pair(pc, gold_key, gold_val)
    query, answer, quote = _kv_query(pc, gold_key), pc(gold_val), pc('"')
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
    pairs: list[tuple[str, str, list[int], int]] = []  # (key, value, ids, value offset in ids)
    for k in distractor_keys:
        v = values.one(rng)
        ids, off = _kv_pair(pc, k, v)
        if len(ids) + len(sep) > budget:
            break
        pairs.append((k, v, ids, off))
        budget -= len(ids) + len(sep)
    else:
        if capped and budget >= len(gold_pair) + len(sep):
            raise RecallLengthError(
                f"kv at length={length} needs more unique keys than {keys.n_chars}-hex-char keys offer in the "
                f"{keys.space!r} space ({keys.size}); raise probes.key_len"
            )
    budget += n_extra * per_extra

    # Extra queries (training mix) about random distractors, in random order; dropped if they do not fit.
    extra: list[tuple[list[int], int, int]] = []  # (ids, value offset, value length)
    for j in rng.sample(range(len(pairs)), min(n_extra, len(pairs))):
        k, v = pairs[j][0], pairs[j][1]
        q = _kv_query(pc, k)
        ids = q + pc(v) + quote
        if len(ids) <= budget:
            extra.append((ids, len(q), len(pc(v))))
            budget -= len(ids)

    n_pairs = len(pairs) + 1
    gold_at = round(float(depth) * (n_pairs - 1))
    items = [(p[2], p[3]) for p in pairs]
    items.insert(gold_at, (gold_pair, val_off))

    ids: list[int] = [pc.pad] * budget + list(open_)  # leftover (< one pair) padded before the "{"
    gold_index = -1
    for i, (it, off) in enumerate(items):
        if i:
            ids += sep
        if i == gold_at:
            gold_index = len(ids) + off
        ids += it
    ids += close
    spans: list[tuple[int, int]] = []
    for q_ids, voff, vlen in extra:
        spans.append((len(ids) + voff, len(ids) + voff + vlen))
        ids += q_ids
    ids += query
    spans.append((len(ids), len(ids) + len(answer)))
    assert len(ids) + len(answer) == length, (len(ids), len(answer), length)
    return ids, list(answer), gold_index, n_pairs, spans


# ---------------------------------------------------------------------------------------------
# passkey


def _passkey_parts(pc: _Pieces, key: str) -> tuple[list[int], int, list[int], list[int]]:
    """(needle ids, offset of the first passkey token in the needle, query ids, answer ids)."""
    p = pc(" " + key)
    a = pc(" The pass key is")
    needle = a + p + pc(". Remember it.") + p + pc(" is the pass key.")
    query = pc(" What is the pass key? The pass key is")
    return needle, len(a), query, p


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
    if ids is None:
        return None
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
) -> tuple[list[int], list[int], int]:
    """One passkey sequence of exactly ``length`` tokens. Returns (prompt ids, answer ids, gold_index)."""
    key = passkey_in_space(rng, space)
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
# public API


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
    space: str = "probe",
    key_len: int = 3,
    value_len: int = 3,
) -> list[RecallSample]:
    """``n`` probe samples of exactly ``length`` tokens (prompt + answer) with the gold item at ``depth``.

    Sample i draws from ``random.Random(f"{seed}/{kind}/{length}/{i}")``: fixed across runs and
    encodings, and the same instance at every depth (only the gold position moves).
    ``filler_ids``: passkey filler (real text token ids); None = the fixed repeated sentence.
    ``key_len`` / ``value_len``: hex characters of kv keys / values.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown probes.kinds entry {kind!r}; known: {list(KINDS)}")
    depth = _check_depth(depth)
    filler_ids = as_id_list(filler_ids)
    pc = _Pieces(tokenizer)
    keys, values = (_sampler(key_len, space), _sampler(value_len, "any")) if kind == "kv" else (None, None)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{kind}/{int(length)}/{i}")
        if kind == "kv":
            ids, ans, gold, n_pairs, _ = _build_kv(pc, rng, int(length), depth, keys, values)
            out.append(RecallSample(ids, ans, gold, depth, int(length), kind, n_pairs, values.size))
        else:
            ids, ans, gold = _build_passkey(pc, rng, int(length), depth, space, filler_ids)
            n_keys = (PASSKEY_MAX - PASSKEY_MIN + 1) // 2
            out.append(RecallSample(ids, ans, gold, depth, int(length), kind, 1, n_keys))
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
) -> tuple[list[int], list[bool]]:
    """One training-mix sequence of exactly ``length`` tokens and its answer mask (True on answer tokens).

    kv sequences also ask ``0..max_extra_queries`` extra questions (``Key: "k" Value: "v"``) about
    distractor pairs before the final one: more retrieval signal per sequence. Depth is uniform in [0, 1].
    """
    pc = tokenizer if isinstance(tokenizer, _Pieces) else _Pieces(tokenizer)
    depth = rng.random()
    if kind == "kv":
        ids, ans, _, _, spans = _build_kv(
            pc,
            rng,
            length,
            depth,
            _sampler(key_len, space),
            _sampler(value_len, "any"),
            n_extra_queries=rng.randint(0, max_extra_queries),
        )
    elif kind == "passkey":
        ids, ans, _ = _build_passkey(pc, rng, length, depth, space, filler_ids)
        spans = [(len(ids), len(ids) + len(ans))]
    else:
        raise ValueError(f"unknown recall kind {kind!r}; known: {list(KINDS)}")
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
    kinds: Sequence[str] = KINDS,
    filler_ids: Sequence[int] | None = None,
    key_len: int = 3,
    value_len: int = 3,
    return_mask: bool = False,
    max_extra_queries: int = 3,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Training-mix batch: LongTensor (n, seq_len + 1) of synthetic recall sequences from the "train"
    space (kind drawn uniformly from ``kinds`` per row; kinds too long for ``seq_len`` are skipped, and
    ``RecallLengthError`` names the setting when none fits). ``rng``: a ``random.Random`` or an int seed.
    With ``return_mask`` also a BoolTensor (n, seq_len + 1) marking answer tokens (as targets: row
    ``[:, 1:]`` aligns with the shifted targets). ``max_extra_queries``: see ``make_recall_sequence``.
    """
    if isinstance(rng, int):
        rng = random.Random(rng)
    last_error: Exception | None = None
    filler_ids = as_id_list(filler_ids)
    pc = _Pieces(tokenizer)
    kinds = list(kinds)
    rows, masks = [], []
    while len(rows) < n:
        if not kinds:
            raise RecallLengthError(
                f"data.recall_mix: no recall kind fits in data.seq_len={seq_len} tokens ({last_error}); "
                "use a longer data.seq_len or set data.recall_mix=0"
            )
        kind = kinds[rng.randrange(len(kinds))]
        try:
            seq, mask = make_recall_sequence(
                pc,
                seq_len + 1,
                rng,
                kind=kind,
                space="train",
                filler_ids=filler_ids,
                key_len=key_len,
                value_len=value_len,
                max_extra_queries=max_extra_queries,
            )
        except RecallLengthError as exc:  # this kind does not fit: use the others
            kinds.remove(kind)
            last_error = exc
            continue
        rows.append(seq)
        masks.append(mask)
    x = torch.tensor(rows, dtype=torch.long).view(n, seq_len + 1)
    if return_mask:
        return x, torch.tensor(masks, dtype=torch.bool).view(n, seq_len + 1)
    return x
