"""The position contract: one base class, optional hooks, and the typed config each encoding owns.

An encoding fills any of
  1. ``embed(x, state)``             add a vector to the token embeddings   (sinusoidal, learned)
  2. ``rotate(q, k, state)``         rotate queries and keys                (RoPE, xPos)
  3. ``score_bias(q_pos, k_pos)``    a per-head bias on attention logits    (ALiBi, T5, KERPLE, FIRE, Sandwich)
  4. ``content_bias(q, k, q0, state)`` a bias computed from a layer's q and k (CoPE: positions are counts of
                                     gated keys, so they depend on content)
  5. ``layer_input_bias()``          a module per attention layer that reads that layer's input x (FoX: a
                                     forget gate from x decays the logits); the model builds one per layer
                                     (its parameters are the layer's) and calls ``module(x, state) -> BiasFn``
and sets the matching ``has_*`` flag. The model calls ``prepare(pos)`` once per forward; it returns a
``PositionState`` -- the positions after any remapping (randomized positions in training), the rotary
tables and the score bias -- which the model hands to every layer, as Hugging Face models pass
``position_embeddings``. Nothing is cached between forwards. The model never asks which encoding it holds,
so a new scheme is one module (class + config dataclass) + one YAML file with its ``_target_``.

Each encoding's settings are a dataclass (``PEConfig`` subclass, the class attribute ``Config``): the
schema of ``conf/pe/<name>.yaml`` (types and defaults), ``resolve(train_length)`` (fills the settings
that mean "the training length") and ``validate(d_model, n_heads)`` (range checks with
``pelab.errors.need``, one-line errors naming ``pe.<key>``), and capabilities the harness asks instead of
names (``supports_scaling``, ``runtime_keys``).

Positions are a LongTensor ``pos`` of shape ``(T,)`` (shared by the batch) or ``(B, T)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from pelab.encodings.settings import PEConfig
from pelab.errors import PositionOutOfRange
from pelab.score_bias import BiasFn, CausalBias, causal_bias, distance_bias

# A (H, T, T) bias (times B for per-batch positions) is materialised once per forward up to this many
# elements (256 MB in fp32); longer inputs compute it per query chunk inside attention instead.
MAX_BIAS_ELEMENTS = 64 * 2**20


@dataclass
class PositionState:
    """What ``prepare`` computes once per forward for every layer."""

    pos: Tensor  # (T,) or (B, T) positions after remapping
    tables: Any = None  # what rotate() reads (RoPE: (cos, sin) for q and for k)
    bias: BiasFn | None = None  # score bias + causal mask, shared by all layers


def random_sorted_positions(randomized_range: int, shape: tuple[int, ...], device=None) -> Tensor:
    """Sorted, distinct positions in [0, randomized_range): shape (..., T), each row its own draw."""
    *batch, T = shape
    if T > randomized_range:
        raise ValueError(
            f"pe.randomized.max_position={randomized_range} is shorter than the {T}-token input; "
            "it must be at least the training length (the paper uses many times it)"
        )
    scores = torch.rand(*batch, randomized_range, device=device)
    return scores.topk(T, dim=-1).indices.sort(dim=-1).values  # T distinct indices, sorted


class PositionEncoding(nn.Module):
    """Base class: every hook is a no-op; subclasses override the ones they need."""

    Config: ClassVar[type[PEConfig]] = PEConfig
    has_embed: ClassVar[bool] = False
    has_rotate: ClassVar[bool] = False
    has_bias: ClassVar[bool] = False
    has_content_bias: ClassVar[bool] = False
    has_layer_input_bias: ClassVar[bool] = False
    # True: score_bias depends on q_pos - k_pos only (ALiBi, T5), so for consecutive positions the bias is
    # one value per distance, (H, 2T-1), instead of one per (query, key) pair, (H, T, T).
    bias_translation_invariant: ClassVar[bool] = False

    @property
    def rotates_head_subset(self) -> bool:
        """Can ``rotate`` act on some heads alone (a layout's ``+rotate_heads:<n>``, the last n heads)? Not when the
        rotation or a score it adds spans every head."""
        return self.has_rotate

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        name: str,
        train_length: int | None = None,
        randomized: dict | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.train_length = train_length
        # randomized positions in training are drawn from [0, randomized_range) (pe.randomized.max_position)
        self.randomized_range: int | None = (randomized or {}).get("max_position")
        # positions 0..n_positions-1 can be represented, larger ones cannot; None = unbounded
        self.n_positions: int | None = None
        self.max_bias_elements = MAX_BIAS_ELEMENTS

    # ---- once per forward -----------------------------------------------------------------------
    def prepare(self, pos: Tensor, consecutive: bool = False, largest: int | None = None) -> PositionState:
        """Positions -> the state every layer reads. ``consecutive``: pos is start..start+T-1 (enables the
        per-distance bias); ``largest``: the largest position (inclusive) when known without a device sync."""
        if self.randomized_range is not None and self.training:
            pos = random_sorted_positions(self.randomized_range, tuple(pos.shape), pos.device)
            consecutive, largest = False, None
        self.check_positions(pos, largest)
        return PositionState(
            pos=pos,
            tables=self.rotary_tables(pos) if self.has_rotate else None,
            bias=self.bias(pos, consecutive) if self.has_bias else None,
        )

    def rotary_tables(self, pos: Tensor) -> Any:
        """What ``rotate`` needs for these positions, computed once per forward (has_rotate)."""
        raise NotImplementedError(f"pe={self.name} has no rotation (has_rotate=False)")

    def bias(self, pos: Tensor, consecutive: bool) -> BiasFn:
        """The score bias of this forward for every layer: for a translation-invariant bias of consecutive
        positions, one value per distance (O(H*T)), viewed per query chunk on CPU and materialised as the full
        (H, T, T) mask on CUDA (what its kernels read); else the full (H, T, T) bias + causal mask when it is
        small enough; else a per-query-chunk callable (bounded memory). A learned per-distance table gets its
        gradient as one sum per distance (``DiagonalView``), not a scatter over every (query, key) pair."""
        T = pos.shape[-1]
        per_distance = consecutive and self.bias_translation_invariant
        if per_distance and not pos.is_cuda and self.n_heads * (2 * T - 1) <= self.max_bias_elements:
            return distance_bias(self, T, pos.device)
        if self.n_heads * T * T * (pos.shape[0] if pos.dim() == 2 else 1) <= self.max_bias_elements:
            if per_distance:
                return CausalBias(distance_bias(self, T, pos.device).full())
            return causal_bias(self.score_bias(pos, pos))
        return self._chunk_bias_fn(pos)

    def _chunk_bias_fn(self, pos: Tensor) -> Callable[[int, int], Tensor]:
        def bias_fn(q0: int, q1: int) -> Tensor:  # queries q0..q1-1 against keys 0..q1-1
            return self.score_bias(pos[..., q0:q1], pos[..., :q1])

        return bias_fn

    # ---- hooks (no-ops by default) -------------------------------------------------------------
    def embed(self, x: Tensor, state: PositionState) -> Tensor:
        """(B, T, D) token vectors -> (B, T, D)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, Dh) -> rotated q, k (same shapes and dtypes)."""
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Tq,), (Tk,) -> (H, Tq, Tk) float bias (or (B, H, Tq, Tk) for (B, T) positions).

        Causal masking is not part of the bias: the attention code adds it.
        """
        raise NotImplementedError(f"pe={self.name} has no score bias (has_bias=False)")

    def content_bias(self, q: Tensor, k: Tensor, q0: int, state: PositionState) -> Tensor:
        """q (B, H, C, Dh) of queries q0..q0+C-1, k (B, H, K, Dh) of keys 0..K-1 -> (B, H, C, K) bias.

        Called per layer and per query chunk; entries of future keys are ignored (masked by attention).
        """
        raise NotImplementedError(f"pe={self.name} has no content bias (has_content_bias=False)")

    def layer_input_bias(self) -> nn.Module:
        """A new module for one attention layer (has_layer_input_bias), called per forward as
        ``module(x, state) -> BiasFn``: x (B, T, D) is that layer's input (after its norm; all T rows, also when
        only the last rows are queried), the result a score bias in any form of ``pelab.score_bias`` (a per-chunk
        callable ``(q0, q1) -> (B, H, q1 - q0, q1)`` keeps memory O(H * chunk * T)). The model builds it after its
        own weights, so that encodings without the hook keep their parameters, RNG draws and numbers."""
        raise NotImplementedError(f"pe={self.name} has no layer-input bias (has_layer_input_bias=False)")

    # ---- declarations -------------------------------------------------------------------------
    def num_learnable_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def check_positions(self, pos: Tensor | None = None, largest: int | None = None) -> None:
        """Raise PositionOutOfRange if a position cannot be represented (one >= ``n_positions``).

        ``largest`` (the largest position, inclusive, as a python int) lets callers that know it -- e.g. the
        model with its default ``arange(start, start + T)`` -- skip the device->host sync of ``pos.max()``.
        Unbounded encodings return immediately.
        """
        if self.n_positions is None:
            return
        if largest is None:
            if pos is None or pos.numel() == 0:
                return
            largest = int(pos.max().item())  # host sync: only for bounded encodings with explicit pos
        if largest >= self.n_positions:
            raise PositionOutOfRange(
                f"{self.name} positions end at {self.n_positions - 1} "
                f"(pe.max_position={self.n_positions}); got position {largest}. "
                f"Evaluate within the table or train with a larger pe.max_position"
            )

    def diagnostics(self, n_positions: int) -> dict:
        """Optional extras for logging; absolute schemes return {"table": (P, D) tensor}."""
        return {}

    def extra_repr(self) -> str:
        extra = f", randomized_range={self.randomized_range}" if self.randomized_range else ""
        return f"d_model={self.d_model}, n_heads={self.n_heads}, n_positions={self.n_positions}{extra}"


def positions_as_float(pos: Tensor) -> Tensor:
    """Positions as fp32 (exact up to 2**24), the dtype all position math is done in."""
    return pos.to(torch.float32)
