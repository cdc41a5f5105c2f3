"""The training batch format: one `(B, T+1)` LongTensor per step (inputs = [:, :-1], targets = [:, 1:]), and
`inputs_and_targets` to read it.

Loss on mixed rows (`recall_loss`): "all" (default) = every token of a mixed row is a training target,
like text. "answers" = only the answer tokens (the retrieved values / passkeys) are. "two_means" = the mean
NLL over text targets (the text rows, and the real text that follows a curriculum span in a recall row)
plus the mean NLL over answer targets, each over the whole batch (`two_means`): the few answers weigh
as much as all the text. The batch stays one `(B, T+1)`
LongTensor; under "answers" and "two_means" a mixed row stores a token that is context only as `-1 - id`
(negative: fed, not scored) and an answer token as `id + ANSWER_FLAG` (fed, scored, and an answer);
`inputs_and_targets(batch)` turns a batch into model inputs (ids), targets (`IGNORE_INDEX` where not
scored) and, with `answers=True`, the answer mask. Text rows are never marked.
Why answer-only: a random key or value cannot be predicted, so with "all" most of a mixed row's
loss is irreducible noise and the few retrieval targets carry little of the gradient.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # target of a position that is not scored (F.cross_entropy's default ignore_index)
ANSWER_FLAG = 1 << 40  # added to an answer token's id in a batch (ids stay far below it)


def inputs_and_targets(
    batch: torch.Tensor, answers: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T+1) training batch -> inputs (B, T) ids, targets (B, T) ids or IGNORE_INDEX
    [, answer mask (B, T) bool: the target is a recall answer, with `answers=True`].

    Negative entries (`-1 - id`) are fed as `id` but not scored; entries >= ANSWER_FLAG are fed and scored as
    `id` and are answers (recall_loss answers / two_means; see the module doc).
    """
    is_answer = batch >= ANSWER_FLAG
    ids = torch.where(batch < 0, -1 - batch, batch - is_answer.long() * ANSWER_FLAG)  # (B, T+1)
    targets = torch.where(batch[:, 1:] < 0, IGNORE_INDEX, ids[:, 1:])  # (B, T)
    if answers:
        return ids[:, :-1], targets, is_answer[:, 1:]
    return ids[:, :-1], targets
