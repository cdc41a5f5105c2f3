"""Attention diagnostics by length (pelab.evaluation.attention_stats) and log-length logit scaling
(model.attn_logit_scale): hand-computed patterns, and the normal forward left untouched."""

from __future__ import annotations

import math

import pytest
import torch

from pelab.evaluation.attention_stats import attention_diagnostics, buckets, layer_curves, query_stats
from pelab.model import build_model, reference_attention
from pelab.model.attention.logits import log_length_scale, observed_attention

NEG = float("-inf")


def micro(pe: str, train_length: int = 16, logit_scale: str = "none"):
    torch.manual_seed(0)
    model_cfg = {"n_layers": 2, "n_heads": 2, "d_model": 32, "d_ff": None, "dropout": 0.0, "bias": False,
                 "attn_chunk_size": 16, "init": "gpt2", "tie_embeddings": True, "attn_logit_scale": logit_scale}
    return build_model(model_cfg, {"name": pe}, 50, train_length).eval()


def test_uniform_attention_over_n_keys_has_entropy_log_n():
    scores = torch.zeros(1, 1, 8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), NEG)  # causal
    st = query_stats(scores, 0, train_length=4)
    assert torch.allclose(st["entropy"][0, 0], torch.log(torch.arange(1.0, 9.0)), atol=1e-6)
    # uniform over keys 0..i: mean distance i/2; mass at distances >= 4: (i - 3) / (i + 1) for i >= 4
    i = torch.arange(8.0)
    assert torch.allclose(st["distance"][0, 0], i / 2, atol=1e-6)
    assert torch.allclose(st["mass_past_L"][0, 0], ((i - 3).clamp_min(0) / (i + 1)), atol=1e-6)


def test_distance_and_mass_past_the_training_length_at_hand_computed_patterns():
    # queries 5 and 6 (q0 = 5) over 7 keys
    scores = torch.full((2, 7), NEG)
    scores[0, [0, 4]] = 0.0  # query 5: half on distance 5, half on distance 1
    scores[1, 2] = 3.0  # query 6: all on key 2, distance 4, logit 3
    st = query_stats(scores, q0=5, train_length=4)
    assert st["distance"].tolist() == pytest.approx([3.0, 4.0])
    assert st["mass_past_L"].tolist() == pytest.approx([0.5, 1.0])  # distances >= 4 were never trained on
    assert st["entropy"].tolist() == pytest.approx([math.log(2), 0.0], abs=1e-6)
    assert st["max_logit"].tolist() == [0.0, 3.0]
    assert query_stats(scores, q0=5, train_length=5)["mass_past_L"].tolist() == pytest.approx([0.5, 0.0])


def test_buckets_double_past_the_training_length():
    assert buckets(128, 16) == [(0, 16), (16, 32), (32, 64), (64, 128)]
    assert buckets(16, 16) == [(0, 16)] and buckets(8, 16) == [(0, 8)]


@pytest.mark.parametrize("pe", ["rope", "alibi", "cope"])
def test_diagnostics_leave_the_forward_bit_identical_and_see_its_logits(pe):
    """rope: no bias (SDPA's causal kernel); alibi: a per-distance bias; cope: a per-layer content bias."""
    model = micro(pe)
    idx = torch.randint(0, 50, (2, 48))
    with torch.no_grad():
        before = model(idx)
        res = attention_diagnostics(model, idx.flatten(), [16, 48], train_length=16, windows=2)
        assert torch.equal(model(idx), before)  # observers removed: the normal kernels, bit for bit
        # the diagnostics path computes the same attention as the fused one (it softmaxes the same logits)
        for block in model.blocks:
            block.attn.observer = lambda scores, q0: None
        assert torch.allclose(model(idx), before, atol=1e-5)
    for block in model.blocks:
        block.attn.observer = None
    rows = res["rows"]
    assert {r["length"] for r in rows} == {16, 48} and len(rows) == 2 * 2 * (1 + 3)  # layers x heads x buckets (48: 0-16-32-48)
    assert all(0 <= r["mass_past_L"] <= 1 and r["entropy"] >= 0 for r in rows)
    assert all(r["mass_past_L"] == 0 for r in rows if r["q_hi"] <= 16)  # nothing is that far inside the window
    curves = layer_curves(rows, "entropy")
    assert set(curves) == {0, 1} and set(curves[0]) == {16, 48}


def test_log_length_scale_is_one_inside_the_window():
    s = log_length_scale(0, 40, train_length=16)[:, 0]
    assert torch.equal(s[:16], torch.ones(16))
    assert torch.allclose(s[16:], torch.log(torch.arange(17.0, 41.0)) / math.log(16))


@pytest.mark.parametrize("pe", ["rope", "alibi"])
def test_attn_logit_scale_leaves_in_window_logits_unchanged(pe):
    L = 16
    plain, scaled = micro(pe, L), micro(pe, L, "log_length")
    with torch.no_grad():  # logits of a trained model's size (at init they are ~0 and any scale is invisible)
        for block in plain.blocks:
            block.attn.qkv.weight.mul_(20)
    scaled.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 50, (1, 40))
    with torch.no_grad():
        assert torch.equal(scaled(idx[:, :L]), plain(idx[:, :L]))  # T <= L: the normal path, untouched
        # past L: the first L positions keep their logits, the later ones change
        out_p, out_s = plain(idx), scaled(idx)
        assert torch.allclose(out_s[:, :L], out_p[:, :L], atol=1e-5)
        assert not torch.allclose(out_s[:, L:], out_p[:, L:], atol=1e-3)
    # at the logits themselves: in-window rows exactly equal, later rows exactly times log(n)/log(L)
    q, k, v = torch.randn(3, 1, 2, 40, 8).unbind(0)
    seen = {}
    for name, scale_from in (("plain", None), ("scaled", L)):
        observed_attention(q, k, v, None, chunk_size=12, scale_from=scale_from,
                           observer=lambda s, q0, name=name: seen.setdefault(name, []).append((q0, s)))
    for (q0, sp), (_, ss) in zip(seen["plain"], seen["scaled"]):
        n = torch.arange(q0 + 1, q0 + sp.shape[-2] + 1)
        inside = n <= L
        assert torch.equal(ss[..., inside, :], sp[..., inside, :])
        factor = (torch.log(n[~inside].float()) / math.log(L))[:, None]
        assert torch.allclose(ss[..., ~inside, :], sp[..., ~inside, :] * factor)
    # the explicit path is plain causal attention: the reference, with and without a score bias
    bias = torch.randn(2, 40, 40)
    assert torch.allclose(observed_attention(q, k, v, None, chunk_size=12), reference_attention(q, k, v), atol=1e-5)
    assert torch.allclose(observed_attention(q, k, v, bias, chunk_size=12), reference_attention(q, k, v, bias),
                          atol=1e-5)
