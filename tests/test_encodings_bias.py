"""Score-bias schemes (pelab.encodings.bias): ALiBi, T5, KERPLE, Sandwich and FIRE, each against its paper at
hand-computed points, against independent implementations where one exists, and in its invariances."""

from __future__ import annotations

import math

import pytest
import torch

from encoding_inputs import D, H
from pelab.encodings import build_encoding, resolve_pe_config
from pelab.encodings.bias import KERPLE, alibi_slopes, sandwich_slopes
from pelab.errors import ConfigError


# ---- ALiBi -------------------------------------------------------------------------------------------------
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


# ---- T5 ----------------------------------------------------------------------------------------------------
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


# ---- KERPLE ------------------------------------------------------------------------------------------------
def _kerple(variant: str, r1: list[float], r2: list[float]) -> KERPLE:
    pe = build_encoding({"name": "kerple", "variant": variant}, D, 2)
    with torch.no_grad():  # set the learned r1, r2 through their positive parametrisation
        pe.r1_raw.copy_(torch.log(torch.expm1(torch.tensor(r1))))
        if variant == "log":
            pe.r2_raw.copy_(torch.log(torch.expm1(torch.tensor(r2))))
        else:
            pe.r2_raw.copy_(torch.logit(torch.tensor(r2) / 2))
    return pe


