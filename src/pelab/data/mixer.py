"""The default recall mixer: rows of synthetic recall sequences (`pelab.data.recall.make_recall_batch`) for the
training stream's recall mix hook (`pelab.data.windows`), with the curriculum of `data.recall_curriculum`.

It draws the `recall_kinds` from the "train" key space, with `recall_key_len` / `recall_value_len` hex chars,
`recall_pairs` mqar pairs and the RULER-style kinds' `recall_ruler` difficulty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pelab.data.recall import KV, PASSKEY, make_recall_batch
from pelab.data.recall.ruler_options import RulerOptions
from pelab.data.windows import MixedRows
from pelab.errors import RecallLengthError


class RecallMixer:
    """Default `mixer`: rows of synthetic recall sequences (pelab.data.recall), seeded from the
    batch's generator. A class (not a closure) so it pickles into DataLoader workers.

    kinds: which generators to mix (pelab.data.recall.kind_names(trainable=True)); key_len / value_len: hex chars of kv
    keys / values; pairs: N of mqar rows; curriculum: [[step, span], ...] or [[step, span, share], ...]
    (from `step` on, each recall sequence occupies only the first `span` tokens of its row, then the row's
    own text; before the first entry and with None: the whole row; `share`, where given, replaces
    data.recall_mix from that step); ruler: the RULER-style kinds' difficulty (None: its defaults). It returns
    `MixedRows`: the rows, their answer tokens and the row's own text after the span (scored as text under
    two_means)."""

    def __init__(
        self,
        tokenizer: Any,
        kinds: Sequence[str] = (KV, PASSKEY),
        key_len: int = 3,
        value_len: int = 3,
        pairs: int = 8,
        curriculum: Sequence[Sequence[int]] | None = None,
        ruler: RulerOptions | None = None,
    ):
        self.tokenizer, self.kinds = tokenizer, tuple(kinds)
        self.key_len, self.value_len = int(key_len), int(value_len)
        self.pairs, self.ruler = int(pairs), ruler
        # (step, span, share or None), sorted by step
        self.curriculum = sorted(
            (int(e[0]), int(e[1]), float(e[2]) if len(e) > 2 else None) for e in curriculum
        ) if curriculum else []

    def _stage(self, step: int) -> tuple[int | None, float | None]:
        """(span, share) of the curriculum stage holding `step` ((None, None) before the first)."""
        stage: tuple[int | None, float | None] = (None, None)
        for start, width, share in self.curriculum:
            if step >= start:
                stage = (width, share)
        return stage

    def span(self, step: int) -> int | None:
        """The recall span at this step (None = the whole row)."""
        return self._stage(step)[0]

    def share(self, step: int, default: float) -> float:
        """The fraction of recall rows at this step: the stage's share, else `default` (data.recall_mix)."""
        share = self._stage(step)[1]
        return default if share is None else share

    def check(self, length: int) -> None:
        """One row of each kind with its own batch builder (``rows``: mqar, the RULER-style kinds) at every span the
        curriculum uses, so that a kind too long for a span fails with its one-line RecallLengthError before the
        first step, not at the step that reaches the span (kinds built row by row are skipped where they do not fit)."""
        from pelab.data.recall import probe_kind

        spans = {None} | {width for _, width, _ in self.curriculum}
        for kind in [k for k in self.kinds if probe_kind(k).rows is not None]:
            for span in spans:
                try:
                    make_recall_batch(self.tokenizer, length - 1, 1, 0, kinds=[kind], key_len=self.key_len,
                                      value_len=self.value_len, pairs=self.pairs, span=span, ruler=self.ruler)
                except RecallLengthError as err:
                    where = (f"a data.recall_curriculum span of {span}" if span is not None and span < length
                             else f"data.seq_len + 1 = {length}")
                    raise RecallLengthError(f"data.recall_kinds: {err} in {where}; shorten the kind's settings or "
                                            "lengthen the span") from None

    def __call__(
        self, n: int, length: int, rng: np.random.Generator, step: int = 0, text: np.ndarray | None = None
    ) -> MixedRows:
        span = self.span(step)
        rows, mask = make_recall_batch(
            self.tokenizer, length - 1, n, int(rng.integers(2**62)), kinds=self.kinds,
            key_len=self.key_len, value_len=self.value_len, return_mask=True, pairs=self.pairs,
            span=span, text=text, ruler=self.ruler,
        )  # (n, length) each
        text_mask = np.zeros((n, length), dtype=bool)
        if span is not None and text is not None:
            text_mask[:, span + 1 :] = True  # real text after the span (its first token follows recall tokens)
        return MixedRows(np.asarray(rows, dtype=np.int64), mask.numpy(), text_mask)
