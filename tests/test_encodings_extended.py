"""The schemes of the extension issue, each against its paper: xPos, KERPLE, Sandwich, FIRE, CoPE, p-RoPE,
randomized positions. Formulas at hand-computed points, causality, shift behaviour, and a few training steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import rotate
from pelab.encodings import build_encoding
from pelab.encodings.base import random_sorted_positions
from pelab.encodings.bias import KERPLE, sandwich_slopes
from pelab.encodings.contextual import cope_positions, interpolate_logits
from pelab.encodings.rotary import xpos_zeta
from pelab.model import build_model

D, H = 32, 4
Dh = D // H
MICRO = {"n_layers": 2, "n_heads": H, "d_model": D, "attn_chunk_size": 512}


def _scores(pe, q, k, pos):
    """(H, T, T) attention logits (without 1/sqrt(Dh)) after the encoding's rotation, for q, k (1, H, T, Dh)."""
    rq, rk = rotate(pe, q, k, pos)
    return (rq @ rk.transpose(-2, -1))[0]


# ---- xPos ---------------------------------------------------------------------------------------------
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


# ---- KERPLE -------------------------------------------------------------------------------------------
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


# ---- Sandwich -----------------------------------------------------------------------------------------
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


# ---- FIRE ---------------------------------------------------------------------------------------------
def test_fire_normalized_distance_matches_paper_at_hand_points():
    pe = build_encoding({"name": "fire"}, D, H)  # c = 0.1, L = 512
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
    pe = build_encoding({"name": "fire"}, D, H)
    pos = torch.arange(50)
    full = pe.score_bias(pos, pos)
    pe.MAX_HIDDEN_ELEMENTS = 7 * 50 * 32  # 7 query rows per block
    torch.testing.assert_close(pe.score_bias(pos, pos), full)
    batched = pe.score_bias(pos.expand(2, 50), pos.expand(2, 50))
    torch.testing.assert_close(batched, full.expand(2, H, 50, 50))


# ---- CoPE ---------------------------------------------------------------------------------------------
def test_cope_positions_are_suffix_sums_of_gates():
    gates = torch.tensor([[0.5, 0.9, 0.2], [0.1, 0.3, 0.7]])  # queries 1, 2 (q0 = 1) against keys 0..2
    pos = cope_positions(torch.logit(gates.double()), q0=1)  # the gates are sigmoid(logits)
    # query 1: key 2 is in the future (gate ignored): p_10 = 0.5 + 0.9, p_11 = 0.9
    assert pos[0].tolist() == pytest.approx([1.4, 0.9, 0.0])
    # query 2: p_20 = 0.1 + 0.3 + 0.7, p_21 = 0.3 + 0.7, p_22 = 0.7
    assert pos[1].tolist() == pytest.approx([1.1, 1.0, 0.7])


def test_cope_interpolates_between_integer_positions():
    logits_int = torch.tensor([[10.0, 20.0, 40.0]])  # q . e[p] for p = 0, 1, 2
    pos = torch.tensor([[1.25, 0.0, 2.0]])
    assert interpolate_logits(logits_int, pos).tolist() == [[25.0, 10.0, 40.0]]  # 0.75*20 + 0.25*40


def test_cope_content_bias_matches_the_paper_loop_and_chunks():
    torch.manual_seed(0)
    pe = build_encoding({"name": "cope", "max_position": 4}, D, H)
    with torch.no_grad():
        pe.pos_emb.normal_()
    T = 9
    q, k = torch.randn(1, H, T, Dh), torch.randn(1, H, T, Dh)
    state = pe.prepare(torch.arange(k.shape[-2]))
    full = pe.content_bias(q, k, 0, state)
    e = pe.pos_emb.t()  # (P, Dh)
    for h in range(H):
        for i in range(T):
            gates = torch.sigmoid(q[0, h, i] @ k[0, h, : i + 1].t() / math.sqrt(Dh))
            for j in range(i + 1):
                p = min(gates[j:].sum().item(), 3.0)  # clamp at npos_max - 1
                lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
                expected = (1 - w) * (q[0, h, i] @ e[lo]) + w * (q[0, h, i] @ e[hi])
                assert full[0, h, i, j].item() == pytest.approx(expected.item(), abs=1e-4)
    # a query chunk q0..q1-1 against keys 0..q1-1 gives the same rows
    torch.testing.assert_close(pe.content_bias(q[..., 4:7, :], k[..., :7, :], 4, state), full[..., 4:7, :7])


