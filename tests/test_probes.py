"""Probe scoring on hand-built logits, lim_gap, n/a lengths, heatmap / U-curve figures (issue 6)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from pelab.data.recall import make_probe_samples
from pelab.data.tokenizer import ByteTokenizer
from pelab.encodings import build_encoding
from pelab.evaluation.plots import plot_depth_curve, plot_probe_heatmap, save_figure
from pelab.evaluation.probes import ProbeCell, ProbeResult, lim_gap, run_probes, score_samples
from pelab.model.gpt import GPT, GPTConfig

TOK = ByteTokenizer()
V = TOK.vocab_size
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


class NextTokenOracle(nn.Module):
    """Hand-built logits: at position t all mass (a 1e4 margin) on the *input* token at t + 1.
    Teacher-forced, that is exactly the gold answer at every answer position. ``spoil_last`` moves the
    mass of the second-to-last position (the last answer token) to a wrong token."""

    def __init__(self, spoil_last: bool = False):
        super().__init__()
        self.spoil_last = spoil_last
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        B, T = idx.shape
        nxt = torch.cat([idx[:, 1:], idx[:, :1]], dim=1)  # (B, T)
        if self.spoil_last:
            nxt[:, T - 2] = (nxt[:, T - 2] + 1) % V
        return torch.zeros(B, T, V).scatter_(2, nxt[..., None], 1e4)


class Uniform(nn.Module):
    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        return torch.zeros(*idx.shape, V)


def micro_gpt(pe: str, **knobs) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, n_layers=1, n_heads=2, d_model=32)
    return GPT(cfg, build_encoding({"name": pe, **knobs}, cfg.d_model, cfg.n_heads))


@pytest.fixture(scope="module")
def samples():
    return [
        s
        for kind in ("kv", "passkey")
        for d in (0.0, 1.0)
        for s in make_probe_samples(kind, TOK, 160, d, 3, 0)
    ]


# ---- scoring on hand-built logits ----------------------------------------------------------------


def test_model_with_all_mass_on_the_answer_scores_one_and_logprob_zero(samples):
    scores = score_samples(NextTokenOracle(), samples, device="cpu", batch_size=4)
    assert len(scores) == len(samples)
    assert all(ok for ok, _ in scores)
    assert all(lp == pytest.approx(0.0, abs=1e-6) for _, lp in scores)


def test_uniform_model_gives_minus_log_vocab(samples):
    scores = score_samples(Uniform(), samples)
    assert all(lp == pytest.approx(-math.log(V), rel=1e-6) for _, lp in scores)
    assert not any(ok for ok, _ in scores)  # argmax of a tie is token 0, never a hex/digit byte


def test_exact_match_needs_every_answer_token(samples):
    scores = score_samples(NextTokenOracle(spoil_last=True), samples)
    assert not any(ok for ok, _ in scores)
    for s, (_, lp) in zip(samples, scores):  # one of A tokens at ~-1e4, the rest at 0
        assert lp == pytest.approx(-1e4 / len(s.answer_ids), rel=1e-3)


def test_scores_do_not_depend_on_batching_and_mode_is_restored(samples):
    model = micro_gpt("alibi").train()
    a = score_samples(model, samples, batch_size=1)
    b = score_samples(model, samples, batch_size=16)
    assert model.training
    assert [x[0] for x in a] == [x[0] for x in b]
    assert [x[1] for x in a] == pytest.approx([x[1] for x in b], rel=1e-5)
    assert all(-20 < lp < 0 for _, lp in a)


# ---- lim_gap -------------------------------------------------------------------------------------


def test_lim_gap_sign_on_constructed_grids():
    u_shape = [0.9, 0.5, 0.3, 0.5, 0.8]  # lost in the middle
    assert lim_gap(DEPTHS, u_shape) == pytest.approx((0.9 + 0.8) / 2 - (0.5 + 0.3 + 0.5) / 3)
    assert lim_gap(DEPTHS, u_shape) > 0
    assert lim_gap(DEPTHS, [0.2, 0.6, 0.9, 0.6, 0.1]) < 0  # middle best
    assert lim_gap(DEPTHS, [0.7] * 5) == pytest.approx(0.0)
    assert lim_gap(list(reversed(DEPTHS)), list(reversed(u_shape))) > 0  # order of depths irrelevant
    assert math.isnan(lim_gap([0.0, 1.0], [1.0, 0.0]))  # no interior depth
    assert math.isnan(lim_gap(DEPTHS, [0.9, float("nan"), 0.3, 0.5, 0.8]))


def test_probe_result_metrics_on_a_u_shaped_grid():
    res = ProbeResult(kinds=["kv"], depths=DEPTHS, lengths=[64, 128], train_len=64)
    for d, a in zip(DEPTHS, [1.0, 0.5, 0.25, 0.5, 1.0]):
        res.cells[("kv", d, 64)] = ProbeCell("kv", d, 64, acc=a, logprob=-a, n=4)
        res.cells[("kv", d, 128)] = ProbeCell("kv", d, 128, acc=0.25, logprob=-2.0, n=4)
    m = res.metrics()
    assert m["probe/kv/lim_gap@64"] == pytest.approx(1.0 - 1.25 / 3) and m["probe/kv/lim_gap@64"] > 0
    assert m["probe/kv/lim_gap@128"] == pytest.approx(0.0)
    assert m["probe/kv/acc@64"] == pytest.approx(0.65) and m["probe/kv/logprob@128"] == pytest.approx(-2.0)
    assert res.grid("kv")[2] == [0.25, 0.25] and res.depth_curve("kv", 64) == [1.0, 0.5, 0.25, 0.5, 1.0]


# ---- run_probes ----------------------------------------------------------------------------------


def test_run_probes_with_the_oracle_fills_every_cell():
    res = run_probes(
        NextTokenOracle(),
        TOK,
        kinds=("kv", "passkey"),
        depths=DEPTHS,
        lengths=[128, 192],
        samples_per_cell=2,
        seed=0,
        train_len=128,
    )
    assert len(res.cells) == 2 * 5 * 2
    m = res.metrics()
    assert set(m) == {
        f"probe/{k}/{s}@{L}"
        for k in ("kv", "passkey")
        for s in ("acc", "logprob", "lim_gap")
        for L in (128, 192)
    }
    for k in ("kv", "passkey"):
        for L in (128, 192):
            assert m[f"probe/{k}/acc@{L}"] == 1.0 and m[f"probe/{k}/lim_gap@{L}"] == 0.0
            assert m[f"probe/{k}/logprob@{L}"] == pytest.approx(0.0, abs=1e-6)
    kv = res.cell("kv", 0.5, 128)
    assert kv.n == 2 and kv.chance == pytest.approx(1 / 4096)  # uniform over 3-hex-char values
    assert 1 / 12 < kv.chance_copy < 1 / 3  # a few pairs in 128 bytes
    assert res.cell("passkey", 0.0, 128).chance == pytest.approx(1 / 45000)
    rows = res.rows("kv")
    assert len(rows) == 10 and {r["kind"] for r in rows} == {"kv"}
    assert {"kind", "depth", "length", "acc", "logprob", "n"} <= set(rows[0])
    json.dumps(res.to_dict())


def test_position_out_of_range_and_too_short_lengths_are_nan_cells_with_notes():
    model = micro_gpt("learned", max_position=128)
    res = run_probes(
        model,
        TOK,
        kinds=("kv", "passkey"),
        depths=[0.0, 0.5, 1.0],
        lengths=[64, 128, 256],
        samples_per_cell=1,
        seed=0,
    )
    m = res.metrics()
    assert math.isfinite(m["probe/kv/acc@64"]) and math.isfinite(m["probe/passkey/logprob@128"])
    for k in ("kv", "passkey"):
        assert math.isnan(m[f"probe/{k}/acc@256"]) and math.isnan(m[f"probe/{k}/logprob@256"])
        assert (
            res.cell(k, 0.5, 256).note.startswith("n/a — ")
            and "positions end at 127" in res.cell(k, 0.5, 256).note
        )
    # a 64-token context cannot hold the byte-level passkey needle: n/a, not an exception
    assert (
        math.isnan(res.cell("passkey", 0.0, 64).acc) and "passkey needs" in res.cell("passkey", 0.0, 64).note
    )
    d = json.loads(json.dumps(res.to_dict()))
    assert d["metrics"]["probe/kv/acc@256"] == "nan"


# ---- figures -------------------------------------------------------------------------------------


def test_heatmap_and_depth_curve_figures_save_non_empty_pngs(tmp_path):
    from matplotlib.figure import Figure

    grid = [[1.0, 0.5, float("nan")], [0.2, 0.0, float("nan")]]
    fig = plot_probe_heatmap(grid, [0.0, 1.0], [64, 128, 256], title="kv", train_len=64)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.images[0].get_cmap().name.startswith("RdYlGn") and ax.images[0].get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts] == ["1.00", "0.50", "n/a", "0.20", "0.00", "n/a"]
    p = save_figure(fig, tmp_path / "sub" / "heat.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000

    fig2 = plot_depth_curve(
        {"rope": [0.9, 0.4, 0.8], "alibi": [0.5, 0.5, 0.5]}, [0.0, 0.5, 1.0], length=64, chance=0.01
    )
    assert isinstance(fig2, Figure) and len(fig2.axes[0].lines) == 3  # two curves + chance
    assert save_figure(fig2, tmp_path / "u.png").stat().st_size > 2000
    with pytest.raises(ValueError, match="grid shape"):
        plot_probe_heatmap([[1.0]], [0.0, 1.0], [64])
