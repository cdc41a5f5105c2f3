"""Randomized positional encodings (Ruoss et al. 2023): a wrapper for any scheme.

In training, the T positions of a sequence are a sorted random subset of [0, max_position) (drawn
afresh every forward, without replacement), so the model sees positions far past the training length;
at evaluation the ordinary positions 0..T-1 are used. ``pe=rope pe.randomized.max_position=1024``.

The draw happens in the ``remap_positions`` hook, once per forward; the wrapped scheme's hooks then see
the drawn positions. The wrapper adds no parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pelab.encodings.base import PositionEncoding


def random_sorted_positions(max_position: int, shape: tuple[int, ...], device=None) -> Tensor:
    """Sorted, distinct positions in [0, max_position): shape (..., T), each row its own draw."""
    *batch, T = shape
    if T > max_position:
        raise ValueError(
            f"pe.randomized.max_position={max_position} is shorter than the {T}-token input; "
            "it must be at least the training length (the paper uses many times it)"
        )
    scores = torch.rand(*batch, max_position, device=device)
    return scores.topk(T, dim=-1).indices.sort(dim=-1).values  # T distinct indices, sorted


class Randomized(PositionEncoding):
    def __init__(self, inner: PositionEncoding, max_position: int):
        super().__init__(inner.d_model, inner.n_heads)
        if int(max_position) < 1:
            raise ValueError(f"pe.randomized.max_position must be a positive integer; got {max_position}")
        self.inner = inner
        self.max_position = int(max_position)
        self.name = inner.name
        # the model reads these flags: mirror the wrapped scheme
        self.has_embed, self.has_rotate = inner.has_embed, inner.has_rotate
        self.has_bias, self.has_content_bias = inner.has_bias, inner.has_content_bias
        self.bias_shared_across_layers = inner.bias_shared_across_layers
        self.bias_translation_invariant = inner.bias_translation_invariant
        self.max_positions = inner.max_positions
        if self.max_positions is not None and self.max_position > self.max_positions:
            raise ValueError(
                f"pe.randomized.max_position={self.max_position} exceeds pe.max_positions={self.max_positions} "
                "of the wrapped table; raise pe.max_positions (or leave it null: it then follows max_position)"
            )

    def remap_positions(self, pos: Tensor) -> Tensor:
        if not self.training:
            return pos
        return random_sorted_positions(self.max_position, tuple(pos.shape), pos.device)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.inner.embed(x, pos)

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.rotate(q, k, pos)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.inner.score_bias(q_pos, k_pos)

    def content_bias(self, q: Tensor, k: Tensor, q0: int) -> Tensor:
        return self.inner.content_bias(q, k, q0)

    def check_positions(self, pos: Tensor | None = None, max_position: int | None = None) -> None:
        self.inner.check_positions(pos, max_position)

    def diagnostics(self, n_positions: int) -> dict:
        return self.inner.diagnostics(n_positions)

    def extra_repr(self) -> str:
        return f"max_position={self.max_position}"
