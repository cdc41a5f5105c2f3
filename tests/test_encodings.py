"""Each encoding is exactly the published one: formulas, slopes, buckets, scalings, parameter counts."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from conftest import embed, rotate
from pelab.encodings import (
    PositionEncoding,
    PositionOutOfRange,
    available_encodings,
    build_encoding,
    pe_schema,
)
from pelab.encodings.bias import alibi_slopes
from pelab.encodings.config import PE_CONF_DIR, load_pe_yaml
from pelab.encodings.diagnostics import (
    encoding_report,
    neighbour_cosine,
    plot_neighbour_cosine,
    plot_table_heatmap,
)
from pelab.encodings.rotary import rope_attention_factor, rope_inv_freq
from pelab.errors import ConfigError

D, H = 32, 4


def rope(scaling: dict | None = None, d_model: int = D, n_heads: int = H, train_length: int | None = None,
         **knobs) -> PositionEncoding:
    scaling = dict(scaling or {})
    train_length = scaling.pop("train_length", train_length)  # the test tables keep L with the scaling
    return build_encoding({"name": "rope", "scaling": scaling, **knobs}, d_model, n_heads, train_length)


# ---- configs -----------------------------------------------------------------------------------------
def test_every_yaml_names_an_encoding_class_whose_schema_has_the_same_defaults():
    """The schema dataclass is the one source of defaults: each YAML lists exactly its keys and values."""
    assert len(available_encodings()) >= 11
    for name in available_encodings():
        cfg = load_pe_yaml(name)  # as Hydra composes it: conf/pe/_base.yaml under the file
        assert cfg.name == name
        cls = get_class(cfg._target_)
        assert issubclass(cls, PositionEncoding) and pe_schema(cfg) is cls.Config
        defaults = OmegaConf.to_container(OmegaConf.structured(cls.Config))
        yaml = OmegaConf.to_container(cfg)
        assert {k: v for k, v in yaml.items() if k not in ("_target_", "name")} == {
            k: v for k, v in defaults.items() if k not in ("_target_", "name")}, name


@pytest.mark.parametrize("name", available_encodings())
def test_load_pe_yaml_is_what_hydra_composes(name):
    """Outside Hydra (default_pe_config, report defaults) a YAML reads as Hydra composes it into `pe`: the
    shared keys of conf/pe/_base.yaml under the file's own; `_base` itself is no encoding."""
    from conftest import compose

    assert "_base" not in available_encodings() and (PE_CONF_DIR / "_base.yaml").is_file()
    loaded = OmegaConf.to_container(load_pe_yaml(name))
    assert "defaults" not in loaded and loaded["train_length"] is None
    assert loaded == OmegaConf.to_container(compose([f"pe={name}"]).pe)


@pytest.mark.parametrize("name", available_encodings())
def test_yaml_builds_and_has_expected_shapes(name):
    cfg = load_pe_yaml(name)
    assert cfg.randomized.max_position is None  # every scheme can be randomized; off by default
    pe = build_encoding(cfg, D, H, train_length=64)
    assert type(pe) is get_class(cfg._target_) and pe.name == name
    B, T = 2, 7
    pos = torch.arange(T)
    state = pe.prepare(pos, consecutive=True)
    if pe.has_content_bias:
        q, k = torch.randn(2, H, 7, D // H), torch.randn(2, H, 7, D // H)
        assert pe.content_bias(q[..., 3:, :], k, 3, state).shape == (2, H, 4, 7)
    x = torch.randn(B, T, D)
    assert pe.embed(x, state).shape == (B, T, D)  # sum composition: width unchanged
    q, k = torch.randn(B, H, T, D // H), torch.randn(B, H, T, D // H)
    q2, k2 = pe.rotate(q, k, state)
    assert q2.shape == q.shape and k2.shape == k.shape
    if pe.has_bias:
        assert pe.score_bias(pos, pos).shape == (H, T, T)
        batched = pe.score_bias(pos.expand(B, T), pos.expand(B, T))
        torch.testing.assert_close(batched, pe.score_bias(pos, pos).expand(B, H, T, T))  # per-row = shared
    hooks_changed = [
        not torch.equal(pe.embed(x, state), x),
        not torch.equal(q2, q),
    ]
    assert hooks_changed == [pe.has_embed, pe.has_rotate]


def test_unknown_name_and_knob_are_clear_errors():
    with pytest.raises(ValueError, match="known encodings.*alibi"):
        build_encoding({"name": "ropee"}, D, H)
    with pytest.raises(ValueError, match=r"pe.max_len is not a setting.*max_position"):
        build_encoding({"name": "learned", "max_len": 10}, D, H, train_length=8)
    with pytest.raises(ValueError, match="pe.scaling.type=yarn2"):
        rope({"type": "yarn2"})
    with pytest.raises(ValueError, match="needs pe.train_length"):
        rope({"type": "yarn", "factor": 2.0})  # YaRN needs the training length
    with pytest.raises(ValueError, match="pe.frequency_fraction.*Float"):
        rope(frequency_fraction="abc")  # typed by the schema


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nope", 0),
        ("sinusoidal", 0),
        ("rope", 0),
        ("alibi", 0),
        ("learned", 64 * D),
        ("t5_bias", 32 * H),
        ("xpos", 0),
        ("sandwich", 0),
        ("kerple", 2 * H),  # r1, r2 per head
        ("fire", (1 * 32 + 32) + (32 * H + H) + 2),  # MLP 1 -> 32 -> H, c, L multiplier
        ("cope", 64 * (D // H)),  # max_position x head_dim
    ],
)
def test_num_learnable_params(name, expected):
    knobs = {"learned": {"max_position": 64}, "cope": {"max_position": 64}}.get(name, {})
    pe = build_encoding({"name": name, **knobs}, D, H)
    assert pe.num_learnable_params() == expected
    randomized = build_encoding({"name": name, **knobs, "randomized": {"max_position": 64}}, D, H)
    assert randomized.num_learnable_params() == expected  # randomized positions add nothing


# ---- sinusoidal -----------------------------------------------------------------------------------------
def test_sinusoidal_matches_formula_elementwise():
    pe = build_encoding({"name": "sinusoidal"}, 16, 2)
    positions = [0, 1, 2, 7, 63, 1000, 5000]  # no table: any position works
    table = pe.table(torch.tensor(positions))
    for row, p in enumerate(positions):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-4 + 1e-6 * p)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-4 + 1e-6 * p)
    x = torch.randn(3, len(positions), 16)
    assert pe.scale == 0.02  # default: the token embeddings' init std (see Sinusoidal)
    torch.testing.assert_close(embed(pe, x, torch.tensor(positions)), x + 0.02 * table)
    raw = build_encoding({"name": "sinusoidal", "scale": 1.0}, 16, 2)
    torch.testing.assert_close(embed(raw, x, torch.tensor(positions)), x + table)


