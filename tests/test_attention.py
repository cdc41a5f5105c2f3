"""The attention dispatch (pelab.model.attention) and the record of the path each scheme took
(pelab.model.attention.record): every path gives the plain softmax reference's numbers (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from attention_inputs import qkv, random_bias
from pelab.encodings import build_encoding
from pelab.model.attention.dispatch import causal_attention, reference_attention


@pytest.mark.parametrize("T", [1, 5, 33, 64])
def test_sdpa_without_bias_matches_reference(T):
    q, k, v = qkv(T)
    torch.testing.assert_close(causal_attention(q, k, v), reference_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_dropout_only_in_the_requested_calls():
    T = 16
    q, k, v = qkv(T)
    bias = random_bias(T)
    base = causal_attention(q, k, v, bias, chunk_size=5)
    torch.manual_seed(0)
    dropped = causal_attention(q, k, v, bias, chunk_size=5, dropout_p=0.5)
    assert not torch.allclose(dropped, base)
    torch.manual_seed(0)
    assert not torch.allclose(causal_attention(q, k, v, dropout_p=0.5), causal_attention(q, k, v))


def test_default_forward_records_the_sdpa_paths():
    """A normal CPU forward records which path each scheme took: is_causal SDPA without a bias, SDPA with an
    additive mask for a fixed bias, the explicit softmax for a learned bias in training."""
    from pelab.model import GPT, GPTConfig, attention_paths, reset_attention_paths

    reset_attention_paths()
    for name in ("nope", "alibi", "t5_bias"):
        model = GPT(GPTConfig(vocab_size=50, n_layers=1, n_heads=2, d_model=16), build_encoding({"name": name}, 16, 2))
        model(torch.randint(0, 50, (1, 12))).sum().backward()
    paths = attention_paths()["paths"]
    assert {s: list(p) for s, p in paths.items()} == {
        "nope": ["sdpa_causal"], "alibi": ["sdpa_mask"], "t5_bias": ["explicit"]}
    assert paths["alibi"]["sdpa_mask"]["first_call"] == "cpu float32 B=1 H=2 T=12 Dh=8 bias=DistanceBias"
    assert "model.attn_backend=auto" in paths["alibi"]["sdpa_mask"]["reason"]


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias"])
def test_model_default_positions_use_the_per_distance_bias_with_identical_logits(scheme):
    """Default positions (start..start+T-1) take the per-distance path; explicit positions the full (H, T, T)
    bias; logits and gradients agree, with and without a start offset."""
    from pelab.encodings import build_encoding
    from pelab.model import GPT, GPTConfig
    from pelab.score_bias import CausalBias, DistanceBias

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, n_layers=2, n_heads=2, d_model=16, attn_chunk_size=6)
    model = GPT(config, build_encoding({"name": scheme}, 16, 2))
    idx = torch.randint(0, 50, (2, 15))
    for start in (0, 40):
        pos = torch.arange(start, start + 15)
        assert isinstance(model.pe.bias(pos, consecutive=True), DistanceBias)
        assert isinstance(model.pe.bias(pos, consecutive=False), CausalBias)
        fast = model(idx, start=start)
        slow = model(idx, pos=pos)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
        params = [p for p in model.parameters() if p.requires_grad]
        g_fast = torch.autograd.grad(fast.square().mean(), params)
        g_slow = torch.autograd.grad(slow.square().mean(), params)
        for a, b in zip(g_fast, g_slow):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
