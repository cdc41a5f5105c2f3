"""Probe scoring (records, batching, answer-only LM head) on hand-built logits and a real GPT, lim_gap,
n/a lengths, heatmap / U-curve figures (issues 6, 16)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import astuple

import pytest
import torch
from torch import nn

from pelab.data.recall import RecallSample, make_probe_samples
from pelab.data.tokenizer import ByteTokenizer
from pelab.encodings import available_encodings, build_encoding
from pelab.evaluation import stats
from pelab.evaluation.plots import plot_depth_curve, plot_probe_heatmap, probe_figures, save_figure
from pelab.evaluation.probes import ProbeCell, ProbeRecord, ProbeResult, lim_gap, run_probes, score_samples
from pelab.evaluation.stats import wilson
from pelab.model import GPT, GPTConfig

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
    assert all(r.correct and r.error == "ok" and r.rank == 1 for r in scores)
    assert all(r.logprob == pytest.approx(0.0, abs=1e-6) for r in scores)


def test_uniform_model_gives_minus_log_vocab(samples):
    scores = score_samples(Uniform(), samples)
    assert all(r.logprob == pytest.approx(-math.log(V), rel=1e-6) for r in scores)
    assert not any(r.correct for r in scores)  # argmax of a tie is token 0, never a hex/digit byte
    assert all(r.pred == 0 and r.error == "not_in_context" and r.rank == 1 for r in scores)  # a tie: rank 1


def test_exact_match_needs_every_answer_token(samples):
    scores = score_samples(NextTokenOracle(spoil_last=True), samples)
    assert not any(r.correct for r in scores)
    for s, r in zip(samples, scores):  # one of A tokens at ~-1e4, the rest at 0
        assert r.logprob == pytest.approx(-1e4 / len(s.answer_ids), rel=1e-3)
        # the first token is right, a later one wrong: not a value of the context
        assert r.pred == s.answer_ids[0] and r.error == "not_in_context"


def mqar_like(seed: int, length: int = 96, n_pairs: int = 6, vocab: int = V) -> list[RecallSample]:
    """Hand-built single-token recall samples with candidates, one per depth of DEPTHS (the same instance
    at every depth): keys 200..219 and values 220..239 in random filler 0..199, pairs at evenly spaced
    slots, the gold pair at slot round(depth * (n_pairs - 1)), then the gold key; the answer is its value."""
    rng = random.Random(seed)
    keys, values = rng.sample(range(200, 220), n_pairs), rng.sample(range(220, 240), n_pairs)
    h = length - 2  # haystack; then the query key and the answer
    filler = [rng.randrange(200) for _ in range(h - 2 * n_pairs)]
    slots = [round(j * (len(filler)) / (n_pairs - 1)) for j in range(n_pairs)]
    out = []
    for depth in DEPTHS:
        g = round(depth * (n_pairs - 1))
        order = [j for j in range(1, n_pairs)]
        order.insert(g, 0)  # pair 0 is the gold; the distractors keep their order
        ids, cand, cand_depth, at = [], [], [], 0
        for slot, j in zip(slots, order):
            ids += filler[at:slot] + [keys[j], values[j]]
            at = slot
            cand.append(values[j])
            cand_depth.append((len(ids) - 1) / (h - 1))
        ids += filler[at:] + [keys[0]]
        gold_index = ids.index(values[0])
        out.append(RecallSample(ids, [values[0]], gold_index, depth, length, "mqar_like", n_pairs, 20,
                                cand, cand_depth, len(ids) - gold_index))
        assert len(ids) + 1 == length
    return out


class Constant(nn.Module):
    """All mass on one token at every position (a model that always answers ``token``)."""

    def __init__(self, token: int):
        super().__init__()
        self.token = token
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        out = torch.zeros(*idx.shape, V)
        out[..., self.token] = 30.0
        return out


def same(a: ProbeRecord, b: ProbeRecord) -> bool:
    """Field by field, bit for bit (NaN equal to NaN)."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(astuple(a), astuple(b)))


def test_error_kinds_rank_and_the_depth_of_the_wrongly_picked_value():
    s = mqar_like(0)
    gold, at_depth = s[0].answer_ids[0], s[2]  # the gold at depth 0.5
    other = at_depth.candidates[-1]  # the value nearest to the query
    r = score_samples(Constant(other), [at_depth])[0]
    assert (r.correct, r.pred, r.error, r.rank) == (False, other, "other_in_context", 2)
    assert r.error_depth == at_depth.candidate_depths[-1] and r.error_depth > 0.9
    r = score_samples(Constant(7), [at_depth])[0]  # a filler token: not a value of the context
    assert (r.error, r.rank, r.pred) == ("not_in_context", 1, 7) and math.isnan(r.error_depth)
    r = score_samples(Constant(gold), [at_depth])[0]
    assert (r.correct, r.error, r.rank) == (True, "ok", 1) and r.logprob == pytest.approx(0.0, abs=1e-3)
    # the gold's candidate depth follows the depth of the sample (the paired design moves only the gold)
    for smp in s:
        assert smp.candidate_depths[smp.candidates.index(gold)] == pytest.approx(smp.depth, abs=0.1)


