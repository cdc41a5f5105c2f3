"""Context-extension methods beside PI / NTK / YaRN (docs/context_extension.md): ReRoPE, Leaky ReRoPE, Self-Extend and
STRING at evaluation (pelab.encodings.piecewise, through RoPE's content-bias hook) and PoSE's fine-tuning positions
(pelab.encodings.pose, extend.pose_length), each against a transcription of its reference code (float64 here):

  bojone/rerope            rerope_patch.py, leaky_rerope_patch.py (forward_with_rerope / _leaky_rerope, prompt branch)
  datamllab/LongLM         self_extend_patch/Llama_4_40.py (self_extend_forward, q_len == kv_seq_len branch)
  HKUNLP/STRING            string_for_llama.py (forward + string_flash_forward; the decoding branch)
  dwzhu-pku/PoSE           src/train_pose.py (train_preprocess_function_pose)

The HF pieces they call (rotate_half, apply_rotary_pos_emb, the rotary caches of transformers 4.31-4.43) are
transcribed too. The PELab side is a real attention layer of a built model: its own dispatch (the chunked content-bias
path, explicit logits for log-n), not the functions under test called by hand.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from helpers.runs import FAST, compose, summaries
from pelab.encodings import build_encoding
from pelab.errors import ConfigError
from pelab.model import build_model

D, H = 64, 4
Dh = D // H
L = 32  # the training length the methods are configured against


# ---- the references, transcribed ----------------------------------------------------------------------------------
def rotate_half(x):
    """transformers.models.llama.modeling_llama.rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cache(dim, seq_len, base=10000.0, scaling_factor=1.0):
    """cos_cached, sin_cached (seq_len, dim) of LlamaRotaryEmbedding (t = arange) and LlamaLinearScalingRotaryEmbedding
    (t = arange / scaling_factor), transformers 4.31."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).double() / dim))
    t = torch.arange(seq_len, dtype=torch.float64) / scaling_factor
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_cache(x, cos, sin, position_ids):
    """bojone/rerope's (and STRING's) apply_rotary_pos_emb: rows position_ids of the cache, (bs, 1, seq, dim)."""
    cos = cos[position_ids].unsqueeze(1)
    sin = sin[position_ids].unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def rotary_at(dim, position_ids, base=10000.0):
    """LlamaRotaryEmbedding.forward(x, position_ids) of transformers 4.40 (what LongLM calls): cos, sin (bs, seq, dim)
    at any (also fractional) positions."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).double() / dim))
    freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].double()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def causal_softmax_out(attn_weights, value_states):
    """HF's additive causal mask (finfo.min above the diagonal), softmax in fp32 (here fp64), times v."""
    T = attn_weights.shape[-1]
    mask = torch.full((T, T), torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype).triu(1)
    return torch.softmax(attn_weights + mask, dim=-1) @ value_states