def test_sinusoidal_shift_is_a_fixed_rotation():
    """PE(p+k) = M_k PE(p) with M_k block-diagonal 2x2 rotations that do not depend on p."""
    d, k = 16, 5
    pe = build_encoding({"name": "sinusoidal"}, d, 2)
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = k / 10000 ** (2 * i / d)
        # [sin(a+w), cos(a+w)] = [[cos w, sin w], [-sin w, cos w]] @ [sin a, cos a]
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]]
        )
    p = torch.arange(0, 60)
    before, after = pe.table(p).double(), pe.table(p + k).double()
    torch.testing.assert_close(before @ M.T, after, atol=1e-5, rtol=0)
    # and a different shift gives a different map: M_k is specific to k
    assert (pe.table(p + k + 1).double() - before @ M.T).abs().max() > 0.1


# ---- learned --------------------------------------------------------------------------------------------
def test_learned_params_init_and_error_beyond_table():
    pe = build_encoding({"name": "learned", "max_position": 256}, 64, 4)
    assert pe.n_positions == 256
    assert pe.num_learnable_params() == 256 * 64
    assert abs(pe.weight.weight.std().item() - 0.02) < 0.002
    pe.check_positions(torch.arange(256))  # last row exists
    with pytest.raises(PositionOutOfRange, match=r"end at 255 \(pe.max_position=256\); got position 511"):
        pe.check_positions(torch.arange(300, 512))
    with pytest.raises(PositionOutOfRange, match="pe.max_position"):
        pe.check_positions(largest=256)
    assert isinstance(PositionOutOfRange("x"), ValueError)
    # unbounded encodings never complain
    build_encoding({"name": "sinusoidal"}, 64, 4).check_positions(torch.tensor([10**6]))


# ---- RoPE -----------------------------------------------------------------------------------------------
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


# ---- ALiBi ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [8, 12])
def test_alibi_bias_is_minus_slope_times_distance(heads):
    pe = build_encoding({"name": "alibi"}, heads * 8, heads)
    pos = torch.arange(20)
    bias = pe.score_bias(pos, pos)
    slopes = alibi_slopes(heads)
    for h in (0, heads - 1):
        for i, j in [(0, 0), (5, 2), (19, 0), (10, 10)]:
            assert bias[h, i, j].item() == pytest.approx(-slopes[h] * (i - j), rel=1e-6)
    assert pe.num_learnable_params() == 0 and "slopes" not in pe.state_dict()


