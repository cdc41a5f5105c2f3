"""PELab's formulas against independent implementations, not against re-typed copies of themselves.

RoPE scalings: Hugging Face transformers' ``ROPE_INIT_FUNCTIONS`` (what Llama, Qwen, ... run). T5 buckets:
transformers' ``T5Attention._relative_position_bucket``. ALiBi slopes: x-transformers' ``AlibiPositionalBias``.
NoPE/RoPE head mixing (``+rotate_heads:<n>``): x-transformers' ``Attention(rotate_num_heads=n)``. FoX's forget-gate
bias: x-transformers' ``DataDependentAlibi``; a FoX layer: the naive path of the FoX repository's kernel test.
Stick-breaking attention: the reference repository's naive formula (``sb_ref.py``) and a loop over the paper's
definition. FoPE: the formula of the reference's ``FourierEmbedding`` (TsinghuaC3I/Fourier-Position-Embedding). Layouts
(model.layout): a RoPE-chunked layer (with and without q/k norm) and a NoPE layer with temperature tuning against
transformers' ``Llama4TextAttention``, as installed, its masks from transformers' ``masking_utils`` (here, beside
the Llama imports: the Llama 4 modules add ~0.03 s to them, ~3 s in a file of their own).
Both libraries are dev dependencies, so a missing one is an error here, never a skip.

Where the definitions agree the comparison is exact up to float32 (HF computes in fp32, PELab in fp64):
  none, linear, yarn        same definitions (yarn: HF's default ``truncate=True``, i.e. floor/ceil of the
                            correction range, as in the paper's code)
  dynamic_ntk               same formula with HF's ``max_position_embeddings`` as PELab's training length L
                            (HF also leaves the base unchanged for seq_len <= L)
  ntk (static NTK-aware)    HF has no static variant; base * s^(d/(d-2)) is HF's dynamic formula with factor 1
                            at seq_len = s * L (its base change is then (seq_len / L)^(d/(d-2)))
Not compared, because the definitions differ: HF's ``partial_rotary_factor`` recomputes the spectrum over
the rotated channels, while PELab's ``frequency_fraction`` (p-RoPE) keeps the highest frequencies of the
full spectrum; HF's ``llama3`` / ``longrope`` have no PELab counterpart.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.masking_utils import and_masks, causal_mask_function, chunked_overlay
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5Attention
from x_transformers.x_transformers import AlibiPositionalBias, Attention, DataDependentAlibi, RotaryEmbedding

from pelab.encodings import build_encoding
from pelab.encodings.bias import alibi_slopes, t5_causal_bucket
from pelab.encodings.rotary import rope_attention_factor, rope_inv_freq
from pelab.model import GPT, GPTConfig
from pelab.model.attention.stickbreaking import stickbreaking_attention

# HF builds the frequencies in float32: base ** (2i/d) has a relative error up to ~ln(base) * 6e-8.
FP32 = {"rtol": 2e-6, "atol": 0.0}

# (rotary dims d, base, training length L): the micro/tiny head sizes, a Llama-3-like base, a long L, and a
# small base whose YaRN slow-end correction dim lies past the last pair (the clamp to d - 1 matters there)
GEOMETRIES = [
    (16, 10000.0, 64),
    (32, 10000.0, 512),
    (64, 10000.0, 256),
    (128, 500000.0, 2048),
    (32, 500.0, 4096),
]
FACTORS = [1.0, 2.0, 2.5, 4.0, 8.0]


def hf_rope(
    rope_type: str, dim: int, base: float, *, max_position: int, seq_len: int | None = None, **params
) -> tuple[torch.Tensor, float]:
    """HF's inverse frequencies and attention factor for a one-head-dim Llama config."""
    config = LlamaConfig(
        hidden_size=2 * dim,
        num_attention_heads=2,
        head_dim=dim,
        max_position_embeddings=max_position,
        rope_parameters={"rope_type": rope_type, "rope_theta": base, **params},
    )
    if rope_type == "default":
        inv_freq, attention = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)
    return inv_freq.double(), float(attention)


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, **FP32)