def rerope_reference(query_states, key_states, value_states, window, training_length=None):
    """forward_with_rerope, q_len > 1 (bojone/rerope rerope_patch.py); `training_length` None drops its log-n line."""
    bsz, _, q_len, head_dim = query_states.shape
    position_ids = torch.arange(q_len)[None].expand(bsz, q_len)
    if training_length is not None:
        query_states = query_states * ((position_ids + 1)[:, None, :, None].log() / math.log(training_length)).clip(1)
    cos, sin = rotary_cache(head_dim, max(q_len, window + 1))
    query_states1, key_states1 = apply_cache(query_states, cos, sin, position_ids), \
        apply_cache(key_states, cos, sin, position_ids)
    query_states2 = apply_cache(query_states, cos, sin, position_ids * 0 + window)
    attn_weights1 = torch.matmul(query_states1, key_states1.transpose(2, 3)) / math.sqrt(head_dim)
    attn_weights2 = torch.matmul(query_states2, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window
    # [:, None]: the patch's (bsz, q, k) mask against (bsz, heads, q, k) weights broadcasts for bsz = 1 only
    attn_weights = torch.where(rectified_mask[:, None], attn_weights1, attn_weights2)
    return causal_softmax_out(attn_weights, value_states)


def leaky_rerope_reference(query_states, key_states, value_states, window, scaling_factor):
    """forward_with_leaky_rerope, q_len > 1 (bojone/rerope leaky_rerope_patch.py), without its log-n line."""
    bsz, _, q_len, head_dim = query_states.shape
    position_ids = torch.arange(q_len)[None].expand(bsz, q_len)
    offset = window * (scaling_factor - 1)
    cos, sin = rotary_cache(head_dim, q_len)
    cos2, sin2 = rotary_cache(head_dim, q_len + offset, scaling_factor=scaling_factor)
    query_states1, key_states1 = apply_cache(query_states, cos, sin, position_ids), \
        apply_cache(key_states, cos, sin, position_ids)
    query_states2 = apply_cache(query_states, cos2, sin2, position_ids + offset)
    key_states2 = apply_cache(key_states, cos2, sin2, position_ids)
    attn_weights1 = torch.matmul(query_states1, key_states1.transpose(2, 3)) / math.sqrt(head_dim)
    attn_weights2 = torch.matmul(query_states2, key_states2.transpose(2, 3)) / math.sqrt(head_dim)
    rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window
    attn_weights = torch.where(rectified_mask[:, None], attn_weights1, attn_weights2)
    return causal_softmax_out(attn_weights, value_states)


def self_extend_reference(query_states, key_states, value_states, group_size_1, group_size_2):
    """self_extend_forward, q_len == kv_seq_len, scale_base = -1 (datamllab/LongLM self_extend_patch/Llama_4_40.py,
    with the integer group query position of its fix 715c1e3)."""
    bsz, _, q_len, head_dim = query_states.shape
    kv_seq_len = q_len
    position_ids = torch.arange(q_len)[None].expand(bsz, q_len)
    query_position = key_position = position_ids
    neighbor_q_cos, neighbor_q_sin = rotary_at(head_dim, query_position)
    neighbor_k_cos, neighbor_k_sin = rotary_at(head_dim, key_position)
    _re_group_size_2 = 0 if query_position.max() < group_size_2 else group_size_2
    group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 // group_size_1
    group_key_position = key_position // group_size_1
    group_q_cos, group_q_sin = rotary_at(head_dim, group_query_position)
    group_k_cos, group_k_sin = rotary_at(head_dim, group_key_position)

    def rot(x, cos, sin):  # apply_rotary_pos_emb(..., unsqueeze_dim=1)
        return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)

    neighbor_query_states = rot(query_states, neighbor_q_cos, neighbor_q_sin)
    neighbor_key_states = rot(key_states, neighbor_k_cos, neighbor_k_sin)
    group_query_states = rot(query_states, group_q_cos, group_q_sin)
    group_key_states = rot(key_states, group_k_cos, group_k_sin)
    neighbor_attn_weights = torch.matmul(neighbor_query_states,
                                         neighbor_key_states.transpose(2, 3)) / math.sqrt(head_dim)
    group_attn_weights = torch.matmul(group_query_states, group_key_states.transpose(2, 3)) / math.sqrt(head_dim)
    neighbor_attention_mask = torch.tril(torch.ones((q_len, kv_seq_len)))
    if q_len - group_size_2 > 0:
        group_attention_mask = torch.tril(torch.ones((q_len - group_size_2, kv_seq_len - group_size_2)))
        neighbor_attention_mask[group_size_2:, :-group_size_2] -= group_attention_mask
    attn_weights = torch.where(neighbor_attention_mask.bool(), neighbor_attn_weights, group_attn_weights)
    return causal_softmax_out(attn_weights, value_states)


