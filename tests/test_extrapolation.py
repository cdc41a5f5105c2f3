"""Length-extrapolation evaluation: protocols, token sets, spread blocks and their intervals, n/a lengths,
overflow, metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pelab.encodings import build_encoding
from pelab.evaluation.config import resolve_lengths
from pelab.evaluation.extrapolation import (
    ExtrapolationResult,
    blocks_for_budget,
    evaluate_extrapolation,
    spread_blocks,
    window_plan,
)
from pelab.model import GPT, GPTConfig

V = 257
TRAIN_LEN = 16


def micro_gpt(pe: str = "rope", **knobs) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, n_layers=2, n_heads=2, d_model=32)
    return GPT(cfg, build_encoding({"name": pe, **knobs}, cfg.d_model, cfg.n_heads))


def span(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n + 1,), generator=g)


class WrongAndSure(nn.Module):
    """All logit mass (1000 nats of margin) on a token that is never the target: NLL ~ 1000 > 709."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        logits = torch.zeros(*idx.shape, V)
        logits[..., V - 1] = 1000.0
        return logits


# ---- lengths, budget, window plans ---------------------------------------------------------------


def test_resolve_lengths_multiples_and_absolute():
    assert resolve_lengths([1, 2, 4, 8, 16], 128) == [128, 256, 512, 1024, 2048]
    # <= 64: multiple (fractions allowed); > 64: absolute; sorted and unique
    assert resolve_lengths([300, 0.5, 1, 2, 256], 128) == [64, 128, 256, 300]
    assert resolve_lengths([64, 65], 10) == [65, 640]
    with pytest.raises(ValueError, match="absolute token"):
        resolve_lengths([100.5], 128)
    with pytest.raises(ValueError, match="positive"):
        resolve_lengths([0], 128)


def test_token_budget_is_whole_blocks_of_the_longest_length():
    assert blocks_for_budget(1000, 512) == 2 and blocks_for_budget(1024, 512) == 2
    assert blocks_for_budget(10, 512) == 1  # at least one block
    assert blocks_for_budget(None, 512) is None  # the whole split


def test_spread_blocks_are_disjoint_seeded_and_cover_the_split_when_asked():
    stream = torch.arange(1000)
    blocks, starts = spread_blocks(stream, 9, 20, seed=3)  # slots of 9 tokens: 111 of them
    assert blocks.shape == (20, 10) and (starts % 9 == 0).all() and (starts[1:] > starts[:-1]).all()
    assert torch.equal(blocks[:, 0], torch.as_tensor(starts)) and torch.equal(blocks[:, 9] - blocks[:, 0],
                                                                              torch.full((20,), 9))
    assert starts.max() > 500 and starts.min() < 500  # spread, not the first 200 tokens
    again, _ = spread_blocks(stream, 9, 20, seed=3)
    other, _ = spread_blocks(stream, 9, 20, seed=4)
    assert torch.equal(again, blocks) and not torch.equal(other, blocks)  # the seed fixes them
    whole, starts = spread_blocks(stream, 9, None, seed=3)  # the whole split: one contiguous stream
    assert whole.shape == (111, 10) and torch.equal(whole[:, :-1].flatten(), stream[:999])
    assert torch.equal(whole[:-1, -1], whole[1:, 0])  # a block's last target is the next one's first input
    assert spread_blocks(stream, 9, 10**6, seed=0)[0].shape == (111, 10)
    with pytest.raises(ValueError, match="fewer than one block"):
        spread_blocks(torch.arange(5), 9, 1, seed=0)


@pytest.mark.parametrize(
    "n,length,stride",
    [(64, 16, None), (64, 16, 4), (64, 16, 1), (70, 16, 5), (64, 64, 16), (50, 16, None), (8, 16, 4)],
)
def test_window_plan_scores_every_token_exactly_once(n, length, stride):
    plan = window_plan(n, length, stride)
    scored = [t for w in plan for t in range(w.score_from, w.end)]
    assert scored == list(range(n))  # identity and count, in order
    s = length if stride is None else min(stride, length)
    for w in plan:
        assert 0 <= w.start <= w.score_from < w.end <= n and w.length <= length
        if w.score_from > 0:  # every later window re-encodes exactly L - S context tokens
            assert w.score_from - w.start == length - s


def test_sliding_plan_with_stride_equal_to_length_is_nonoverlap():
    for n, L in [(64, 16), (70, 16), (10, 16)]:
        assert window_plan(n, L, L) == window_plan(n, L, None) == window_plan(n, L, 10 * L)