# ---- RoPE -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dim", "base", "L"), GEOMETRIES)
def test_rope_none_and_linear_match_hf(dim, base, L):
    theirs, attention = hf_rope("default", dim, base, max_position=L)
    assert_same(rope_inv_freq(dim, base, "none"), theirs)
    assert rope_attention_factor("none") == attention == 1.0
    for s in FACTORS:
        theirs, attention = hf_rope("linear", dim, base, max_position=L, factor=s)
        assert_same(rope_inv_freq(dim, base, "linear", s), theirs)
        assert rope_attention_factor("linear", s) == attention == 1.0


@pytest.mark.parametrize(("dim", "base", "L"), GEOMETRIES)
def test_rope_dynamic_ntk_matches_hf_dynamic(dim, base, L):
    # below, at and beyond the training length (the base changes only beyond it)
    lengths = [1, L // 2, L, L + 1, 2 * L, 3 * L + 7, 16 * L]
    for s in FACTORS:
        for seq_len in lengths:
            theirs, attention = hf_rope("dynamic", dim, base, max_position=L, seq_len=seq_len, factor=s)
            assert_same(rope_inv_freq(dim, base, "dynamic_ntk", s, L, seq_len=seq_len), theirs)
            assert rope_attention_factor("dynamic_ntk", s) == attention == 1.0
    # a long length really changes the frequencies (the comparison above is not between two plain RoPEs)
    assert not torch.allclose(
        rope_inv_freq(dim, base, "dynamic_ntk", 4.0, L, seq_len=16 * L), rope_inv_freq(dim, base)
    )


@pytest.mark.parametrize(("dim", "base", "L"), GEOMETRIES)
def test_rope_static_ntk_is_hf_dynamic_at_factor_one_and_length_s_times_L(dim, base, L):
    for s in FACTORS:
        seq_len = round(s * L)
        assert seq_len == s * L  # the identity needs an integer length
        theirs, attention = hf_rope("dynamic", dim, base, max_position=L, seq_len=seq_len, factor=1.0)
        assert_same(rope_inv_freq(dim, base, "ntk", s), theirs)
        assert rope_attention_factor("ntk", s) == attention == 1.0


@pytest.mark.parametrize(("dim", "base", "L"), GEOMETRIES)
@pytest.mark.parametrize(("beta_fast", "beta_slow"), [(32.0, 1.0), (16.0, 2.0)])
def test_rope_yarn_frequencies_and_attention_factor_match_hf(dim, base, L, beta_fast, beta_slow):
    for s in [*FACTORS, 16.0, 40.0]:
        theirs, attention = hf_rope(
            "yarn",
            dim,
            base,
            max_position=round(s * L),
            factor=s,
            original_max_position_embeddings=L,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
        )
        ours = rope_inv_freq(dim, base, "yarn", s, L, beta_fast=beta_fast, beta_slow=beta_slow)
        assert_same(ours, theirs)
        assert rope_attention_factor("yarn", s) == pytest.approx(attention, rel=1e-12)
    # not a vacuous match: the fastest pair keeps theta, the slowest is (at least partly) interpolated
    plain = rope_inv_freq(dim, base)
    yarn = rope_inv_freq(dim, base, "yarn", 8.0, L, beta_fast=beta_fast, beta_slow=beta_slow)
    assert yarn[0] == plain[0] and yarn[-1] < plain[-1]


# ---- T5 buckets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_buckets", "max_distance"),
    [(32, 128), (16, 64), (8, 1000), (32, 256), (64, 512), (10, 100), (7, 50), (2, 8)],
)
def test_t5_causal_buckets_match_hf(num_buckets, max_distance):
    distance = torch.arange(5001)  # query - key; HF takes key - query
    theirs = T5Attention._relative_position_bucket(
        -distance, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = torch.tensor([t5_causal_bucket(int(n), num_buckets, max_distance) for n in distance])
    mismatch = (ours != theirs).nonzero().flatten()[:5].tolist()
    assert not mismatch, (
        f"distances {mismatch}: ours {ours[mismatch].tolist()}, HF {theirs[mismatch].tolist()}"
    )
    assert set(theirs.tolist()) == set(range(num_buckets))  # every bucket is reached: not a vacuous match


# ---- ALiBi slopes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_heads", range(1, 17))
def test_alibi_slopes_match_x_transformers(n_heads):
    # total_heads: required by older x-transformers (1.30); slopes is an fp32 buffer (H, 1, 1)
    theirs = AlibiPositionalBias(heads=n_heads, total_heads=n_heads).slopes.flatten().double()
    ours = torch.tensor(alibi_slopes(n_heads), dtype=torch.float64)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0.0)


