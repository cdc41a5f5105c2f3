"""Token pieces: the ids of the fixed text pieces, tokenized once per tokenizer, and the filler ids (see
README.md, Segment tokenization)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pelab.data.recall.sample import Tokenizer

if TYPE_CHECKING:
    import torch

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


class Pieces:
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


# One Pieces per tokenizer object: the text pieces are tokenised once, not once per cell or batch.
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pieces_of(tokenizer: Tokenizer | Pieces) -> Pieces:
    """The shared `Pieces` of a tokenizer (a `Pieces` is returned as it is)."""
    if isinstance(tokenizer, Pieces):
        return tokenizer
    try:
        pc = _PIECES.get(tokenizer)
        if pc is None:
            pc = _PIECES[tokenizer] = Pieces(tokenizer)
        return pc
    except TypeError:  # not weak-referenceable
        return Pieces(tokenizer)


def as_id_list(ids: Sequence[int] | torch.Tensor | None) -> list[int] | None:
    """Filler ids as a plain list of ints (accepts a LongTensor or numpy array, e.g. from eval_tokens)."""
    if ids is None or isinstance(ids, list):
        return ids
    if hasattr(ids, "tolist"):
        return [int(t) for t in ids.tolist()]
    return [int(t) for t in ids]