# ---- numbers from the real model ----------------------------------------------------------------


def test_nonoverlap_ppl_at_train_length_equals_direct_mean_nll():
    model = micro_gpt("rope").eval()
    n = 4 * TRAIN_LEN
    tokens = span(n)
    res = evaluate_extrapolation(
        model, tokens, [TRAIN_LEN], TRAIN_LEN, protocols=("nonoverlap",), batch_size=3
    )
    # reference: the same windows, one forward each, mean cross-entropy (what val/ppl computes)
    windows = tokens[:n].view(-1, TRAIN_LEN)
    targets = tokens[1 : n + 1].view(-1, TRAIN_LEN)
    with torch.no_grad():
        logits = model(windows)
    ref_nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    cell = res.cell(TRAIN_LEN, "nonoverlap")
    assert cell.n_tokens == n
    assert cell.nll == pytest.approx(ref_nll, rel=1e-6)
    assert res.metrics()[f"extrap/ppl@{TRAIN_LEN}"] == pytest.approx(math.exp(ref_nll), rel=1e-6)
    assert res.metrics()[f"extrap/ppl_ratio@{TRAIN_LEN}"] == pytest.approx(1.0)


def test_sliding_with_stride_equal_length_equals_nonoverlap_at_every_length():
    model = micro_gpt("alibi")
    lengths = [16, 32, 64]
    res = evaluate_extrapolation(model, span(128), lengths, TRAIN_LEN, stride=64, batch_size=2)
    for L in lengths:
        a, b = res.cell(L, "nonoverlap"), res.cell(L, "sliding")
        assert b.stride == L
        assert a.n_tokens == b.n_tokens == 128
        assert b.nll_sum == pytest.approx(a.nll_sum, rel=1e-6)


def test_sliding_stride_one_matches_per_token_reference():
    """S = 1: every token t sees exactly the L - 1 tokens before it (fewer at the start of the span)."""
    model = micro_gpt("sinusoidal").eval()
    n, L = 40, 16
    tokens = span(n, seed=3)
    res = evaluate_extrapolation(
        model, tokens, [L], TRAIN_LEN, stride=1, protocols=("sliding",), batch_size=7
    )
    ref = 0.0
    with torch.no_grad():
        for t in range(n):
            ctx = tokens[max(0, t - L + 1) : t + 1][None]  # (1, <=L)
            ref += F.cross_entropy(model(ctx)[0, -1:], tokens[t + 1 : t + 2], reduction="sum").item()
    cell = res.cell(L, "sliding")
    assert cell.n_tokens == n
    assert cell.nll_sum == pytest.approx(ref, rel=1e-5)
    # and it differs from nonoverlap (more context per token), so the protocol matters
    res2 = evaluate_extrapolation(model, tokens, [L], TRAIN_LEN, protocols=("nonoverlap",))
    assert abs(res2.cell(L).nll_sum - cell.nll_sum) > 1e-3


def test_same_token_count_at_every_length_and_protocol_and_batching_invariance():
    model = micro_gpt("t5_bias")
    lengths = resolve_lengths([1, 2, 4], TRAIN_LEN)
    n = blocks_for_budget(100, max(lengths)) * max(lengths)
    tokens = span(n)
    a = evaluate_extrapolation(model, tokens, lengths, TRAIN_LEN, batch_size=64)
    b = evaluate_extrapolation(model, tokens, lengths, TRAIN_LEN, batch_size=64, batch_tokens=TRAIN_LEN)
    assert {c.n_tokens for c in a.cells.values()} == {n}
    for key, c in a.cells.items():  # batch size does not change the numbers
        assert b.cells[key].nll_sum == pytest.approx(c.nll_sum, rel=1e-5)


def test_loss_by_position_is_the_mean_over_longest_windows():
    model = micro_gpt("rope").eval()
    L, n = 32, 96
    tokens = span(n, seed=1)
    res = evaluate_extrapolation(model, tokens, [16, L], TRAIN_LEN, protocols=("nonoverlap",))
    assert res.loss_by_position_length == L and len(res.loss_by_position) == L
    with torch.no_grad():
        logits = model(tokens[:n].view(-1, L))
    ref = F.cross_entropy(logits.transpose(1, 2), tokens[1 : n + 1].view(-1, L), reduction="none").mean(0)
    assert torch.allclose(torch.tensor(res.loss_by_position, dtype=torch.float64), ref.double(), rtol=1e-5)
    # the per-position mean is consistent with the total
    assert sum(res.loss_by_position) / L == pytest.approx(res.cell(L).nll, rel=1e-5)