# ---- Layouts: Llama 4's attention layers ----------------------------------------------------------------------
def hf_llama4_layer(layer: int, qk_norm: bool, chunk: int, floor_scale: int) -> tuple[Llama4TextAttention, Llama4TextConfig]:
    """Layer 0 a RoPE layer with chunked attention, layer 1 a NoPE layer with global attention and temperature
    tuning (``no_rope_layers``: 1 = RoPE); eager attention, no GQA (PELab has none)."""
    config = Llama4TextConfig(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
        no_rope_layers=[1, 0], attention_chunk_size=chunk, attn_temperature_tuning=True, floor_scale=floor_scale,
        attn_scale=0.1, use_qk_norm=qk_norm, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        intermediate_size=64, intermediate_size_mlp=64, vocab_size=16)
    config._attn_implementation = "eager"
    return Llama4TextAttention(config, layer), config


@pytest.mark.parametrize(("layer", "qk_norm"), [(0, True), (0, False), (1, False)])
def test_layout_layers_match_hf_llama4_attention(layer, qk_norm):
    """PELab's ``rope@chunk:8(+qk_norm)`` and ``nope+llama4_temp`` layers = HF's Llama4TextAttention with PELab's
    weights. HF rotates adjacent channel pairs (2i, 2i+1) (view_as_complex), PELab half-split pairs (i, i + Dh/2):
    the q and k rows of each head are permuted into HF's order (a dot product is unchanged by permuting both)."""
    T, D, H, chunk, floor_scale = 21, 32, 2, 8, 4
    torch.manual_seed(0)
    layout = [f"rope@chunk:{chunk}" + ("+qk_norm" if qk_norm else ""), "nope+llama4_temp"]
    model = GPT(GPTConfig(vocab_size=16, n_layers=2, n_heads=H, d_model=D, layout=layout, bias=False,
                          temperature_floor_scale=floor_scale, temperature_attn_scale=0.1),
                build_encoding({"name": "rope", "base": 10000.0}, D, H))
    ours, pe = model.blocks[layer].attn, model.encodings()[model.layer_specs[layer].pe]
    theirs, config = hf_llama4_layer(layer, qk_norm, chunk, floor_scale)
    dh = D // H
    with torch.no_grad():
        ours.qkv.weight.mul_(40)  # logits of order 1 (GPT-2's N(0, 0.02) init makes them ~1e-3: any temperature passes)
    wq, wk, wv = ours.qkv.weight.detach().chunk(3)
    with torch.no_grad():
        theirs.q_proj.weight.copy_(wq.view(H, dh, D)[:, half_split_to_pairs(dh)].reshape(D, D))
        theirs.k_proj.weight.copy_(wk.view(H, dh, D)[:, half_split_to_pairs(dh)].reshape(D, D))
        theirs.v_proj.weight.copy_(wv)
        theirs.o_proj.weight.copy_(ours.proj.weight)
    x = torch.randn(2, T, D)
    q_idx, kv_idx = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (and_masks(chunked_overlay(chunk, torch.zeros(2, dtype=torch.long)), causal_mask_function)
               if layer == 0 else causal_mask_function)(0, 0, q_idx, kv_idx)
    mask = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))[None, None]
    cis = Llama4TextRotaryEmbedding(config)(x, torch.arange(T)[None].expand(2, T))
    want, _ = theirs(x, cis, mask)
    got = ours(x, pe, pe.prepare(torch.arange(T)))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def half_split_to_pairs(dh: int) -> torch.Tensor:
    """PELab's channel i, i + dh/2 (one RoPE pair, half-split) -> channels 2i, 2i+1 (adjacent pairs: HF Llama 4,
    x-transformers)."""
    return torch.stack([torch.arange(dh // 2), torch.arange(dh // 2) + dh // 2], dim=1).flatten()


@pytest.mark.parametrize("rotated", [1, 3])
def test_rotate_heads_matches_x_transformers_rotate_num_heads(rotated):
    """``rope+rotate_heads:n`` = x-transformers' Attention(rotate_num_heads=n): the LAST n heads rotate, the first
    H - n have no position signal. Weights copied, q/k rows permuted into x-transformers' adjacent pairs."""
    T, D, H = 13, 64, 4
    dh = D // H
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, n_layers=1, n_heads=H, d_model=D, layout=[f"rope+rotate_heads:{rotated}"]),
                build_encoding({"name": "rope", "base": 10000.0}, D, H))
    ours = model.blocks[0].attn
    theirs = Attention(dim=D, heads=H, dim_head=dh, causal=True, rotate_num_heads=rotated)
    with torch.no_grad():
        ours.qkv.weight.mul_(40)  # logits of order 1, so that a head rotated or not shows
        wq, wk, wv = ours.qkv.weight.chunk(3)
        theirs.to_q.weight.copy_(wq.view(H, dh, D)[:, half_split_to_pairs(dh)].reshape(D, D))
        theirs.to_k.weight.copy_(wk.view(H, dh, D)[:, half_split_to_pairs(dh)].reshape(D, D))
        theirs.to_v.weight.copy_(wv)
        theirs.to_out.weight.copy_(ours.proj.weight)
    x = torch.randn(2, T, D)
    want = theirs(x, rotary_pos_emb=RotaryEmbedding(dh).forward_from_seq_len(T))
    got = ours(x, model.pe, model.pe.prepare(torch.arange(T)))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- FoX (the Forgetting Transformer): the forget-gate bias and a whole FoX attention layer -------------------
def test_fox_bias_matches_x_transformers_data_dependent_alibi():
    """One layer's forget gate = x-transformers' ``DataDependentAlibi`` (the FoX gate as a data-dependent ALiBi) with
    the same weights: bias_ij = sum_{j<l<=i} logsigmoid(w . x_l + b) on and below the diagonal, for the whole
    input and per query chunk (the rows of queries 8..15 against keys 0..15)."""
    B, T, D, H = 2, 24, 32, 4
    torch.manual_seed(0)
    gate = build_encoding({"name": "fox", "gate_bias_init": 2.0}, D, H, 64).layer_input_bias()
    theirs = DataDependentAlibi(dim=D, heads=H)
    with torch.no_grad():
        gate.proj.weight.normal_(0.0, 0.5)  # gates of all sizes, not only near sigmoid(b)
        theirs.to_forget_gates[0].load_state_dict(gate.proj.state_dict())
    x = torch.randn(B, T, D)
    want, bias_fn = theirs(x), gate(x, None)  # (B, H, T, T); the gate reads no positions
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(bias_fn(0, T)[..., seen], want[..., seen], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias_fn(8, 16)[..., seen[8:16, :16]], want[..., 8:16, :16][..., seen[8:16, :16]],
                               rtol=1e-5, atol=1e-5)
    assert want[..., seen].max() <= 0 and want[..., seen].min() < -1  # a decay, and not a negligible one


def fox_reference_attention(q, k, v, log_fgate, sm_scale):
    """The naive path of ``test_op`` in zhixuan-lin/forgetting-transformer (ops/forgetting_attention.py), M = N
    (no seq_start): p = q k^T * scale + (log_lambda_i - log_lambda_j), causal -inf, softmax, times v."""
    M = N = q.shape[-2]
    mask = torch.tril(torch.ones((M, N)), diagonal=N - M)
    p = torch.matmul(q, k.transpose(2, 3)) * sm_scale
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    p = p.float() + (log_lambda[..., -M:, None] - log_lambda[..., None, :])
    p[:, :, mask == 0] = float("-inf")
    return torch.matmul(torch.softmax(p, dim=-1), v)


@pytest.mark.parametrize("rope", [False, True])
def test_fox_layer_matches_the_reference_naive_path(rope):
    """A FoX attention layer (pe=fox, pe.rope=false/true) = the FoX repository's naive attention on the layer's own
    q, k, v and gate, through PELab's training path (explicit: the mask needs a gradient on CPU), its evaluation
    path (SDPA with the mask) in query chunks of 8, and the last rows only: outputs and the gate's gradient."""
    B, T, D, H = 2, 21, 32, 2
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, n_layers=1, n_heads=H, d_model=D, attn_chunk_size=8),
                build_encoding({"name": "fox", "rope": rope}, D, H, 64))
    layer, pe = model.blocks[0].attn, model.pe
    with torch.no_grad():
        layer.qkv.weight.mul_(40)  # logits of order 1
        layer.input_bias.proj.weight.normal_(0.0, 0.5)
    x = torch.randn(B, T, D)
    q, k, v = layer.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    state = pe.prepare(torch.arange(T))
    if rope:
        q, k = pe.rotate(q, k, state)
    log_fgate = torch.nn.functional.logsigmoid(layer.input_bias.proj(x).float()).transpose(1, 2)  # (B, H, T)
    want = layer.proj(fox_reference_attention(q, k, v, log_fgate, (D // H) ** -0.5).transpose(1, 2).reshape(B, T, D))
    (want_grad,) = torch.autograd.grad(want.square().sum(), layer.input_bias.proj.weight)
    model.train()
    got = layer(x, pe, state)
    (got_grad,) = torch.autograd.grad(got.square().sum(), layer.input_bias.proj.weight)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, pe, state), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x, pe, state, q_start=13), want[:, 13:], rtol=1e-5, atol=1e-5)