# ---- p-RoPE -------------------------------------------------------------------------------------------
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


# ---- randomized positions -----------------------------------------------------------------------------
def test_random_positions_sorted_unique_in_range():
    torch.manual_seed(0)
    pos = random_sorted_positions(300, (64, 128))
    assert pos.shape == (64, 128) and pos.min() >= 0 and pos.max() < 300
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted and distinct
    assert not torch.equal(pos[0], pos[1])  # each row its own draw
    assert pos.max() > 250  # positions reach far past the 128-token input
    with pytest.raises(ValueError, match="max_position=100.*128"):
        random_sorted_positions(100, (128,))


def test_randomized_positions_remap_only_in_training():
    torch.manual_seed(0)
    pe = build_encoding({"name": "rope", "randomized": {"max_position": 4096}}, D, H)
    pos = torch.arange(128)
    pe.train()
    a, b = pe.prepare(pos), pe.prepare(pos)
    assert a.pos.shape == (128,) and not torch.equal(a.pos, b.pos) and a.pos.max() >= 128
    torch.testing.assert_close(a.tables[0][0], pe.cos_sin(a.pos)[0])  # the tables follow the drawn positions
    pe.eval()
    assert pe.prepare(pos).pos is pos  # evaluation: ordinary positions, untouched
    with pytest.raises(ValueError, match=r"pe.randomized.max_len is not a setting"):
        build_encoding({"name": "rope", "randomized": {"max_len": 10}}, D, H)
    with pytest.raises(ValueError, match=r"pe.randomized.max_position=64 must be at least the training length"):
        build_encoding({"name": "rope", "randomized": {"max_position": 64}}, D, H, train_length=128)


def test_randomized_model_trains_on_random_positions_and_evaluates_on_ordinary_ones():
    torch.manual_seed(0)
    # learned table: null max_position follows the largest position training can reach
    model = build_model(MICRO, {"name": "learned", "max_position": None, "randomized": {"max_position": 256}},
                        vocab_size=20, train_length=16)
    assert model.pe.weight.num_embeddings == 256
    plain = build_model(MICRO, {"name": "learned", "max_position": 256}, vocab_size=20, train_length=16)
    plain.load_state_dict(model.state_dict())  # randomized positions add no parameters
    idx = torch.randint(0, 20, (2, 16))
    model.eval()
    plain.eval()
    torch.testing.assert_close(model(idx), plain(idx))  # eval: positions 0..15, as the plain model
    model.train()
    seen = []
    model.pe.embed = lambda x, state: seen.append(state.pos) or x  # record the positions the scheme sees
    model(idx)
    model(idx)
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])
    assert all((p[1:] > p[:-1]).all() and p.max() < 256 for p in seen)


# ---- every new scheme in the model: causal, and a few steps lower the loss ------------------------------
NEW = [
    {"name": "xpos"},
    {"name": "kerple", "variant": "log"},
    {"name": "kerple", "variant": "power"},
    {"name": "sandwich"},
    {"name": "fire"},
    {"name": "cope", "max_position": None},
    {"name": "rope", "frequency_fraction": 0.5},
    {"name": "alibi", "randomized": {"max_position": 512}},
]


@pytest.mark.parametrize("pe_cfg", NEW, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_new_scheme_is_causal_and_learns(pe_cfg):
    torch.manual_seed(0)
    model = build_model(MICRO, dict(pe_cfg), vocab_size=32, train_length=32)
    half = torch.randint(0, 32, (8, 16))
    data = torch.cat([half, half, half[:, :1]], dim=1)  # second half repeats the first: copyable
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses  # ln 32 = 3.47 at the start
    model.eval()
    x = torch.randint(0, 32, (2, 40))
    y = x.clone()
    y[:, 25:] = (y[:, 25:] + 1) % 32
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :25], model(y)[:, :25])  # the future does not leak back
        assert not torch.allclose(model(x)[:, 25:], model(y)[:, 25:])


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
