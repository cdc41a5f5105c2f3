"""The training batch: `Batch`, three `(B, T+1)` tensors per step -- the token ids (inputs = [:, :-1], targets =
[:, 1:]), which tokens are scored as targets, and which are recall answers.

Loss on mixed rows (`recall_loss`): "all" (default) = every token of a mixed row is a training target,
like text. "answers" = only the answer tokens (the retrieved values / passkeys) are. "two_means" = the mean
NLL over text targets (the text rows, and the real text that follows a curriculum span in a recall row)
plus the mean NLL over answer targets, each over the whole batch (`two_means`): the few answers weigh
as much as all the text. Under "answers" and "two_means" a mixed row's context-only tokens are fed but not
scored (`scored` False) and its answer tokens are marked (`answers`); text rows are scored everywhere and hold
no answer.
Why answer-only: a random key or value cannot be predicted, so with "all" most of a mixed row's
loss is irreducible noise and the few retrieval targets carry little of the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

IGNORE_INDEX = -100  # target of a position that is not scored (F.cross_entropy's default ignore_index)


class Batch(NamedTuple):
    """One training step's rows. A NamedTuple: the DataLoader, pin_memory and Lightning's move to the device
    handle it field by field, as they handle a tensor."""

    tokens: torch.Tensor  # (B, T+1) int64 ids
    scored: torch.Tensor  # (B, T+1) bool: the token is a training target (False: fed as context only)
    answers: torch.Tensor  # (B, T+1) bool: the token is a recall answer (recall_loss answers / two_means)

    @classmethod
    def text(cls, tokens: torch.Tensor) -> Batch:
        """Rows of text: every token scored, none an answer."""
        return cls(tokens, torch.ones_like(tokens, dtype=torch.bool), torch.zeros_like(tokens, dtype=torch.bool))

    @classmethod
    def of(cls, tokens: np.ndarray, scored: np.ndarray, answers: np.ndarray) -> Batch:
        """The Batch of three (B, T+1) arrays (shared memory, as torch.from_numpy)."""
        return cls(torch.from_numpy(tokens), torch.from_numpy(scored), torch.from_numpy(answers))

    @classmethod
    def cat(cls, parts: Sequence[Batch]) -> Batch:
        """The rows of `parts`, one after another (B = the parts' rows together)."""
        return cls(*(torch.cat(field) for field in zip(*parts, strict=True)))

    @property
    def inputs(self) -> torch.Tensor:
        """(B, T) ids the model reads."""
        return self.tokens[:, :-1]

    @property
    def targets(self) -> torch.Tensor:
        """(B, T) next-token ids, IGNORE_INDEX where not scored."""
        return torch.where(self.scored[:, 1:], self.tokens[:, 1:], IGNORE_INDEX)

    @property
    def answer_targets(self) -> torch.Tensor:
        """(B, T) bool: the target is a recall answer."""
        return self.answers[:, 1:]
