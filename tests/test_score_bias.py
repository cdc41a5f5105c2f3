"""The score-bias forms of pelab.score_bias: the per-distance bias and its strided view give the
full bias's numbers and the reference attention's gradients."""

from __future__ import annotations

import pytest
import torch

from pelab.model.attention.dispatch import causal_attention, reference_attention
from pelab.score_bias import causal_bias


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias", "kerple"])
@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_per_distance_bias_matches_the_full_bias_and_reference(scheme, chunk):
    """The (H, 2T-1) per-distance table, viewed per query chunk (CPU) or materialised whole (CUDA's form),
    gives the reference attention's output and gradients (q, k, v and the learned T5 table / KERPLE r1, r2)
    for every chunking; its forward is the full bias exactly."""
    from pelab.encodings import build_encoding
    from pelab.score_bias import CausalBias, DistanceBias, distance_bias

    torch.manual_seed(0)
    B, H, T, Dh = 2, 4, 19, 8
    pe = build_encoding({"name": scheme}, d_model=H * Dh, n_heads=H)
    with torch.no_grad():
        for p in pe.parameters():  # T5's N(0, d^-0.5) init is small: make the bias matter
            p.mul_(10 if scheme == "t5_bias" else 1.5)
    pos = torch.arange(T)
    table = distance_bias(pe, T, pos.device)
    assert isinstance(table, DistanceBias) and table.table.shape == (H, 2 * T - 1)
    full = causal_bias(pe.score_bias(pos, pos)).mask  # (H, T, T) with -inf above the diagonal
    torch.testing.assert_close(table.chunk(5, 12)[0].flip(-2), full[:, 5:12, :12], atol=0, rtol=0)
    torch.testing.assert_close(table.full(), full, atol=0, rtol=0)

    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    params = [q, k, v, *pe.parameters()]
    assert len(params) > 3 or scheme == "alibi"
    ref = reference_attention(q, k, v, pe.score_bias(pos, pos))
    w = torch.randn_like(ref)
    want = torch.autograd.grad((ref * w).sum(), params)
    for form in (distance_bias(pe, T, pos.device), CausalBias(distance_bias(pe, T, pos.device).full())):
        out = causal_attention(q, k, v, form, chunk_size=chunk)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for got, expected in zip(torch.autograd.grad((out * w).sum(), params), want):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["heads", "batch-heads"])
def test_diagonal_view_gradient_is_the_per_distance_sum(lead):
    """DiagonalView's backward (anti-diagonal sums by pad-and-reshape) equals autograd through a plain
    gather of the same entries, in fp64, with leading (H,) or per-batch (B, H) dimensions; gradcheck too."""
    from pelab.score_bias import DiagonalView

    torch.manual_seed(0)
    N, R, K, offset = 13, 5, 7, 1
    table = torch.randn(*lead, N, dtype=torch.float64, requires_grad=True)
    index = offset + torch.arange(R)[:, None] + torch.arange(K)[None, :]  # (R, K)
    view, gathered = DiagonalView.apply(table, R, K, offset), table[..., index]
    assert torch.equal(view, gathered)
    w = torch.randn_like(gathered)
    got, = torch.autograd.grad((view * w).sum(), table)
    want, = torch.autograd.grad((gathered * w).sum(), table)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert got[..., offset + R + K - 1:].abs().max() == 0 and got[..., :offset].abs().max() == 0
    assert torch.autograd.gradcheck(lambda t: DiagonalView.apply(t, R, K, offset), (table,))