# ---- T5 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (16, 64), (8, 1000)])
def test_t5_buckets_match_hugging_face(buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    pe = build_encoding({"name": "t5_bias", "num_buckets": buckets, "max_distance": max_distance}, D, H)
    k_pos = torch.arange(1001)
    q_pos = torch.tensor([1000])
    got = pe.buckets(q_pos, k_pos)[0]  # distances 1000 ... 0
    expected = T5Attention._relative_position_bucket(  # HF's causal buckets of k - q
        k_pos[None, :] - q_pos[:, None], bidirectional=False, num_buckets=buckets, max_distance=max_distance)[0]
    assert torch.equal(got, expected)
    assert got.max().item() == buckets - 1
    # the bias is the table row of each bucket, per head, times the bias scale (sqrt(d_head) by default)
    bias = pe.score_bias(q_pos, k_pos)  # (H, 1, 1001)
    torch.testing.assert_close(bias[:, 0], pe.table.weight[expected].t() * math.sqrt(D // H))


def test_t5_future_keys_share_bucket_zero_and_table_is_one_parameter():
    pe = build_encoding({"name": "t5_bias"}, D, H)
    pos = torch.arange(10)
    assert torch.equal(pe.buckets(pos, pos).triu(), torch.zeros(10, 10, dtype=torch.long))
    params = list(pe.parameters())
    assert len(params) == 1 and params[0].shape == (32, H)
    assert abs(params[0].std().item() - D**-0.5) < 0.1


@pytest.mark.parametrize("bias_scale", [1.0, "sqrt_head_dim"])
def test_t5_bias_equals_x_transformers_relative_position_bias(bias_scale):
    """The same table through x-transformers' RelativePositionBias (scale dim_head ** 0.5, causal) and
    through PELab's T5Bias: equal at bias_scale=sqrt_head_dim, and 1/sqrt(d_head) of it at bias_scale=1."""
    xt = pytest.importorskip("x_transformers.x_transformers", reason="x-transformers (the bench extra) is not installed")
    torch.manual_seed(0)
    ref = xt.RelativePositionBias(scale=(D // H) ** 0.5, causal=True, heads=H, num_buckets=32, max_distance=128)
    pe = build_encoding({"name": "t5_bias", "bias_scale": bias_scale}, D, H)
    with torch.no_grad():
        pe.table.weight.copy_(ref.relative_attention_bias.weight)  # (buckets, H) both
    T = 600  # past max_distance: the last, shared bucket too
    pos = torch.arange(T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = ref(T, T)[:, causal] / (1.0 if bias_scale == "sqrt_head_dim" else (D // H) ** 0.5)  # (H, pairs)
    torch.testing.assert_close(pe.score_bias(pos, pos)[:, causal], expected)


def test_t5_bias_scale_reads_numbers_and_names_and_rejects_the_rest():
    assert build_encoding({"name": "t5_bias", "bias_scale": "sqrt_head_dim"}, D, H).bias_scale == math.sqrt(D // H)
    assert build_encoding({"name": "t5_bias", "bias_scale": 2.5}, D, H).bias_scale == 2.5
    for bad in (0, -1.0, "sqrt_model_dim"):
        with pytest.raises(ConfigError, match="pe.bias_scale"):
            build_encoding({"name": "t5_bias", "bias_scale": bad}, D, H)


# ---- diagnostics ----------------------------------------------------------------------------------------
def test_neighbour_cosine_sinusoidal_high_learned_near_zero():
    torch.manual_seed(0)
    sin_table = build_encoding({"name": "sinusoidal"}, 64, 4).diagnostics(128)["table"]
    cos = neighbour_cosine(sin_table)
    assert cos.shape == (127,)
    # PE(p+1) is a fixed rotation of PE(p): the cosine is the same for every p, and high
    assert cos.min() > 0.5 and (cos.max() - cos.min()) < 1e-4
    learned = build_encoding({"name": "learned", "max_position": 128}, 64, 4)
    assert neighbour_cosine(learned.diagnostics(500)["table"]).abs().mean() < 0.15


def test_encoding_report_and_figures(tmp_path):
    from matplotlib.figure import Figure

    rep = encoding_report(build_encoding({"name": "sinusoidal"}, 32, 4), 64, figures=True)
    assert rep["num_learnable_params"] == 0 and rep["max_position"] is None and rep["hooks"] == ["embed"]
    assert rep["neighbour_cosine_min"] > 0.5
    assert set(rep["figures"]) == {"table_heatmap", "neighbour_cosine"}
    for name, fig in rep["figures"].items():
        assert isinstance(fig, Figure)
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    rep = encoding_report(build_encoding({"name": "learned", "max_position": 16}, 32, 4), 64)
    assert rep["num_learnable_params"] == 16 * 32 and rep["max_position"] == 16
    assert "neighbour_cosine_mean" in rep and "figures" not in rep
    rep = encoding_report(build_encoding({"name": "t5_bias"}, 32, 4), 64)
    assert rep["hooks"] == ["score_bias"] and rep["num_learnable_params"] == 32 * 4
    assert "neighbour_cosine_mean" not in rep
    for name in ("alibi", "t5_bias", "kerple", "sandwich", "fire"):
        rep = encoding_report(build_encoding({"name": name}, 32, 4), 64, figures=True)
        assert set(rep["figures"]) == {"bias_by_distance"}, name
    rep = encoding_report(build_encoding({"name": "cope", "max_position": 16}, 32, 4), 64, figures=True)
    assert rep["hooks"] == ["content_bias"] and rep["figures"] == {}
    assert isinstance(plot_table_heatmap(torch.randn(8, 4)), Figure)
    assert isinstance(plot_neighbour_cosine({"a": torch.rand(7), "b": torch.rand(7)}), Figure)