def flash_attn_reference(q, k, v, causal, window_size):
    """flash_attn_func(q, k, v, causal=..., window_size=..., return_attn_probs=True)'s output and log-sum-exp in plain
    ops: q (bsz, Tq, h, d), k, v (bsz, Tk, h, d) -> out (bsz, Tq, h, d), lse (bsz, h, Tq). Query i sees the keys in
    [i + Tk - Tq - left, i + Tk - Tq + right] (inclusive; -1 = unbounded), causal = right 0 (bottom-right aligned)."""
    Tq, Tk = q.shape[1], k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None, :]
    left, right = window_size
    right = 0 if causal else right
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)
    return out, lse


def string_flash_forward(neighbor_query_states, shifted_query_states, key_states, value_states, diag_size,
                         near_window):
    """HKUNLP/STRING string_for_llama.py string_flash_forward, the near pass's window_size=[diag_size, 0] given as
    `near_window` (the reference's own value is diag_size: see the test)."""
    kv_seq_len = neighbor_query_states.size(1)
    diag_out, diag_lse = flash_attn_reference(neighbor_query_states, key_states, value_states, causal=True,
                                              window_size=[near_window, 0])
    triangle_len = kv_seq_len - diag_size
    if triangle_len < 0:
        return diag_out
    shifted_out, shifted_lse = flash_attn_reference(shifted_query_states[:, -triangle_len:, :, :],
                                                    key_states[:, :triangle_len, :, :],
                                                    value_states[:, :triangle_len, :, :], causal=True,
                                                    window_size=[-1, -1])
    L_ = diag_out.size(1)
    N = shifted_out.size(1)
    S = L_ - N
    diag_out_head = diag_out[:, :S]
    diag_lse_tail = diag_lse[:, :, S:]
    diag_out_tail = diag_out[:, S:]
    lse_gap = 1 / (1 + torch.exp(diag_lse_tail - shifted_lse))
    lse_gap_re = 1 / (1 + torch.exp(shifted_lse - diag_lse_tail))
    lse_gap = lse_gap.transpose(1, 2).unsqueeze(-1)
    lse_gap_re = lse_gap_re.transpose(1, 2).unsqueeze(-1)
    merge_out_tail = diag_out_tail * lse_gap_re + shifted_out * lse_gap
    return torch.cat([diag_out_head, merge_out_tail], dim=1)


def string_reference(query_states, key_states, value_states, diag_size, local_window, near_window):
    """STRING's forward without a KV cache (the prompt): rotate k and q at position_ids, q also at position_ids -
    diag_size + local_window, then string_flash_forward; (bsz, h, T, d) in and out."""
    bsz, _, q_len, head_dim = query_states.shape
    position_ids = torch.arange(q_len)[None].expand(bsz, q_len)
    cos, sin = rotary_cache(head_dim, q_len)
    key_states = apply_cache(key_states, cos, sin, position_ids)
    query_states_1 = apply_cache(query_states, cos, sin, position_ids)
    query_states_2 = apply_cache(query_states, cos, sin, position_ids - diag_size + local_window)
    out = string_flash_forward(query_states_1.transpose(1, 2), query_states_2.transpose(1, 2),
                               key_states.transpose(1, 2), value_states.transpose(1, 2), diag_size, near_window)
    return out.transpose(1, 2)


def string_decode_reference(query_states, key_states, value_states, diag_size, local_window):
    """STRING's decoding branch for the last token (flash decoding over the last diag_size cached keys with q at its
    position, over the keys before them with q shifted; merged by log-sum-exp): its output (bsz, h, 1, d)."""
    bsz, _, kv_seq_len, head_dim = key_states.shape
    position_ids = torch.arange(kv_seq_len)[None].expand(bsz, kv_seq_len)
    cos, sin = rotary_cache(head_dim, kv_seq_len)
    k_cache = apply_cache(key_states, cos, sin, position_ids).transpose(1, 2)  # (bsz, T, h, d)
    v_cache = value_states.transpose(1, 2)
    last = position_ids[:, -1:]
    query_states_1 = apply_cache(query_states[:, :, -1:], cos, sin, last).transpose(1, 2)
    query_states_2 = apply_cache(query_states[:, :, -1:], cos, sin, last - diag_size + local_window).transpose(1, 2)
    shifted_size = kv_seq_len - diag_size
    out1, lse1 = flash_attn_reference(query_states_1, k_cache[:, shifted_size:], v_cache[:, shifted_size:],
                                      causal=False, window_size=[-1, -1])
    out2, lse2 = flash_attn_reference(query_states_2, k_cache[:, :shifted_size], v_cache[:, :shifted_size],
                                      causal=False, window_size=[-1, -1])
    gap21 = (1 / (1 + torch.exp(lse2 - lse1))).transpose(1, 2).unsqueeze(-1)
    gap12 = (1 / (1 + torch.exp(lse1 - lse2))).transpose(1, 2).unsqueeze(-1)
    return (out1 * gap21 + out2 * gap12).transpose(1, 2)


