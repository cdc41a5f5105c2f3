"""FlexAttention (pelab.model.attention.flex, model.attn_backend=flex): the plain softmax reference's numbers where it
runs; a visible, recorded fallback to the SDPA path where it fails or disagrees."""

from __future__ import annotations

import warnings

import pytest
import torch

from attention_inputs import DH, H, qkv, random_bias
from pelab.encodings import build_encoding
from pelab.model.attention.dispatch import causal_attention, reference_attention
from pelab.model.attention.flex import flex_matches_sdpa


@pytest.mark.slow
def test_flex_attention_matches_reference_on_cpu():
    """model.attn_backend=flex (FlexAttention + score_mod) on CPU under torch.compile: the per-pair table
    (shared and per-batch) and the per-distance table; the path taken is recorded as "flex" (~20 s: three
    compiles). Forward only: FlexAttention has no backward on CPU (torch 2.13: NotImplementedError); its
    gradients are compared with the reference by experiments/benchmarks/gpu_check.sh on CUDA."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    import torch._inductor.config as inductor_config

    from pelab.model import attention_paths, reset_attention_paths
    from pelab.score_bias import distance_bias

    # T a multiple of flex's 128 block: on CPU (torch 2.13) a partial last block reads past the end of
    # k/v (NaN when that memory holds NaN bits); inductor's on-disk cache has also returned wrong CPU
    # flex kernels, so compile fresh here. The CUDA kernels mask partial blocks.
    T = 128
    reset_attention_paths()
    q, k, v = qkv(T)
    pe = build_encoding({"name": "alibi"}, H * DH, H)
    pos = torch.arange(T)
    cases = {"pairs": random_bias(T), "pairs_per_batch": random_bias(T, batched=True),
             "alibi": distance_bias(pe, T, pos.device)}  # per distance: read inside the score_mod
    with inductor_config.patch(force_disable_caches=True), torch.no_grad():
        for label, bias in cases.items():
            out = causal_attention(q, k, v, bias, backend="flex", scheme=label)
            ref = reference_attention(q, k, v, pe.score_bias(pos, pos) if label == "alibi" else bias)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            assert flex_matches_sdpa(out, q, k, v, bias)  # the one-time self-check accepts a correct kernel
    paths = attention_paths()["paths"]
    assert {s: list(p) for s, p in paths.items()} == {label: ["flex"] for label in cases}


def test_flex_failure_falls_back_with_a_warning_and_is_recorded():
    """A real FlexAttention failure, asked for by model.attn_backend=flex in a CPU training forward (flex has
    no backward on CPU, torch 2.13): a visible warning, the SDPA path's numbers and gradients, and the
    fallback with its reason in attention_paths (what summary.json records)."""
    from pelab.model import GPT, GPTConfig, attention_paths, reset_attention_paths
    from pelab.model.attention import flex

    reset_attention_paths()
    saved = dict(flex.flex_state)
    try:
        flex.flex_state.update(error=None, compiled=None, block_masks={})
        torch.manual_seed(0)
        pe = build_encoding({"name": "alibi"}, 16, 2)
        model = GPT(GPTConfig(vocab_size=50, n_layers=2, n_heads=2, d_model=16, attn_backend="flex"), pe)
        idx = torch.randint(0, 50, (2, 16))
        with pytest.warns(UserWarning, match="FlexAttention failed"):
            logits = model(idx)
        record = attention_paths()
        assert record["flex_error"]
        assert list(record["paths"]["alibi"]) == ["sdpa_mask"]
        reason = record["paths"]["alibi"]["sdpa_mask"]["reason"]
        assert "flex failed" in reason and record["flex_error"] in reason, reason
        # later calls skip flex without another warning; the numbers are the SDPA path's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = model(idx)
        for block in model.blocks:
            block.attn.backend = "sdpa"
        torch.testing.assert_close(logits, model(idx), atol=0, rtol=0)
        torch.testing.assert_close(again, logits, atol=0, rtol=0)
    finally:
        flex.flex_state.clear()
        flex.flex_state.update(saved)


def test_flex_self_check_rejects_a_wrong_kernel(monkeypatch):
    """The auto path compares each new flex kernel once against SDPA and falls back if they disagree."""
    from pelab.model.attention import flex

    monkeypatch.setitem(flex.flex_state, "error", None)
    monkeypatch.setitem(flex.flex_state, "verified", set())
    T = 12
    q, k, v = qkv(T)
    bias = random_bias(T)
    good = reference_attention(q, k, v, bias)
    assert flex_matches_sdpa(good, q, k, v, bias) and flex.flex_state["error"] is None
    monkeypatch.setitem(flex.flex_state, "verified", set())
    with pytest.warns(UserWarning, match="disagrees"):
        assert not flex_matches_sdpa(good + 0.01, q, k, v, bias)
    assert flex.flex_state["error"]  # flex is now refused for this process (with this reason)


@pytest.mark.slow
def test_flex_attention_of_a_local_span_matches_reference_on_cpu():
    """model.attn_backend=flex for a local layer of model.layout (a sliding window, with a score bias): the span's
    block mask and the bias's score_mod under torch.compile on CPU, recorded as "flex" (~15 s: one compile)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    import torch._inductor.config as inductor_config

    from pelab.model import attention_paths, reset_attention_paths
    from pelab.model.attention.span import Span

    T, W = 128, 16
    reset_attention_paths()
    q, k, v = qkv(T)
    bias = random_bias(T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    outside = (j > i) | (i - j >= W)  # the window, written out
    with inductor_config.patch(force_disable_caches=True), torch.no_grad():
        out = causal_attention(q, k, v, bias, backend="flex", scheme="window", span=Span("window", W))
    ref = reference_attention(q, k, v, bias.masked_fill(outside, float("-inf")))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert list(attention_paths()["paths"]["window"]) == ["flex"]
    reset_attention_paths()
