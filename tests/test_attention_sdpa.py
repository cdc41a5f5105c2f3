"""The SDPA path of a score bias (pelab.model.attention.sdpa): chunked additive-mask SDPA and the explicit softmax give
the plain softmax reference's numbers and gradients (fp32, 1e-5), on the kernels they are meant to take."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

from attention_inputs import DH, H, qkv, random_bias
from pelab.encodings import build_encoding
from pelab.model.attention.dispatch import causal_attention, reference_attention
from pelab.model.attention.sdpa import chunked_biased_attention
from pelab.score_bias import causal_bias


@pytest.mark.parametrize("T", [17, 50, 64])
@pytest.mark.parametrize("chunk", [1, 7, 16, 1024])
@pytest.mark.parametrize("batched", [False, True])
def test_chunked_bias_matches_reference(T, chunk, batched):
    q, k, v = qkv(T)
    bias = random_bias(T, batched)
    ref = reference_attention(q, k, v, bias)
    out = causal_attention(q, k, v, bias, chunk_size=chunk)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # the model's form: causal mask added once, then only sliced per layer and chunk
    premasked = causal_attention(q, k, v, causal_bias(bias), chunk_size=chunk)
    torch.testing.assert_close(premasked, ref, atol=1e-5, rtol=1e-5)
    # the callable form (bias computed per query chunk) gives the same numbers
    calls = []

    def bias_fn(q0, q1):
        calls.append((q0, q1))
        return bias[..., q0:q1, :q1]

    torch.testing.assert_close(
        causal_attention(q, k, v, bias_fn, chunk_size=chunk), ref, atol=1e-5, rtol=1e-5
    )
    # bounded memory: each call covers at most `chunk` queries and only keys up to its last query
    assert calls[0][0] == 0 and calls[-1][1] == T
    assert all(q1 - q0 <= chunk for q0, q1 in calls)
    assert len(calls) == -(-T // chunk)


def test_entries_above_the_diagonal_are_ignored():
    T = 20
    q, k, v = qkv(T)
    bias = random_bias(T)
    noisy = bias + torch.ones(T, T).triu(1) * 1e4  # garbage in the future half must not matter
    torch.testing.assert_close(
        causal_attention(q, k, v, noisy, chunk_size=6),
        causal_attention(q, k, v, bias, chunk_size=6),
        atol=1e-6,
        rtol=1e-6,
    )


@pytest.mark.parametrize("name", ["alibi", "t5_bias", "kerple", "sandwich", "fire"])
def test_encoding_bias_and_gradients_match_reference(name):
    """Real encoding biases, including gradients into learned ones (T5 table, KERPLE r, FIRE MLP),
    through the chunked path."""
    T = 45
    pe = build_encoding({"name": name, **({"init_L": 16.0} if name == "fire" else {})}, H * DH, H)
    pos = torch.arange(T)
    q, k, v = (t.requires_grad_() for t in qkv(T))

    def run(fn):
        out = fn()
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, DH)).sum(), [q, k, v, *pe.parameters()])
        return out, grads

    out, grads = run(lambda: causal_attention(q, k, v, pe.score_bias(pos, pos), chunk_size=8))
    ref, ref_grads = run(lambda: reference_attention(q, k, v, pe.score_bias(pos, pos)))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_bad_bias_shape_and_chunk_size_are_clear_errors():
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match="expected"):
        causal_attention(q, k, v, lambda q0, q1: torch.zeros(H, q1 - q0, q1 + 1))
    with pytest.raises(ValueError, match="attn_chunk_size"):
        chunked_biased_attention(q, k, v, random_bias(8), chunk_size=0)


# ---- the CPU fast paths (benchmarked in experiments/benchmarks) are exact ---------------------------------
def _kernels(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_shared_bias_takes_the_fused_cpu_kernel_and_matches_reference():
    """A (H, T, T) bias is passed to SDPA as a 4-D view: the fused (flash) CPU kernel, not the math path,
    with the reference attention's numbers and gradients."""
    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 40, 8
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    bias = torch.randn(H, T, T)
    out = causal_attention(q, k, v, causal_bias(bias), chunk_size=16)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = reference_attention(q, k, v, bias)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    used = _kernels(lambda: causal_attention(q, k, v, causal_bias(bias)).sum().backward())
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in used
    assert "aten::_scaled_dot_product_attention_math" not in used


@pytest.mark.parametrize("chunk", [10, 64])
def test_learned_bias_takes_the_explicit_path_with_reference_gradients(chunk):
    """A bias that requires grad (T5's table) goes through explicit_attention, in query chunks, with the
    reference attention's output and gradients (bias and q, k, v)."""
    torch.manual_seed(1)
    B, H, T, Dh = 2, 2, 24, 8
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    bias = torch.randn(H, T, T, requires_grad=True)
    out = causal_attention(q, k, v, causal_bias(bias), chunk_size=chunk)
    ref = reference_attention(q, k, v, bias)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (bias, q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (bias, q, k, v))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    g = grads[0]
    used = _kernels(lambda: causal_attention(q, k, v, causal_bias(bias), chunk_size=chunk).sum().backward())
    assert "aten::_scaled_dot_product_attention_math" not in used
    assert g.triu(1).abs().max() == 0  # future keys get no gradient
    assert g.tril().abs().sum() > 0