# ---- PELab's side: a real attention layer ---------------------------------------------------------------------------
def layer(scaling: dict, chunk: int = 16, **model):
    """The first attention layer of a built model (d 64, 4 heads, fp32) under `scaling` at training length L, with its
    query/key weights scaled up so that attention is peaked (position errors then show)."""
    torch.manual_seed(0)
    gpt = build_model({"n_layers": 1, "n_heads": H, "d_model": D, "attn_chunk_size": chunk, **model},
                      {"name": "rope", "scaling": scaling}, vocab_size=64, train_length=L)
    attn = gpt.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight[: 2 * D].mul_(8.0)
    return gpt.pe, attn


def run_layer(pe, attn, x, q_start=0):
    """The layer's output (B, T - q_start, D) at positions 0..T-1, as the model calls it."""
    with torch.no_grad():
        return attn(x, pe, pe.prepare(torch.arange(x.shape[1]), consecutive=True), q_start)


def reference_layer(attn, x, reference, **kw):
    """The same layer with its attention replaced by `reference` on its own q, k, v (float64)."""
    B, T, _ = x.shape
    with torch.no_grad():
        q, k, v = attn.qkv(x).double().view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)
        y = reference(q, k, v, **kw).transpose(1, 2).reshape(B, T, D)
        return attn.proj(y.float())


def plain_rope(attn, x):
    """The layer under plain RoPE (what a missing correction would give)."""
    pe = build_encoding({"name": "rope"}, D, H, L)
    return run_layer(pe, attn, x)


CASES = [
    # (scaling, the reference and its arguments in the reference's own names)
    ({"type": "rerope", "window": 6}, rerope_reference, {"window": 6}),
    ({"type": "leaky_rerope", "window": 6, "factor": 4}, leaky_rerope_reference, {"window": 6, "scaling_factor": 4}),
    # w = 10 is not a multiple of G = 4: w // G (the fix) and w / G differ
    ({"type": "self_extend", "window": 10, "group": 4}, self_extend_reference, {"group_size_1": 4, "group_size_2": 10}),
    # the near pass's window S - 1: keys at distance < S, as STRING's decoding branch and its paper (docstring)
    ({"type": "string", "window": 11, "local": 3}, string_reference,
     {"diag_size": 11, "local_window": 3, "near_window": 10}),
]


@pytest.mark.parametrize("scaling, reference, kw", CASES, ids=[c[0]["type"] for c in CASES])
def test_the_merged_attention_equals_the_reference_code(scaling, reference, kw):
    pe, attn = layer(scaling)
    assert pe.has_content_bias and pe.scaling["type"] == scaling["type"]
    torch.manual_seed(1)
    x = torch.randn(2, 3 * L, D)  # 3 x L: chunks of 16 queries, windows far inside
    expected = reference_layer(attn, x, reference, **kw)
    got = run_layer(pe, attn, x)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    assert (plain_rope(attn, x) - expected).abs().max() > 1e-2  # the correction is what makes them equal
    # the last rows only (probe answers: q_start) are the same rows
    torch.testing.assert_close(run_layer(pe, attn, x, q_start=70), got[:, 70:], atol=1e-6, rtol=1e-5)


