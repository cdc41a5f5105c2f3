"""Small shared operations below both the encodings and the model (score-bias forms, causal masks)."""

from pelab.ops.bias import (
    BiasFn,
    CausalBias,
    DiagonalView,
    DistanceBias,
    antidiagonal_sums,
    causal_additive_mask,
    causal_bias,
    distance_bias,
    future_mask,
)

__all__ = ["BiasFn", "CausalBias", "DiagonalView", "DistanceBias", "antidiagonal_sums", "causal_additive_mask",
           "causal_bias", "distance_bias", "future_mask"]