def test_batched_scoring_equals_one_at_a_time_exactly_and_restores_the_mode(samples):
    """CPU fp32: every field of every record is bit-identical, whatever the batch (mixed lengths, kinds)."""
    mixed = samples + [x for seed in range(4) for x in mqar_like(seed)]
    for pe in ("rope", "alibi"):
        model = micro_gpt(pe).train()
        one = [score_samples(model, [x])[0] for x in mixed]
        batched = score_samples(model, mixed, batch_size=16)
        assert model.training
        assert all(same(a, b) for a, b in zip(one, batched))
        assert len({r.pred for r in one}) > 1 and len({r.rank for r in one}) > 1  # not a degenerate model
        assert all(-20 < r.logprob < 0 for r in one)


class Whole(nn.Module):
    """A GPT behind a module without ``hidden``: scored through its whole forward (every row, every block)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx, pos=None, start=0):
        return self.gpt(idx)


def test_only_the_answer_positions_go_through_the_lm_head(samples):
    model = micro_gpt("rope")
    seen: list[tuple] = []
    model.lm_head.register_forward_hook(lambda m, inp, out: seen.append(tuple(inp[0].shape)))
    records = score_samples(model, samples, batch_size=64)
    n_answer = sum(len(s.answer_ids) for s in samples)
    # one forward (all 12 samples have 160 tokens): the answer rows, zero-padded to a multiple of 8,
    # not 12 x 160
    assert len(seen) == 1 and seen[0][1] == 32 and n_answer <= seen[0][0] < n_answer + 8
    # and it is the full forward's logits at those positions: same records from a module without `hidden`
    assert all(same(a, b) for a, b in zip(records, score_samples(Whole(model), samples, batch_size=64)))


@pytest.mark.parametrize(("pe", "logit_scale"), [(pe, "none") for pe in available_encodings()]
                         + [("alibi", "log_length"), ("cope", "log_length")])
def test_records_through_the_last_rows_only_equal_the_whole_forward_for_every_encoding(pe, logit_scale, samples):
    """A 2-layer GPT trained on 128 tokens scores probes of 96 and 160 tokens (within and past its length;
    log_length: explicit, scaled logits past it): the last block runs on the last 8 rows of each sample,
    and every record equals the one from the whole forward, bit for bit."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, n_layers=2, n_heads=2, d_model=32, train_length=128,
                    attn_logit_scale=logit_scale)
    knobs = {"max_position": 256} if pe == "learned" else {}  # a table past the 160-token probes
    model = GPT(cfg, build_encoding({"name": pe, **knobs}, cfg.d_model, cfg.n_heads, train_length=128))
    if pe == "cope":  # its position table starts at zero: no position signal, and nothing to get wrong
        torch.nn.init.normal_(model.pe.pos_emb)
    rows = []
    model.blocks[-1].mlp.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[1]))
    mixed = samples + [x for seed in range(2) for x in mqar_like(seed)]
    pruned = score_samples(model, mixed, batch_size=16)
    assert rows == [8, 8]  # one forward per length (96, 160), the last block on 8 rows of each
    whole = score_samples(Whole(model), mixed, batch_size=16)
    assert all(same(a, b) for a, b in zip(pruned, whole))
    assert len({r.pred for r in pruned}) > 1 and all(-20 < r.logprob < 0 for r in pruned)