def test_rerope_with_log_n_equals_the_patch_as_published():
    """bojone's patch also scales q by max(1, log(i + 1) / log L): PELab's model.attn_logit_scale=log_length (the
    explicit-logits path), on the same merged scores."""
    pe, attn = layer({"type": "rerope", "window": 6}, attn_logit_scale="log_length")
    torch.manual_seed(2)
    x = torch.randn(1, 3 * L, D)
    expected = reference_layer(attn, x, rerope_reference, window=6, training_length=L)
    torch.testing.assert_close(run_layer(pe, attn, x), expected, atol=2e-5, rtol=1e-4)


def test_string_prefill_as_published_counts_the_key_at_distance_s_twice():
    """STRING's prefill passes window_size=[S, 0] to the near pass, and flash-attention's window is inclusive: the key
    at distance exactly S is in both passes. Its decoding branch and the paper's position matrix have it in the far
    pass only, as PELab: the rows from S on differ from the prefill code, the last row equals the decoding code."""
    S, W = 11, 3
    pe, attn = layer({"type": "string", "window": S, "local": W})
    torch.manual_seed(3)
    x = torch.randn(1, 2 * L, D)
    got = run_layer(pe, attn, x)
    literal = reference_layer(attn, x, string_reference, diag_size=S, local_window=W, near_window=S)
    torch.testing.assert_close(got[:, :S], literal[:, :S], atol=2e-5, rtol=1e-4)
    assert (got[:, S:] - literal[:, S:]).abs().amax(-1).min() > 1e-5  # every row past S sees the duplicate
    B, T, _ = x.shape
    with torch.no_grad():
        q, k, v = attn.qkv(x).double().view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)
        last = attn.proj(string_decode_reference(q, k, v, S, W).transpose(1, 2).reshape(B, 1, D).float())
    torch.testing.assert_close(got[:, -1:], last, atol=2e-5, rtol=1e-4)