# ---- Stick-breaking attention -------------------------------------------------------------------------------
def stickbreaking_reference(q, k, v, attend_current):
    """shawntan/stickbreaking-attention: ``stickbreaking_attention/sb_ref.py::stickbreaking`` as its
    ``tests/test_attn.py::ref_fwd`` calls it (cm = ones.tril(-1), mask = ones.triu(1 if attend_current else 0), o + rem * v)."""
    T = q.shape[-2]
    mask = torch.ones(T, T).triu(1 if attend_current else 0).bool()
    cum_weight = torch.ones(T, T).tril(-1)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    att = (log_z + torch.einsum("bhij,jk->bhik", log_beta, cum_weight)).exp()
    return att @ v + (1 - att.sum(dim=-1))[..., None] * v


def stickbreaking_loop(q, k, v, attend_current):
    """The paper's definition, one query and one key at a time (fp64): from the nearest key to the farthest, key j
    takes beta = sigmoid(q_i . k_j / sqrt(Dh)) of what is left of the stick; the rest goes to v_i."""
    B, H, T, Dh = q.shape
    out = torch.zeros(B, H, T, Dh, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                left = 1.0
                for j in range(i if attend_current else i - 1, -1, -1):
                    beta = torch.sigmoid(q[b, h, i].double() @ k[b, h, j].double() / math.sqrt(Dh))
                    out[b, h, i] += left * beta * v[b, h, j].double()
                    left = left * (1 - beta)
                out[b, h, i] += left * v[b, h, i].double()
    return out


@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_matches_the_reference_formula_and_the_definition(attend_current):
    """``stickbreaking_attention`` (in query chunks of 4, and from the 7th query only) = the reference's naive formula
    (outputs and q, k, v gradients) = a loop over the definition."""
    B, H, T, Dh = 1, 2, 11, 8
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    want = stickbreaking_reference(q, k, v, attend_current)
    got = stickbreaking_attention(q, k, v, chunk_size=4, attend_current=attend_current)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.double(), stickbreaking_loop(q.detach(), k.detach(), v.detach(), attend_current),
                               rtol=1e-5, atol=1e-6)
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v)) for out in (got, want)]
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stickbreaking_attention(q, k, v, chunk_size=4, q_start=6, attend_current=attend_current),
                               want[..., 6:, :], rtol=1e-5, atol=1e-6)


