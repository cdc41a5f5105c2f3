"""What a recall generator returns (`RecallSample`), its length error, and the tokenizer interface it needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
    ``candidates`` / ``candidate_depths`` / ``gold_distance``: see README.md (Candidates). ``prefix``: filler
    tokens before the window (mqar_offset: ``prefix_multiple * window``; 0 otherwise). ``any_order``: a
    multi-token answer scored RULER's way, right in any order (greedy decoding; niah_multiquery)."""

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
    any_order: bool = False


def with_mask(ids: list[int], answer: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    """A training sequence ``ids + answer`` and its answer mask: True on the (start, end) ``spans``."""
    seq = ids + answer
    mask = [False] * len(seq)
    for a, b in spans:
        mask[a:b] = [True] * (b - a)
    return seq, mask