def test_learned_past_its_table_is_nan_with_note_not_an_exception():
    model = micro_gpt("learned", max_position=TRAIN_LEN)
    res = evaluate_extrapolation(model, span(64), [16, 32, 64], TRAIN_LEN, bytes_per_token=1.0)
    m = res.metrics()
    assert math.isfinite(m["extrap/ppl@16"]) and math.isfinite(m["extrap/ppl_sliding@16"])
    for L in (32, 64):
        for key in (f"extrap/ppl@{L}", f"extrap/ppl_sliding@{L}", f"extrap/bpb@{L}", f"extrap/ppl_ratio@{L}"):
            assert math.isnan(m[key]), key
        for p in ("nonoverlap", "sliding"):
            note = res.cell(L, p).note
            assert note.startswith("n/a — ") and "positions end at 15" in note
    assert res.loss_by_position_length == 16  # the longest length that could be evaluated
    rows = {(r["length"], r["protocol"]): r for r in res.rows()}
    assert rows[(64, "nonoverlap")]["note"].startswith("n/a") and rows[(16, "nonoverlap")]["note"] == ""
    json.dumps(res.to_dict())  # NaN -> "nan": still valid JSON


def test_overflowing_nll_gives_inf_not_a_crash():
    res = evaluate_extrapolation(
        WrongAndSure(), torch.zeros(33, dtype=torch.long), [16, 32], 16, bytes_per_token=2.0
    )
    m = res.metrics()
    assert res.cell(16).nll == pytest.approx(1000.0, rel=1e-4)
    assert m["extrap/ppl@16"] == math.inf and m["extrap/ppl_sliding@32"] == math.inf
    assert m["extrap/bpb@16"] == pytest.approx(1000.0 / math.log(2) / 2.0, rel=1e-4)
    d = res.to_dict()
    assert d["metrics"]["extrap/ppl@16"] == "inf"
    assert d["metrics"]["extrap/ppl_ratio@32"] == "nan"  # inf / inf: undefined
    assert json.loads(json.dumps(d))["rows"][0]["ppl"] == "inf"


def test_metrics_names_bpb_and_restored_train_mode():
    model = micro_gpt("nope")
    model.train()
    res = evaluate_extrapolation(
        model, span(64), [1 * TRAIN_LEN, 2 * TRAIN_LEN], TRAIN_LEN, bytes_per_token=3.5
    )
    assert model.training  # mode restored
    assert isinstance(res, ExtrapolationResult)
    m = res.metrics()
    names = ("ppl", "ppl_lo", "ppl_hi", "ppl_sliding", "ppl_sliding_lo", "ppl_sliding_hi", "bpb", "ppl_ratio",
             "ppl_ratio_lo", "ppl_ratio_hi")
    assert set(m) == {f"extrap/{k}@{L}" for k in names for L in (16, 32)}
    cell = res.cell(32)
    assert m["extrap/bpb@32"] == pytest.approx(cell.nll / math.log(2) / 3.5)
    assert m["extrap/ppl_ratio@32"] == pytest.approx(m["extrap/ppl@32"] / m["extrap/ppl@16"])
    # no bytes_per_token: no bpb metric
    res2 = evaluate_extrapolation(model, span(64), [16], TRAIN_LEN)
    assert not any(k.startswith("extrap/bpb") for k in res2.metrics())
    assert set(res.rows()[0]) == {"length", "protocol", "ppl", "ppl_lo", "ppl_hi", "se", "bpb", "nll", "n_tokens", "note"}


def test_train_length_is_always_evaluated_for_the_ratio():
    res = evaluate_extrapolation(micro_gpt("alibi"), span(64), [32], TRAIN_LEN, protocols=("nonoverlap",))
    assert res.lengths == [16, 32]
    assert math.isfinite(res.metrics()["extrap/ppl_ratio@32"])


def test_unknown_protocol_is_a_clear_error():
    with pytest.raises(ValueError, match="eval.protocols"):
        evaluate_extrapolation(micro_gpt("nope"), span(32), [16], 16, protocols=("strided",))


# ---- figures ---------------------------------------------------------------------------------------