def test_model_attention_stickbreaking_is_the_reference_in_a_layer():
    """model.attention=stickbreaking with pe=nope: a layer's output = the reference on its own q, k, v (training
    and evaluation, the last rows only); an unknown model.attention is a one-line error naming the key."""
    B, T, D, H = 2, 13, 32, 2
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, n_layers=1, n_heads=H, d_model=D, attention="stickbreaking",
                          attn_chunk_size=5), build_encoding("nope", D, H, 64))
    layer = model.blocks[0].attn
    with torch.no_grad():
        layer.qkv.weight.mul_(40)  # logits of order 1
    x = torch.randn(B, T, D)
    q, k, v = layer.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    want = layer.proj(stickbreaking_reference(q, k, v, False).transpose(1, 2).reshape(B, T, D))
    state = model.pe.prepare(torch.arange(T))
    torch.testing.assert_close(layer(x, model.pe, state), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, model.pe, state, q_start=9), want[:, 9:], rtol=1e-5, atol=1e-5)
    unknown = r"model.attention=sparse is unknown; choose one of \['softmax', 'stickbreaking'\]"
    with pytest.raises(ValueError, match=unknown):
        GPTConfig(vocab_size=16, n_layers=1, n_heads=H, d_model=D, attention="sparse").validate()


# ---- FoPE ---------------------------------------------------------------------------------------------------
def fope_reference(t, sin_coef, cos_coef, head_dim, max_sequence_length, theta=10000.0):
    """TsinghuaC3I/Fourier-Position-Embedding ``olmo/model.py``: ``RotaryEmbedding.get_inv_freq`` with
    rope_clamp_floor_freq + rope_clamp_floor_to_zero (floor 2 pi / max_sequence_length), ``fourier_ignore_zero``,
    ``get_rotary_embedding`` (suffix "fourier") and ``FourierEmbedding.apply_rotary_pos_emb`` (separate basis, per
    head, prefix "attn"), for t (B, H, T, Dh) at positions 0..T-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    inv_freq[inv_freq < 2 * torch.pi / max_sequence_length] = 0.0
    inv_freq = inv_freq[inv_freq != 0.0][None, :]  # (1, M)
    freqs = torch.einsum("t, hd -> htd", torch.arange(t.shape[-2], dtype=torch.float), inv_freq).unsqueeze(0)
    pos_sin, pos_cos = freqs.sin(), freqs.cos()
    fourier_sin = torch.einsum("bhtD, hDd -> bhtd", pos_sin, sin_coef)
    fourier_cos = torch.einsum("bhtD, hDd -> bhtd", pos_cos, cos_coef)
    fourier_sin = F.pad(input=fourier_sin, pad=(0, head_dim // 2 - fourier_sin.size(-1)), mode="constant", value=1)
    fourier_cos = F.pad(input=fourier_cos, pad=(0, head_dim // 2 - fourier_cos.size(-1)), mode="constant", value=1)
    fourier_sin = torch.cat((fourier_sin, fourier_sin), dim=-1)
    fourier_cos = torch.cat((fourier_cos, fourier_cos), dim=-1)
    x1, x2 = t.view(*t.shape[:-1], 2, head_dim // 2).unbind(dim=-2)  # rotate_half
    return (t * fourier_cos) + (torch.cat((-x2, x1), dim=-1) * fourier_sin)


def test_fope_matches_the_reference_fourier_embedding():
    """pe=fope's rotation of q and k = the reference's FourierEmbedding with the same coefficients; its clipping
    keeps the frequencies with a full period in L (Dh 16, L 64: 1, 0.316, 0.1 of 8), its series pairs are
    min(M, Dh / 4) = 3, and its coefficients start at the step eye plus noise, frozen by default."""
    B, H, T, Dh = 2, 2, 40, 16
    torch.manual_seed(0)
    pe = build_encoding("fope", H * Dh, H, 64)
    assert pe.freq.numel() == 3 and pe.cos_coef.shape == (H, 3, 3) and not pe.cos_coef.requires_grad
    assert (pe.cos_coef.diagonal(dim1=-2, dim2=-1) - 1).abs().max() < 1.0  # the eye under gain-0.3 noise
    q, k = torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)
    got_q, got_k = pe.rotate(q, k, pe.prepare(torch.arange(T)))
    torch.testing.assert_close(got_q, fope_reference(q, pe.sin_coef, pe.cos_coef, Dh, 64), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, fope_reference(k, pe.sin_coef, pe.cos_coef, Dh, 64), rtol=1e-5, atol=1e-5)