def test_each_method_keeps_rope_inside_its_window_and_reaches_the_distances_it_promises():
    """The far position maps as the papers state them, on the merged relative distance."""
    from pelab.encodings.piecewise import far_offsets

    i, j = torch.arange(200), torch.zeros(200, dtype=torch.long)  # every distance d = i from key 0
    dq, dk = far_offsets("rerope", i, j, window=16)
    assert torch.equal(i + dq - (j + dk), torch.full((200,), 16.0))  # min(d, w) past w
    dq, dk = far_offsets("leaky_rerope", i, j, window=16, factor=8)
    torch.testing.assert_close(i + dq - (j + dk), 16 + (i - 16) / 8)  # w + (d - w) / k
    dq, dk = far_offsets("string", i, j, window=42, local=8)
    assert torch.equal(i + dq - (j + dk), (i - 42 + 8).float())  # d - S + W
    dq, dk = far_offsets("self_extend", i, j, window=32, group=7)
    assert torch.equal(i + dq - (j + dk), (i // 7 + 32 - 32 // 7).float())  # grouped, continuous at d = w
    # in-window lengths of ReRoPE with w = T - 1: every pair is RoPE's (the far map gives d = w at d = w)
    pe, attn = layer({"type": "rerope", "window": L - 1})
    x = torch.randn(1, L, D)
    torch.testing.assert_close(run_layer(pe, attn, x), plain_rope(attn, x[:, :L]), atol=1e-5, rtol=1e-5)


def test_defaults_follow_each_reference_and_bad_settings_name_their_key():
    def resolved(scaling, name="rope"):
        return build_encoding({"name": name, "scaling": scaling}, D, H, 128).scaling

    assert resolved({"type": "rerope"})["window"] == 16  # L / 8: bojone's 512 of 4,096
    s = resolved({"type": "self_extend", "factor": 16})
    assert (s["window"], s["group"]) == (32, 21)  # (128 - 32) * 21 + 32 >= 16 x 128 > (128 - 32) * 20 + 32
    s = resolved({"type": "string"})
    assert (s["window"], s["local"]) == (42, 8)  # int(0.33 L), L / 16
    assert resolved({"type": "self_extend", "window": 8, "group": 3})["group"] == 3  # given values are kept
    bad = [({"type": "rerope", "window": 128}, "pe.scaling.window"),
           ({"type": "string", "window": 8, "local": 8}, "pe.scaling.local"),
           ({"type": "self_extend", "group": 0}, "pe.scaling.group"),
           ({"type": "leaky_rerope", "factor": 0.5}, "pe.scaling.factor")]
    for scaling, key in bad:
        with pytest.raises(ConfigError, match=key) as err:
            resolved(scaling)
        assert "\n" not in str(err.value)
    for name in ("xpos", "fox"):
        with pytest.raises(ConfigError, match="pe.scaling.type=rerope"):
            resolved({"type": "rerope"}, name) if name == "xpos" else \
                build_encoding({"name": "fox", "rope": True, "scaling": {"type": "rerope"}}, D, H, 128)


# ---- PoSE -----------------------------------------------------------------------------------------------------------
def pose_reference_positions(len_chunk, scaled_max_position_embeddings, rng):
    """The position ids of train_preprocess_function_pose (dwzhu-pku/PoSE src/train_pose.py) for a document of
    exactly len_chunk tokens, and its two draws (rt1, rt)."""
    lt1 = 0
    rt1 = rng.randint(1, (len_chunk + 1) // 2)
    pos_ids = torch.arange(len_chunk, dtype=torch.long)
    lt = 0
    rt = rng.randint(lt, scaled_max_position_embeddings - len_chunk)
    pos_ids[: rt1 - lt1] += lt
    pos_ids[rt1 - lt1 :] += rt
    return pos_ids, rt1, rt


def test_pose_positions_are_the_references_and_cover_the_target_window():
    from pelab.encodings.pose import pose_positions, pose_positions_of

    rng = random.Random(0)
    draws = [pose_reference_positions(128, 512, rng) for _ in range(50)]
    first, skip = torch.tensor([d[1] for d in draws]), torch.tensor([d[2] for d in draws])
    assert torch.equal(pose_positions_of(first, skip, 128), torch.stack([d[0] for d in draws]))
    torch.manual_seed(0)
    pos = pose_positions(4000, 16, 64, torch.device("cpu"))
    first = (pos.diff(dim=-1) > 1).float().argmax(-1) + 1  # where the second chunk starts (rows that skip)
    jumps = pos.diff(dim=-1) - 1
    assert pos.min() == 0 and pos.max() == 63 and jumps.min() == 0  # positions rise, the last one reaches L_t - 1
    assert set(jumps.sum(-1).tolist()) == set(range(64 - 16 + 1))  # u_1 ~ U{0..L_t - L_c}
    assert set(first[jumps.sum(-1) > 0].tolist()) == set(range(1, 8 + 1))  # l_0 ~ U{1..ceil(L_c / 2)}
    assert (pos[:, 0] == 0).all()  # u_0 = 0


def test_the_pose_preset_matches_the_full_length_child_in_steps_and_tokens_per_step():
    """experiment=context_extension_pose against experiment=context_extension_child: the same optimizer steps,
    schedule and tokens per step, rows of the parent's length whose positions reach the child's."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pelab import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        pose, full, parent = (hydra_compose(config_name="train", overrides=[f"experiment={e}"],
                                            return_hydra_config=True)
                              for e in ("context_extension_pose", "context_extension_child", "context_extension"))
    assert pose.data.seq_len == parent.data.seq_len and pose.extend.pose_length == full.data.seq_len
    assert pose.data.seq_len * pose.data.batch_size == full.data.seq_len * full.data.batch_size
    assert pose.trainer.max_steps == full.trainer.max_steps and pose.optim == full.optim
    assert pose.pe.scaling.factor * pose.data.seq_len == pose.extend.pose_length
    assert pose.hydra.sweeper.params["pe.scaling.type"] == "linear,yarn"


def parent(sweep, pe):
    """The shared sweep's seed-0 run of encoding `pe` (trained at L = 32, 10 steps)."""
    (summary,) = [s for s in summaries(sweep) if s["config"]["pe"]["name"] == pe and s["config"]["seed"] == 0]
    return summary


def test_pose_fine_tuning_trains_on_the_skipped_positions(sweep, tmp_path):
    """extend.pose_length: the same child (seed, batches, parent weights) with PoSE positions sees other distances,
    so its first loss differs (the ALiBi parent: its bias grows with distance, and it uses positions more than the
    sweep's 10-step RoPE). A RoPE child scales relative to its parent's length, and a target at or below the row
    length is refused in one line."""
    from pelab.tasks.train import train
    from pelab.training.extension import extension_parent

    args = [*FAST, "pe=alibi", "logger=csv", f"extend.from={parent(sweep, 'alibi')['output_dir']}",
            "evaluate_after_fit=false", "trainer.max_steps=1", "trainer.val_check_interval=1"]
    plain = train(compose(args, tmp_path / "full"))
    pose = train(compose([*args, "extend.pose_length=256"], tmp_path / "pose"))
    assert plain["status"] == pose["status"] == "ok" and pose["config"]["extend"]["pose_length"] == 256
    # CPU fp32 training is deterministic (a rerun is bit-identical): any difference is the positions'
    assert abs(pose["metrics"]["train/loss"] - plain["metrics"]["train/loss"]) > 1e-5
    with pytest.raises(ConfigError, match="extend.pose_length") as err:
        train(compose([*args, "extend.pose_length=32"], tmp_path / "bad"))
    assert "\n" not in str(err.value)
    cfg = compose([*FAST, "pe=rope", f"extend.from={parent(sweep, 'rope')['output_dir']}", "extend.pose_length=128",
                   "pe.scaling.type=yarn", "pe.scaling.factor=4"], tmp_path / "rope")
    assert extension_parent(cfg)["train_length"] == 32 and cfg.pe.train_length == 32


def test_the_scaling_sweep_runs_every_method_on_the_same_tokens(sweep, tmp_path):
    """eval.py scaling_sweep=[none,rerope,self_extend,string] on one checkpoint: one table, each method's rows; ReRoPE
    with window L - 1 is RoPE at L (every distance <= w) and differs past it; the summary names the parent's text."""
    from pelab.tasks.evaluate import evaluate

    ckpt = f"{parent(sweep, 'rope')['output_dir']}/checkpoints/last.ckpt"
    cfg = compose([f"ckpt_path={ckpt}", "logger=csv", "probes.enabled=false", "eval.lengths=[1,4]", "eval.tokens=256",
                   "pe.scaling.factor=4", "pe.scaling.window=31", "scaling_sweep=[none,rerope,self_extend,string]",
                   "+_overrides_=[pe.scaling.factor,pe.scaling.window]"], tmp_path, config_name="eval")
    summary = evaluate(cfg)
    m = summary["metrics"]
    # the parent's corpus fingerprint: the report pairs these rows with the parent's own runs
    assert summary["data"]["fingerprint"]["key"] == parent(sweep, "rope")["data"]["fingerprint"]["key"]
    assert {r["scaling"] for r in summary["scaling_table"]} == {"none", "rerope", "self_extend", "string"}
    assert m["extrap/rerope/ppl@32"] == pytest.approx(m["extrap/none/ppl@32"], rel=1e-5)
    for kind in ("rerope", "self_extend", "string"):
        assert math.isfinite(m[f"extrap/{kind}/ppl@128"]) and m[f"extrap/{kind}/ppl@128"] != m["extrap/none/ppl@128"]
    paths = summary["attention_paths"]["paths"] if "attention_paths" in summary else None
    assert paths is None or "sdpa_mask" in paths.get("rope", {})  # the content-bias path, recorded
