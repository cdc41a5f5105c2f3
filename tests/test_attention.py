"""All attention paths give the plain softmax reference's numbers (fp32, 1e-5)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.profiler import profile

from pelab.encodings import build_encoding
from pelab.model.attention import (
    _flex_matches_sdpa,
    causal_attention,
    chunked_biased_attention,
    reference_attention,
)
from pelab.ops import causal_bias

B, H, DH = 2, 3, 8


def qkv(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, DH, generator=g) for _ in range(3))


def random_bias(T: int, batched: bool = False, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*((B,) if batched else ()), H, T, T, generator=g) * 2


@pytest.mark.parametrize("T", [1, 5, 33, 64])
def test_sdpa_without_bias_matches_reference(T):
    q, k, v = qkv(T)
    torch.testing.assert_close(causal_attention(q, k, v), reference_attention(q, k, v), atol=1e-5, rtol=1e-5)


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


def test_bad_bias_shape_and_chunk_size_are_clear_errors():
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match="expected"):
        causal_attention(q, k, v, lambda q0, q1: torch.zeros(H, q1 - q0, q1 + 1))
    with pytest.raises(ValueError, match="attn_chunk_size"):
        chunked_biased_attention(q, k, v, random_bias(8), chunk_size=0)


@pytest.mark.slow
def test_flex_attention_matches_reference_on_cpu():
    """model.attn_backend=flex (FlexAttention + score_mod) on CPU under torch.compile: the per-pair table
    (shared and per-batch) and the per-distance table; the path taken is recorded as "flex" (~20 s: three
    compiles). Forward only: FlexAttention has no backward on CPU (torch 2.13: NotImplementedError); its
    gradients are compared with the reference by experiments/benchmarks/gpu_check.sh on CUDA."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    import torch._inductor.config as inductor_config

    from pelab.model.attention import attention_paths, reset_attention_paths
    from pelab.ops import distance_bias

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
            assert _flex_matches_sdpa(out, q, k, v, bias)  # the one-time self-check accepts a correct kernel
    paths = attention_paths()["paths"]
    assert {s: list(p) for s, p in paths.items()} == {label: ["flex"] for label in cases}


def test_flex_failure_falls_back_with_a_warning_and_is_recorded():
    """A real FlexAttention failure, asked for by model.attn_backend=flex in a CPU training forward (flex has
    no backward on CPU, torch 2.13): a visible warning, the SDPA path's numbers and gradients, and the
    fallback with its reason in attention_paths (what summary.json records)."""
    from pelab.model import attention
    from pelab.model.gpt import GPT, GPTConfig

    attention.reset_attention_paths()
    saved = dict(attention._flex_state)
    try:
        attention._flex_state.update(error=None, compiled=None, block_masks={})
        torch.manual_seed(0)
        pe = build_encoding({"name": "alibi"}, 16, 2)
        model = GPT(GPTConfig(vocab_size=50, n_layers=2, n_heads=2, d_model=16, attn_backend="flex"), pe)
        idx = torch.randint(0, 50, (2, 16))
        with pytest.warns(UserWarning, match="FlexAttention failed"):
            logits = model(idx)
        record = attention.attention_paths()
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
        attention._flex_state.clear()
        attention._flex_state.update(saved)


def test_default_forward_records_the_sdpa_paths():
    """A normal CPU forward records which path each scheme took: is_causal SDPA without a bias, SDPA with an
    additive mask for a fixed bias, the explicit softmax for a learned bias in training."""
    from pelab.model import attention
    from pelab.model.gpt import GPT, GPTConfig

    attention.reset_attention_paths()
    for name in ("nope", "alibi", "t5_bias"):
        model = GPT(GPTConfig(vocab_size=50, n_layers=1, n_heads=2, d_model=16), build_encoding({"name": name}, 16, 2))
        model(torch.randint(0, 50, (1, 12))).sum().backward()
    paths = attention.attention_paths()["paths"]
    assert {s: list(p) for s, p in paths.items()} == {
        "nope": ["sdpa_causal"], "alibi": ["sdpa_mask"], "t5_bias": ["explicit"]}
    assert paths["alibi"]["sdpa_mask"]["first_call"] == "cpu float32 B=1 H=2 T=12 Dh=8 bias=DistanceBias"
    assert "model.attn_backend=auto" in paths["alibi"]["sdpa_mask"]["reason"]


def test_flex_self_check_rejects_a_wrong_kernel(monkeypatch):
    """The auto path compares each new flex kernel once against SDPA and falls back if they disagree."""
    from pelab.model import attention

    monkeypatch.setitem(attention._flex_state, "error", None)
    monkeypatch.setitem(attention._flex_state, "verified", set())
    T = 12
    q, k, v = qkv(T)
    bias = random_bias(T)
    good = reference_attention(q, k, v, bias)
    assert _flex_matches_sdpa(good, q, k, v, bias) and attention._flex_state["error"] is None
    monkeypatch.setitem(attention._flex_state, "verified", set())
    with pytest.warns(UserWarning, match="disagrees"):
        assert not _flex_matches_sdpa(good + 0.01, q, k, v, bias)
    assert attention._flex_state["error"]  # flex is now refused for this process (with this reason)


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





def test_rope_rotation_passes_gradcheck_in_float64():
    from pelab.encodings.rotary import apply_rotary

    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    f = torch.rand(5, 3, dtype=torch.float64) * 6
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()  # 6 of 8 channels rotated
    # fp32 math inside (as in training), so compare against finite differences at fp32 precision
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin).double(), (x,), eps=1e-3, atol=1e-3)


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias", "kerple"])
@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_per_distance_bias_matches_the_full_bias_and_reference(scheme, chunk):
    """The (H, 2T-1) per-distance table, viewed per query chunk (CPU) or materialised whole (CUDA's form),
    gives the reference attention's output and gradients (q, k, v and the learned T5 table / KERPLE r1, r2)
    for every chunking; its forward is the full bias exactly."""
    from pelab.encodings import build_encoding
    from pelab.ops import CausalBias, DistanceBias, distance_bias

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
    from pelab.ops import DiagonalView

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


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias"])
def test_model_default_positions_use_the_per_distance_bias_with_identical_logits(scheme):
    """Default positions (start..start+T-1) take the per-distance path; explicit positions the full (H, T, T)
    bias; logits and gradients agree, with and without a start offset."""
    from pelab.encodings import build_encoding
    from pelab.model.gpt import GPT, GPTConfig
    from pelab.ops import CausalBias, DistanceBias

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