def test_ppl_and_loss_by_position_figures(tmp_path):
    from matplotlib.figure import Figure

    from pelab.evaluation.plots import plot_loss_by_position, plot_ppl_vs_length, save_figure

    res = evaluate_extrapolation(
        micro_gpt("rope"), span(64), [16, 32, 64], TRAIN_LEN, protocols=("nonoverlap",)
    )
    curves = {"rope": res.ppl_by_length(), "learned": {16: 250.0, 32: float("nan"), 64: math.inf}}
    fig = plot_ppl_vs_length(curves, TRAIN_LEN)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    data_lines = [ln for ln in ax.lines if ln.get_label() in curves]
    assert [len(ln.get_xdata()) for ln in data_lines] == [3, 1]  # NaN / inf points skipped
    assert any(list(ln.get_xdata()) == [TRAIN_LEN, TRAIN_LEN] for ln in ax.lines)  # train length marked
    p = save_figure(fig, tmp_path / "ppl.png")
    assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 2000

    fig2 = plot_loss_by_position(
        {"rope": res.loss_by_position, "empty": [float("nan")] * 4}, TRAIN_LEN, smooth=4
    )
    assert isinstance(fig2, Figure)
    assert save_figure(fig2, tmp_path / "pos.png").stat().st_size > 2000


# ---- spread blocks: the estimate and its interval ------------------------------------------------------


class CopyPrevious(nn.Module):
    """Predicts that each token repeats the one before it (logit 5): cheap text where tokens repeat, costly
    where they do not -- documents of different difficulty for a test."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        return F.one_hot(idx, V).float() * 5.0


def two_halves(n: int = 160_000, seed: int = 0) -> torch.Tensor:
    """A split whose first half repeats each token four times (easy for CopyPrevious) and whose second half is
    random (hard)."""
    g = torch.Generator().manual_seed(seed)
    easy = torch.randint(0, V, (n // 8,), generator=g).repeat_interleave(4)
    return torch.cat([easy, torch.randint(0, V, (n // 2,), generator=g)])


def test_spread_estimate_matches_the_whole_split_where_the_first_tokens_do_not():
    """The first 8 blocks all come from the easy documents; 8 blocks spread over the split do not, and the whole
    split's perplexity lies inside the spread estimate's interval. Intervals shrink as the budget grows. (A bare
    stream, no document ids: the bootstrap over blocks; intervals clustered by document are
    tests/test_clustered_intervals.py's.)"""
    model, stream, block = CopyPrevious(), two_halves(), 256
    whole = evaluate_extrapolation(model, spread_blocks(stream, block, None, 0)[0], [block], block,
                                   protocols=("nonoverlap",)).ppl(block)
    first = evaluate_extrapolation(model, stream[: 8 * block + 1], [block], block, protocols=("nonoverlap",))
    assert first.ppl(block) < 0.6 * whole  # the first tokens are the easy document
    widths = []
    for k in (8, 64, 512):
        res = evaluate_extrapolation(model, spread_blocks(stream, block, k, 0)[0], [block], block,
                                     protocols=("nonoverlap",))
        lo, hi = res.cell(block).interval()
        assert res.blocks == k and lo <= whole <= hi, (k, lo, whole, hi)
        widths.append(math.log(hi / lo))
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] / widths[2] == pytest.approx(math.sqrt(8), rel=0.3)  # ~ 1 / sqrt(blocks)


def test_blocks_are_scored_like_single_spans_and_paired_across_lengths():
    model = micro_gpt("alibi")
    blocks, _ = spread_blocks(span(4000, seed=2), 64, 6, seed=1)
    res = evaluate_extrapolation(model, blocks, [16, 32, 64], TRAIN_LEN, batch_size=5, protocols=("nonoverlap",))
    for L in (16, 32, 64):
        one = [evaluate_extrapolation(model, b, [L], TRAIN_LEN, protocols=("nonoverlap",)).cell(L).nll_sum
               for b in blocks]
        assert res.cell(L).block_nll == pytest.approx(one, rel=1e-5) and res.cell(L).n_tokens == 6 * 64
    m = res.metrics()
    for L in (16, 32, 64):
        assert m[f"extrap/ppl_lo@{L}"] < m[f"extrap/ppl@{L}"] < m[f"extrap/ppl_hi@{L}"]
    assert m[f"extrap/ppl_ratio@{TRAIN_LEN}"] == 1.0 and math.isnan(m[f"extrap/ppl_ratio_lo@{TRAIN_LEN}"])
    assert m["extrap/ppl_ratio_lo@64"] < m["extrap/ppl_ratio@64"] < m["extrap/ppl_ratio_hi@64"]
    one_block = evaluate_extrapolation(model, blocks[0], [TRAIN_LEN], TRAIN_LEN).metrics()
    assert math.isnan(one_block[f"extrap/ppl_lo@{TRAIN_LEN}"])  # one block: no interval, never a point
