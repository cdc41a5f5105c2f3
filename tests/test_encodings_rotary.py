"""Rotary schemes (pelab.encodings.rotary): RoPE and its scalings, p-RoPE and xPos, each against its formula;
the scaled frequencies against Hugging Face's are in tests/test_references.py."""

from __future__ import annotations

import math

import pytest
import torch

from encoding_inputs import MICRO, D, Dh, H, rope
from helpers.encodings import rotate
from pelab.encodings import build_encoding
from pelab.encodings.rotary import rope_attention_factor, rope_inv_freq, xpos_zeta
from pelab.model import build_model

# ---- RoPE --------------------------------------------------------------------------------------------------
SCALINGS = [
    {"type": "none"},
    {"type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 4.0},
    {"type": "dynamic_ntk", "factor": 4.0, "train_length": 32},
    {"type": "yarn", "factor": 4.0, "train_length": 32},
]


def _score(pe, q, k, m, n):
    """<rot(q) at m, rot(k) at n> for q, k (Dh,), with positions passed as a 2-token sequence."""
    qq = q.expand(1, 1, 2, -1)
    kk = k.expand(1, 1, 2, -1)
    rq, rk = rotate(pe, qq, kk, torch.tensor([m, n]))
    return (rq[0, 0, 0] * rk[0, 0, 1]).sum()


@pytest.mark.parametrize("scaling", SCALINGS, ids=[s["type"] for s in SCALINGS])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_scores_depend_only_on_relative_position(scaling, fraction):
    torch.manual_seed(0)
    pe = rope(scaling, rotary_fraction=fraction)
    q, k = torch.randn(D // H), torch.randn(D // H)
    for m, n in [(5, 2), (9, 9), (3, 17)]:
        s0 = _score(pe, q, k, m, n)
        for shift in (1, 11, 40):
            if scaling["type"] == "dynamic_ntk":  # the base depends on the length max(pos)+1: keep it fixed
                s_shift = _score(pe, q, k, m + shift, n + shift) if max(m, n) + shift < 32 else s0
            else:
                s_shift = _score(pe, q, k, m + shift, n + shift)
            assert s_shift.item() == pytest.approx(s0.item(), abs=1e-5)
    assert abs(_score(pe, q, k, 5, 2) - _score(pe, q, k, 5, 4)) > 1e-3  # and it does depend on m - n


def test_rope_preserves_norms_and_partial_rotary_passes_channels_through():
    torch.manual_seed(0)
    q, k = torch.randn(2, H, 50, D // H), torch.randn(2, H, 50, D // H)
    pos = torch.arange(100, 150)
    rq, rk = rotate(rope(), q, k, pos)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    half = rope(rotary_fraction=0.5)
    assert half.rotary_dim == (D // H) // 2
    rq, _ = rotate(half, q, k, pos)
    assert torch.equal(rq[..., half.rotary_dim :], q[..., half.rotary_dim :])
    assert not torch.allclose(rq[..., : half.rotary_dim], q[..., : half.rotary_dim])
    # half-split pairing: position 1 turns channel 0 (paired with channel d/2) by theta_0 = 1 rad
    x = torch.zeros(1, 1, 1, D // H)
    x[..., 0] = 1.0
    out, _ = rotate(rope(), x, x, torch.tensor([1]))
    assert out[0, 0, 0, 0].item() == pytest.approx(math.cos(1.0), abs=1e-6)
    assert out[0, 0, 0, (D // H) // 2].item() == pytest.approx(math.sin(1.0), abs=1e-6)


def test_rope_per_batch_positions_match_shared_positions():
    torch.manual_seed(0)
    pe = rope({"type": "yarn", "factor": 2.0, "train_length": 16})
    q, k = torch.randn(2, H, 6, D // H), torch.randn(2, H, 6, D // H)
    pos = torch.stack([torch.arange(6), torch.arange(10, 16)])
    rq, rk = rotate(pe, q, k, pos)
    for b in range(2):
        eq, ek = rotate(pe, q[b : b + 1], k[b : b + 1], pos[b].clone())
        torch.testing.assert_close(rq[b : b + 1], eq)
        torch.testing.assert_close(rk[b : b + 1], ek)


# The scaled frequencies are compared with Hugging Face's in tests/test_references.py.
@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_rope_factor_one_equals_none(kind):
    none = rope_inv_freq(32, 10000.0)
    torch.testing.assert_close(rope_inv_freq(32, 10000.0, kind, 1.0, 128), none, rtol=0, atol=0)
    assert rope_attention_factor(kind, 1.0) == 1.0


def test_rope_module_applies_scaling_and_temperature():
    torch.manual_seed(0)
    q, k = torch.randn(1, H, 40, D // H), torch.randn(1, H, 40, D // H)
    L = 16
    yarn = rope({"type": "yarn", "factor": 4.0, "train_length": L})
    rq, _ = rotate(yarn, q, k, torch.arange(40))
    # cos/sin scaled by 0.1 ln 4 + 1: norms grow by that factor
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1) * (0.1 * math.log(4) + 1))
    # dynamic NTK inside a forward: identical to none for l <= L, different beyond
    none, dyn = rope(), rope({"type": "dynamic_ntk", "factor": 4.0, "train_length": L})
    short = torch.arange(L)
    torch.testing.assert_close(
        rotate(dyn, q[:, :, :L], k[:, :, :L], short)[0],
        rotate(none, q[:, :, :L], k[:, :, :L], short)[0],
        rtol=0,
        atol=0,
    )
    long = torch.arange(40)
    dyn_q = rotate(dyn, q, k, long)[0]
    new_base = 10000.0 * (4.0 * 40 / L - 3.0) ** (8 / 6)
    expected = rotate(build_encoding({"name": "rope", "base": new_base}, D, H), q, k, long)[0]
    torch.testing.assert_close(dyn_q, expected, atol=1e-5, rtol=1e-5)
    # linear scaling divides the frequencies; they are not saved: checkpoints stay scaling-agnostic
    linear = rope({"type": "linear", "factor": 2.0})
    torch.testing.assert_close(linear.inv_freq, rope_inv_freq(D // H, 10000.0).float() / 2)
    assert "inv_freq" not in linear.state_dict()


def test_rope_cos_sin_follow_dtype_casts_without_rounding():
    pe = rope({"type": "linear", "factor": 3.0})
    expected = pe.inv_freq.clone()
    pe.to(torch.bfloat16)
    assert pe.inv_freq.dtype == torch.float32
    torch.testing.assert_close(pe.inv_freq, expected, rtol=0, atol=0)
    q = torch.randn(1, H, 5, D // H, dtype=torch.bfloat16)
    rq, rk = rotate(pe, q, q, torch.arange(5))
    assert rq.dtype == torch.bfloat16 and rk.dtype == torch.bfloat16


def _rotary_reference(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, base: float = 10000.0):
    """The textbook half-split rotation through plain autograd ops: x*cos + rotate_half(x)*sin."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    f = pos.double()[..., None] * inv_freq  # (..., T, d/2)
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    xr, rest = x[..., :rotary_dim].double(), x[..., rotary_dim:].double()
    x1, x2 = xr.chunk(2, dim=-1)
    rot = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rot, rest), dim=-1)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("per_batch", [False, True])
def test_rope_rotation_and_its_gradient_match_the_textbook_formula(fraction, per_batch):
    """RoPE's one-buffer rotation with its inverse-rotation backward equals autograd through the formula."""
    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 20, 16
    pe = build_encoding("rope", H * Dh, H, rotary_fraction=fraction)
    pos = torch.stack([torch.arange(T), torch.arange(7, 7 + T)]) if per_batch else torch.arange(3, 3 + T)
    q, k = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(2))
    rq, rk = rotate(pe, q, k, pos)
    w = torch.randn(B, H, T, Dh)
    gq, gk = torch.autograd.grad((rq * w).sum() + (rk * w.flip(0)).sum(), (q, k))
    eq, ek = _rotary_reference(q, pos, pe.rotary_dim), _rotary_reference(k, pos, pe.rotary_dim)
    fq, fk = torch.autograd.grad((eq * w).sum() + (ek * w.flip(0)).sum(), (q, k))
    torch.testing.assert_close(rq, eq.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk, ek.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gq, fq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gk, fk, atol=1e-5, rtol=1e-5)


def test_rope_rotation_passes_gradcheck_in_float64():
    from pelab.encodings.rotary import apply_rotary

    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    f = torch.rand(5, 3, dtype=torch.float64) * 6
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()  # 6 of 8 channels rotated
    # fp32 math inside (as in training), so compare against finite differences at fp32 precision
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin).double(), (x,), eps=1e-3, atol=1e-3)


# ---- p-RoPE ------------------------------------------------------------------------------------------------
def test_p_rope_drops_the_lowest_frequencies():
    torch.manual_seed(0)
    full = build_encoding({"name": "rope"}, D, H)
    p_rope = build_encoding({"name": "rope", "frequency_fraction": 0.5}, D, H)
    n_pairs = Dh // 2
    assert p_rope.n_frequencies == 2
    torch.testing.assert_close(p_rope.inv_freq[:2], full.inv_freq[:2])  # the highest kept as they were
    assert p_rope.inv_freq[2:].tolist() == [0.0] * (n_pairs - 2)
    q, k = torch.randn(1, H, 5, Dh), torch.randn(1, H, 5, Dh)
    pos = torch.arange(100, 105)
    rq, _ = rotate(p_rope, q, k, pos)
    fq, _ = rotate(full, q, k, pos)
    dropped = [2, 3, 2 + n_pairs, 3 + n_pairs]  # half-split: pair i is channels i and i + Dh/2
    torch.testing.assert_close(rq[..., dropped], q[..., dropped])  # not rotated
    kept = [0, 1, n_pairs, 1 + n_pairs]
    torch.testing.assert_close(rq[..., kept], fq[..., kept])
    nope = build_encoding({"name": "rope", "frequency_fraction": 0.0}, D, H)
    torch.testing.assert_close(rotate(nope, q, k, pos)[0], q)  # p = 0 is NoPE
    with pytest.raises(ValueError, match="frequency_fraction"):
        build_encoding({"name": "rope", "frequency_fraction": 1.5}, D, H)


# ---- xPos --------------------------------------------------------------------------------------------------
def _scores(pe, q, k, pos):
    """(H, T, T) attention logits (without 1/sqrt(Dh)) after the encoding's rotation, for q, k (1, H, T, Dh)."""
    rq, rk = rotate(pe, q, k, pos)
    return (rq @ rk.transpose(-2, -1))[0]


def test_xpos_zeta_matches_paper():
    # zeta_i = (2i/d + 0.4) / 1.4 for d = 8: i = 0..3
    assert xpos_zeta(8).tolist() == pytest.approx([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])


def test_xpos_is_rope_times_zeta_to_the_distance():
    torch.manual_seed(0)
    xpos = build_encoding({"name": "xpos", "scale_base": 8.0}, D, H)
    rope = build_encoding({"name": "rope"}, D, H)
    zeta = xpos_zeta(Dh)
    pos = torch.tensor([3, 10, 30])
    for pair in range(Dh // 2):  # only pair `pair` non-zero: its score is the RoPE one times zeta^((m-n)/sb)
        q = torch.zeros(1, H, 3, Dh)
        k = torch.zeros(1, H, 3, Dh)
        for t in (q, k):
            t[..., pair] = torch.randn(1, H, 3)
            t[..., pair + Dh // 2] = torch.randn(1, H, 3)
        got, ref = _scores(xpos, q, k, pos), _scores(rope, q, k, pos)
        dist = (pos[:, None] - pos[None, :]).double()
        expected = ref.double() * zeta[pair] ** (dist / 8.0)
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


def test_xpos_scores_are_shift_invariant_and_decay():
    torch.manual_seed(0)
    xpos = build_encoding({"name": "xpos"}, D, H)
    q, k = torch.randn(1, H, 6, Dh), torch.randn(1, H, 6, Dh)
    pos = torch.tensor([0, 1, 2, 7, 20, 50])
    s0 = _scores(xpos, q, k, pos)
    for shift in (5, 1000):  # (larger shifts: fp32 angles of RoPE itself lose digits)
        torch.testing.assert_close(_scores(xpos, q, k, pos + shift), s0, rtol=1e-3, atol=1e-3)
    # zeta^(p/512) at p = 10^5 is 1e-107, zeta^(-p/512) overflows fp32: centring keeps both finite
    far = _scores(xpos, q, k, pos + 100_000)
    assert torch.isfinite(far).all() and far.abs().max() < 10 * s0.abs().max()
    # same q and k at every position, rotation off (p-RoPE's p = 0): the score falls with distance
    flat = build_encoding({"name": "xpos", "frequency_fraction": 0.0, "scale_base": 16.0}, D, H)
    v = torch.rand(1, H, 1, Dh).expand(1, H, 6, Dh)
    row = _scores(flat, v, v, torch.arange(6))[0, 5]  # query 5 against keys 0..5
    assert torch.all(row[:-1] < row[1:])


def test_xpos_decay_tables_computed_once_per_forward(monkeypatch):
    from pelab.encodings.rotary import XPos

    calls = []
    original = XPos.decay
    monkeypatch.setattr(XPos, "decay", lambda self, pos: calls.append(1) or original(self, pos))
    model = build_model(MICRO, {"name": "xpos"}, vocab_size=20).eval()
    idx = torch.randint(0, 20, (2, 9))
    out = model(idx)
    assert len(calls) == 1  # shared by both layers
    torch.testing.assert_close(model(idx), out)
    assert len(calls) == 2  # a new forward (new positions tensor) recomputes


@pytest.mark.parametrize("pe", [{"name": "rope", "rotary_fraction": 0.5}, {"name": "xpos"}])
def test_rotation_under_vmap_is_each_models_own(pe):
    """Models stacked over seeds (torch.func: stack_module_state, functional_call, vmap; the GPU plan of
    experiments/gpu/induction_heads.py) rotate as each model alone, forward and backward: the rotation's own vmap
    rule, with its tables batched (xPos's stacked buffers) or not, and a partial rotation's pass-through channels."""
    from torch.func import functional_call, stack_module_state, vmap

    shape = {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_ff": 0, "bias": True}
    models = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        models.append(build_model(shape, pe, 16))
    params, buffers = stack_module_state(models)
    with torch.device("meta"):
        base = build_model(shape, pe, 16)
    x = torch.randint(0, 16, (3, 2, 12))
    out = vmap(lambda p, b, xi: functional_call(base, (p, b), (xi,)))(params, buffers, x)  # (3, 2, 12, 16)
    out.square().sum().backward()
    for i, m in enumerate(models):
        ref = m(x[i])
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-6)
        ref.square().sum().backward()
        for name, p in m.named_parameters():
            torch.testing.assert_close(params[name].grad[i], p.grad, rtol=1e-4, atol=1e-6, msg=name)