def test_a_trained_looking_gpt_scores_through_hidden_like_forward():
    model = micro_gpt("rope").eval()
    x = torch.randint(0, V, (3, 40))
    with torch.no_grad():
        h = model.hidden(x)
        assert h.shape == (3, 40, 32)
        assert torch.equal(model.lm_head(h).float(), model(x))


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
    """4 paired instances: at 64 tokens all retrieved at the edges, fewer in the middle; at 128 one in 4."""
    res = ProbeResult(kinds=["kv"], depths=DEPTHS, lengths=[64, 128], train_length=64)
    for d, bits in zip(DEPTHS, ["1111", "1100", "1000", "1100", "1111"]):
        a = bits.count("1") / 4
        res.cells[("kv", d, 64)] = ProbeCell("kv", d, 64, acc=a, logprob=-a, n=4, outcomes=bits)
        res.cells[("kv", d, 128)] = ProbeCell("kv", d, 128, acc=0.25, logprob=-2.0, n=4, outcomes="0010")
    m = res.metrics()
    gap = 1.0 - 1.25 / 3  # = the mean of the per-instance gaps 0, 1/3, 1, 1
    assert m["probe/kv/lim_gap@64"] == pytest.approx(gap) and m["probe/kv/lim_gap@64"] > 0
    assert m["probe/kv/lim_gap_lo@64"] < gap < m["probe/kv/lim_gap_hi@64"] <= 1.0
    assert m["probe/kv/lim_gap_lo@64"] >= 0.0  # no instance has a negative gap
    assert m["probe/kv/lim_gap@128"] == pytest.approx(0.0)
    # every instance has gap 0: the interval is bounded by the instances that could differ, not a point
    assert m["probe/kv/lim_gap_lo@128"] == -m["probe/kv/lim_gap_hi@128"] == pytest.approx(-wilson(0, 4)[1])
    assert m["probe/kv/acc@64"] == pytest.approx(0.65) and m["probe/kv/logprob@128"] == pytest.approx(-2.0)
    assert m["probe/kv/acc_lo@64"] < 0.65 < m["probe/kv/acc_hi@64"]
    assert res.grid("kv")[2] == [0.25, 0.25] and res.depth_curve("kv", 64) == [1.0, 0.5, 0.25, 0.5, 1.0]
    assert m["probe/kv/effective_length"] == 0.0  # no length at >= 0.9
    assert m["probe/kv/auc"] == pytest.approx((0.65 + 0.25) / 2)  # log2 lengths 0 and 1
    # every cell n/a (e.g. a kind too long for every length): not measured, not "zero retrieval"
    empty = ProbeResult(kinds=["kv"], depths=DEPTHS, lengths=[64], train_length=64)
    empty.cells.update({("kv", d, 64): ProbeCell("kv", d, 64, note="n/a") for d in DEPTHS})
    assert all(math.isnan(v) for v in empty.metrics().values())


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
        train_length=128,
    )
    assert len(res.cells) == 2 * 5 * 2
    m = res.metrics()
    names = ("acc", "acc_lo", "acc_hi", "logprob", "lim_gap", "lim_gap_lo", "lim_gap_hi", "rank",
             "other_in_context", "not_in_context")
    assert set(m) == {f"probe/{k}/{s}@{L}" for k in ("kv", "passkey") for s in names for L in (128, 192)} | {
        f"probe/{k}/{s}" for k in ("kv", "passkey") for s in ("effective_length", "auc")}
    assert m["probe/kv/effective_length"] == 192 and m["probe/kv/auc"] == 1.0
    for k in ("kv", "passkey"):
        for L in (128, 192):
            assert m[f"probe/{k}/acc@{L}"] == 1.0 and m[f"probe/{k}/lim_gap@{L}"] == 0.0
            assert m[f"probe/{k}/logprob@{L}"] == pytest.approx(0.0, abs=1e-6)
    kv = res.cell("kv", 0.5, 128)
    assert kv.n == 2 and kv.chance == pytest.approx(1 / 4096)  # uniform over 3-hex-char values
    assert 1 / 12 < kv.chance_copy < 1 / 3  # a few pairs in 128 bytes
    assert kv.outcomes == "11" and kv.lo == pytest.approx(stats.wilson(2, 2)[0]) and kv.hi == 1.0
    assert res.cell("passkey", 0.0, 128).chance == pytest.approx(1 / 45000)
    assert math.isnan(res.copy("passkey"))  # one value in context: no copy baseline
    rows = res.rows("kv")
    assert len(rows) == 10 and {r["kind"] for r in rows} == {"kv"}
    fields = {"kind", "depth", "length", "acc", "lo", "hi", "logprob", "n", "rank", "other", "outcomes"}
    assert fields <= set(rows[0])
    d = json.loads(json.dumps(res.to_dict()))
    assert [r["outcomes"] for r in d["rows"]] == ["11"] * 20


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
    fig = plot_probe_heatmap(grid, [0.0, 1.0], [64, 128, 256], title="kv", train_length=64)
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


def test_depth_curves_have_interval_bands_and_both_baselines(tmp_path):
    fig = plot_depth_curve({"128": [0.9, 0.4, 0.8]}, [0.0, 0.5, 1.0], chance=1 / 64, copy=1 / 8,
                           bands={"128": ([0.7, 0.2, 0.6], [0.97, 0.6, 0.9])})
    ax = fig.axes[0]
    (band,) = ax.collections  # one shaded interval
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.2) and ys.max() == pytest.approx(0.97)
    labels = sorted(line.get_label() for line in ax.lines)
    assert labels == ["128", "chance 0.016", "copy a random value 0.12"]


def test_probe_figures_of_a_run(tmp_path):
    res = run_probes(NextTokenOracle(), TOK, kinds=("kv", "passkey"), depths=DEPTHS, lengths=[128, 256],
                     samples_per_cell=3, seed=0, train_length=128)
    figs = probe_figures(res, "oracle")
    assert set(figs) == {f"probe_{k}_{f}" for k in ("kv", "passkey") for f in ("heatmap", "depth", "length")}
    depth_ax = figs["probe_kv_depth"].axes[0]
    assert len(depth_ax.collections) == 2  # a Wilson band per length
    labels = [line.get_label() for line in depth_ax.lines]
    assert labels[:2] == ["128 tokens (train)", "256 tokens"] and any(x.startswith("copy") for x in labels)
    passkey = [line.get_label() for line in figs["probe_passkey_depth"].axes[0].lines]
    assert not any(x.startswith("copy") for x in passkey)
    for name, fig in figs.items():
        assert save_figure(fig, tmp_path / f"{name}.png").stat().st_size > 2000