def test_kerple_log_and_power_match_paper_at_hand_points():
    n = torch.arange(5)
    log = _kerple("log", [2.0, 1.0], [0.5, 3.0]).score_bias(n[-1:], n)[:, 0].flip(-1)  # distance 0..4
    # -r1 log(1 + r2 n): head 0 at n=1: -2 ln 1.5 = -0.81093; n=3: -2 ln 2.5 = -1.83258; head 1 n=2: -ln 7
    assert log[0, [0, 1, 3]].tolist() == pytest.approx([0.0, -0.810930, -1.832581], abs=1e-5)
    assert log[1, 2].item() == pytest.approx(-math.log(7.0), abs=1e-5)
    power = _kerple("power", [0.5, 2.0], [1.5, 0.5]).score_bias(n[-1:], n)[:, 0].flip(-1)
    # -r1 n^r2: head 0 at n=4: -0.5 * 8 = -4; head 1 at n=4: -2 * 2 = -4; n=1: -0.5, -2
    assert power[:, 4].tolist() == pytest.approx([-4.0, -4.0], abs=1e-5)
    assert power[:, 1].tolist() == pytest.approx([-0.5, -2.0], abs=1e-5)
    assert power[:, 0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_is_shift_invariant_and_decreasing(variant):
    torch.manual_seed(0)
    pe = build_encoding({"name": "kerple", "variant": variant}, D, H)
    pos = torch.arange(40)
    bias = pe.score_bias(pos, pos)
    torch.testing.assert_close(pe.score_bias(pos + 777, pos + 777), bias)
    row = bias[:, -1].flip(-1)  # (H, 40): distance 0..39 from the last query
    assert (row[:, 1:] < row[:, :-1]).all()  # a kernel: more distant keys are penalised more


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_parameters_stay_positive_and_gradients_finite(variant):
    torch.manual_seed(0)
    pe = build_encoding({"name": "kerple", "variant": variant}, D, H)
    assert pe.r1().min() > 0 and pe.r2().min() > 0
    if variant == "power":
        assert pe.r2().max() <= 2.0
    # steps of size ~1 against r1 and r2 (init in (0, 2)): an unconstrained r would turn negative
    opt = torch.optim.Adam(pe.parameters(), lr=1.0)
    pos = torch.arange(16)
    for _ in range(4):
        opt.zero_grad()
        (-pe.score_bias(pos, pos).tril().sum()).backward()  # minimised by shrinking r1 (and r2)
        assert all(torch.isfinite(p.grad).all() for p in pe.parameters())  # incl. n**r2 at n = 0
        opt.step()
        assert pe.r1().min() > 0 and pe.r2().min() > 0
    assert pe.r1().max() < 0.2  # the steps did push r1 towards 0 (init up to 2)
    with pytest.raises(ValueError, match="pe.variant.*log.*power"):
        build_encoding({"name": "kerple", "variant": "exp"}, D, H)


# ---- Sandwich ----------------------------------------------------------------------------------------------
def test_sandwich_matches_paper_at_hand_points():
    pe = build_encoding({"name": "sandwich", "dim": 4}, D, 2)
    # d' = 4: w_1 = 10000^(-1/2) = 0.01, w_2 = 1e-4. distance 100: cos(1) + cos(0.01) - 2 = -0.4597479
    # per-head ratio H/(8h): h=1 -> 0.25, h=2 -> 0.125
    assert sandwich_slopes(2) == [0.25, 0.125]
    bias = pe.score_bias(torch.tensor([100]), torch.tensor([0, 100]))[:, 0]  # (H, 2)
    base = math.cos(1.0) + math.cos(0.01) - 2.0
    assert bias[:, 0].tolist() == pytest.approx([0.25 * base, 0.125 * base], abs=1e-6)
    assert bias[:, 1].tolist() == [0.0, 0.0]  # distance 0: p_m . p_m - d'/2 = 0


def test_sandwich_is_non_positive_and_shift_invariant():
    pe = build_encoding({"name": "sandwich"}, D, H)
    pos = torch.arange(64)
    bias = pe.score_bias(pos, pos)
    assert (bias.tril() <= 1e-5).all()
    torch.testing.assert_close(pe.score_bias(pos + 500, pos + 500), bias, atol=1e-4, rtol=0)


# ---- FIRE --------------------------------------------------------------------------------------------------
def test_fire_normalized_distance_matches_paper_at_hand_points():
    pe = build_encoding({"name": "fire", "init_L": 512.0}, D, H)  # c = 0.1, L = 512
    x = pe.normalized_distance(torch.tensor([10, 1000]), torch.tensor([0, 990]))
    # i=10 < L: psi(10)/psi(512) = ln 2 / ln 52.2;  i=1000 > L: psi(1000)/psi(1000) = 1, psi(10)/psi(1000)
    assert x[0, 0].item() == pytest.approx(math.log(2.0) / math.log(52.2), rel=1e-5)
    assert x[1, 0].item() == pytest.approx(1.0, rel=1e-5)
    assert x[1, 1].item() == pytest.approx(math.log(2.0) / math.log(101.0), rel=1e-5)
    # the bias is the MLP of that value, per head
    bias = pe.score_bias(torch.tensor([10, 1000]), torch.tensor([0, 990]))
    torch.testing.assert_close(bias, pe.mlp(x[..., None]).permute(2, 0, 1))


def test_fire_shift_invariant_below_threshold_interpolates_beyond():
    torch.manual_seed(0)
    pe = build_encoding({"name": "fire", "init_L": 64.0}, D, H)
    pos = torch.arange(16)
    b0 = pe.score_bias(pos, pos)
    torch.testing.assert_close(pe.score_bias(pos + 40, pos + 40), b0)  # i < L: only i - j matters
    assert not torch.allclose(pe.score_bias(pos + 400, pos + 400), b0)  # i > L: normalised by psi(i)
    long = torch.arange(4096)
    x = pe.normalized_distance(long, long).tril()
    assert x.min() >= 0 and x.max() <= 1.0 + 1e-6  # any length maps into the trained range [0, 1]


def test_fire_blocked_mlp_equals_one_block():
    torch.manual_seed(0)
    pe = build_encoding({"name": "fire", "init_L": 512.0}, D, H)
    pos = torch.arange(50)
    full = pe.score_bias(pos, pos)
    pe.MAX_HIDDEN_ELEMENTS = 7 * 50 * 32  # 7 query rows per block
    torch.testing.assert_close(pe.score_bias(pos, pos), full)
    batched = pe.score_bias(pos.expand(2, 50), pos.expand(2, 50))
    torch.testing.assert_close(batched, full.expand(2, H, 50, 50))


def test_fire_threshold_init_is_the_training_length_unless_set():
    """pe.init_L null (the default) means the training length, like every setting that means it: FIRE's
    threshold L starts at the length the model trains on; an explicit pe.init_L (or pe.train_length) wins."""
    assert build_encoding("fire", D, H, train_length=128).init_L.item() == 128.0
    assert resolve_pe_config("fire", d_model=D, n_heads=H, train_length=128)["init_L"] == 128.0  # summary
    assert build_encoding({"name": "fire", "init_L": 512}, D, H, train_length=128).init_L.item() == 512.0
    assert build_encoding({"name": "fire", "train_length": 64}, D, H, train_length=128).init_L.item() == 64.0
    with pytest.raises(ConfigError, match=r"pe.init_L=null .*set pe.init_L or pe.train_length"):
        build_encoding("fire", D, H)  # built on its own: no training length to fill it from
