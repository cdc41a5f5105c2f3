"""Where the evaluation blocks lie in a split, and which document each belongs to (numpy only: the report uses it
to rebuild the blocks of committed runs without torch).

A split is one stream of documents joined by EOT, cut into slots of N tokens (N the longest evaluated length);
a block is a slot plus the next slot's first token, so the blocks' scored tokens (start + 1 .. start + N) never
overlap. A block may cross a document boundary, as the training windows do; it belongs to the document that
holds most of its scored tokens.

Two draws of K slots, both reproducible from ``eval.seed``:

* ``slots_by_document`` (runs that record ``block_docs``) -- stratified by document: each document that can
  own a slot gets one block while K >= their number, the rest in proportion to the slots each has left; the
  slots inside a document drawn at random. The blocks cover as many documents as the split has (a document
  shorter than N / 2 tokens never holds most of a block: its tokens are scored inside its neighbours' blocks).
* ``uniform_slots`` (runs that record no ``block_docs``) -- K slots drawn uniformly over the whole split. In a
  split of a few long documents most blocks then come from the longest ones, and many are adjacent. Kept to
  rebuild the blocks of runs made with it (``pelab.report.eval_text``).
"""

from __future__ import annotations

import numpy as np


def slot_count(n_tokens: int, block_length: int) -> int:
    """Slots of ``block_length`` scored tokens in a stream of ``n_tokens`` (the last needs one more target)."""
    slots = (int(n_tokens) - 1) // int(block_length)
    if slots < 1:
        raise ValueError(f"the evaluation split has {n_tokens} tokens, fewer than one block of {block_length + 1}")
    return slots


def uniform_slots(n_tokens: int, block_length: int, n_blocks: int | None, seed: int) -> np.ndarray:
    """(K,) sorted start offsets of ``n_blocks`` slots drawn without replacement by ``seed``, uniformly over the
    stream; None, or more than there are: every slot (the whole split as one contiguous stream)."""
    slots = slot_count(n_tokens, block_length)
    k = slots if n_blocks is None else min(int(n_blocks), slots)
    chosen = np.arange(slots) if k == slots else np.sort(np.random.default_rng(seed).choice(slots, k, replace=False))
    return chosen * int(block_length)


def block_documents(starts: np.ndarray, block_length: int, doc_starts: np.ndarray) -> np.ndarray:
    """(K,) index of the document each block belongs to: the one holding most of its scored tokens ``start + 1
    .. start + block_length`` (a tie: the earlier one). ``doc_starts`` (n_docs + 1,): where each document starts
    in the split's stream, then the stream's length (``TokenCache.offsets``)."""
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    lo = np.asarray(starts, dtype=np.int64) + 1  # (K,) the scored targets [lo, hi)
    hi = lo + int(block_length)
    first = np.searchsorted(doc_starts, lo, side="right") - 1  # (K,) the documents holding lo .. hi - 1
    last = np.searchsorted(doc_starts, hi - 1, side="right") - 1
    cand = np.minimum(first[:, None] + np.arange(int((last - first).max(initial=0)) + 1), last[:, None])  # (K, S)
    held = np.minimum(doc_starts[cand + 1], hi[:, None]) - np.maximum(doc_starts[cand], lo[:, None])  # (K, S)
    held[cand < first[:, None] + np.arange(cand.shape[1])] = -1  # a clipped repeat of the last document
    return first + np.argmax(held, axis=1)  # the first maximum: a tie goes to the earlier document


def allot(capacity: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks per document, ``k`` in all, at most ``capacity`` (its slots) each: one per document, the rest in
    proportion to the slots each has left (largest remainders; Hamilton's method). With fewer blocks than
    documents: one each for k documents drawn with probability proportional to their slots."""
    capacity = np.asarray(capacity, dtype=np.int64)
    if k < capacity.size:
        out = np.zeros_like(capacity)
        out[rng.choice(capacity.size, k, replace=False, p=capacity / capacity.sum())] = 1
        return out
    left = capacity - 1
    share = (k - capacity.size) * left / max(int(left.sum()), 1)  # (D,) the proportional share of the rest
    out = 1 + np.floor(share).astype(np.int64)
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    out[order[: k - int(out.sum())]] += 1  # a fractional share stays below `left`: never past capacity
    return out


def slots_by_document(n_tokens: int, block_length: int, n_blocks: int | None, seed: int,
                      doc_starts: np.ndarray) -> np.ndarray:
    """(K,) sorted start offsets of ``n_blocks`` slots drawn by ``seed`` stratified by document (``allot``): each
    slot belongs to its majority document (``block_documents``) and every document that owns a slot gets at
    least one block while ``n_blocks`` >= their number; inside a document its slots are drawn at random. None,
    or more than there are: every slot, as ``uniform_slots``."""
    slots = slot_count(n_tokens, block_length)
    if n_blocks is None or int(n_blocks) >= slots:
        return np.arange(slots) * int(block_length)
    owner = block_documents(np.arange(slots) * int(block_length), block_length, doc_starts)  # (slots,)
    docs, capacity = np.unique(owner, return_counts=True)
    rng = np.random.default_rng(seed)
    quota = allot(capacity, int(n_blocks), rng)
    chosen = [rng.choice(np.flatnonzero(owner == d), q, replace=False) for d, q in zip(docs, quota) if q]
    return np.sort(np.concatenate(chosen)) * int(block_length)
