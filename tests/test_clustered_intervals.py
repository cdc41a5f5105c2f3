"""Perplexity intervals clustered by document (issue 49): the cluster bootstrap of a ratio estimator
(pelab.evaluation.stats), which document a block belongs to and blocks drawn to cover every document
(pelab.evaluation.blocks), the evaluation's record (block_docs, n_documents, design_effect) and the report's
rebuild of a committed run's documents (pelab.report.eval_text)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pelab.evaluation import stats
from pelab.evaluation.blocks import allot, block_documents, slots_by_document, uniform_slots
from pelab.evaluation.extrapolation import ExtrapolationCell, ExtrapolationResult, spread_blocks

# ---- the cluster bootstrap ---------------------------------------------------------------------------------


def documents(n_docs: int, blocks: np.ndarray | int, between: float, within: float, seed: int = 0, tokens: int = 100):
    """Blocks of ``n_docs`` documents: document d has a per-token NLL level mu_d ~ N(2, between), each of its blocks
    mu_d + N(0, within) per token; ``blocks`` per document (one count or one per document). Returns (block_nll,
    block_docs): summed NLL of ``tokens`` scored tokens per block and each block's document."""
    rng = np.random.default_rng(seed)
    docs = np.repeat(np.arange(n_docs), blocks)
    level = 2.0 + rng.normal(0.0, between, n_docs)
    return (level[docs] + rng.normal(0.0, within, docs.size)) * tokens, docs


def linearised_variance(num: np.ndarray, den: np.ndarray) -> float:
    """The textbook variance of a ratio estimator sum(num) / sum(den) from n independent units (Cochran 1977,
    eq. 6.9): n / (n - 1) sum (num_i - r den_i)^2 / (sum den)^2."""
    r = num.sum() / den.sum()
    return num.size / (num.size - 1) * float(np.sum((num - r * den) ** 2)) / den.sum() ** 2


def test_one_block_per_document_is_the_block_bootstrap():
    """Each block its own document: the cluster bootstrap is the bootstrap over blocks (same seed, same draws),
    to rounding, and the design effect is exactly 1."""
    nll, _ = documents(30, 5, between=0.5, within=0.1)
    c = stats.clustered_ppl_interval(nll, 100, np.arange(nll.size))
    lo, hi = stats.mean_interval(nll / 100)
    assert c.estimate == pytest.approx(math.exp(nll.sum() / (100 * nll.size)), rel=1e-12)
    assert (c.lo, c.hi) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-12)
    assert c.n_documents == nll.size and c.design_effect == 1.0


def test_clustered_interval_matches_a_direct_document_bootstrap():
    """Documents of unequal length (1..30 blocks): the interval is that of a plain numpy loop resampling documents
    and recomputing exp(sum NLL / sum tokens) -- a ratio estimator, not the mean of document means."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 31, 25)
    nll, docs = documents(25, sizes, between=0.3, within=0.05)
    c = stats.clustered_ppl_interval(nll, 100, docs, n_resamples=4000)
    A, T = np.bincount(docs, weights=nll), 100.0 * sizes
    draws = [A[i].sum() / T[i].sum() for i in (rng.integers(0, 25, 25) for _ in range(8000))]
    lo, hi = np.exp(np.quantile(draws, [0.025, 0.975]))
    width = math.log(hi / lo)
    assert abs(math.log(c.lo / lo)) < 0.08 * width and abs(math.log(c.hi / hi)) < 0.08 * width
    assert c.estimate == pytest.approx(math.exp(A.sum() / T.sum()), rel=1e-12)
    assert c.estimate != pytest.approx(math.exp(np.mean(A / T)), rel=1e-3)  # the mean of means differs
    assert c.n_documents == 25 and c.label.endswith("over 25 documents (approximate below 50)")


def test_design_effect_and_width_follow_the_textbook_ratio_estimator():
    """200 documents of 8 blocks, blocks of a document strongly alike: the design effect is the textbook ratio of
    linearised variances (clustered over independent blocks; Kish's 1 + (m - 1) rho, ~8 here), and the clustered
    interval is wider than the bootstrap over blocks by about its square root."""
    nll, docs = documents(200, 8, between=0.4, within=0.05)
    c = stats.clustered_ppl_interval(nll, 100, docs)
    tokens = np.full(nll.size, 100.0)
    textbook = (linearised_variance(np.bincount(docs, weights=nll), np.bincount(docs, weights=tokens))
                / linearised_variance(nll, tokens))
    assert 6 < textbook < 8.5
    assert c.design_effect == pytest.approx(textbook, rel=0.15)
    lo, hi = stats.mean_interval(nll / 100)
    ratio = math.log(c.hi / c.lo) / (hi - lo)
    assert ratio == pytest.approx(math.sqrt(c.design_effect), rel=0.15)
    assert c.label == "95% percentile bootstrap over 200 documents"  # not approximate from 50 on


def test_clustered_interval_covers_at_the_nominal_rate_where_the_block_bootstrap_does_not():
    """Simulated studies: each draws 60 documents (levels ~ N(2, 0.3)) of 10 blocks; the true perplexity is
    exp(2). The cluster bootstrap covers it in about 95% of studies, the bootstrap over blocks in far fewer."""
    clustered = blocks = 0
    runs = 200
    for seed in range(runs):
        nll, docs = documents(60, 10, between=0.3, within=0.1, seed=seed)
        c = stats.clustered_ppl_interval(nll, 100, docs, seed=seed, n_resamples=1000)
        lo, hi = stats.mean_interval(nll / 100, seed=seed, n_resamples=1000)
        clustered += c.lo <= math.exp(2.0) <= c.hi
        blocks += math.exp(lo) <= math.exp(2.0) <= math.exp(hi)
    assert 0.88 <= clustered / runs <= 0.99
    assert blocks / runs < 0.6


def test_ratio_is_paired_over_the_same_documents():
    """ppl@L / ppl@base from the same resampled documents: when every block is worse by the same factor the
    ratio is that factor with no uncertainty, however different the documents are; otherwise the ratio interval
    is around the ratio of the point estimates."""
    base, docs = documents(20, 6, between=0.5, within=0.1)
    c = stats.clustered_ppl_interval(base + 0.25 * 100, 100, docs, base_nll=base)
    assert (c.estimate, c.lo, c.hi) == pytest.approx((math.exp(0.25),) * 3, rel=1e-12)
    longer = base * 1.1
    r = stats.clustered_ppl_interval(longer, 100, docs, base_nll=base)
    ppl_l, ppl_b = (stats.clustered_ppl_interval(x, 100, docs).estimate for x in (longer, base))
    assert r.estimate == pytest.approx(ppl_l / ppl_b, rel=1e-12) and r.lo < r.estimate < r.hi


def test_fewer_than_two_documents_or_a_non_finite_nll_gives_no_interval():
    one = stats.clustered_ppl_interval([100.0, 120.0, 90.0], 50, [3, 3, 3])
    assert one.n_documents == 1 and math.isnan(one.lo) and math.isnan(one.hi) and one.estimate > 1
    inf = stats.clustered_ppl_interval([100.0, float("inf")], 50, [0, 1])
    assert math.isnan(inf.estimate) and math.isnan(inf.lo)
    same = stats.clustered_ppl_interval([100.0, 200.0], [50, 100], [0, 1])  # both documents at 2 nats per token
    assert same.lo == same.hi == same.estimate == pytest.approx(math.exp(2.0))


# ---- blocks and documents ----------------------------------------------------------------------------------


def test_a_block_belongs_to_the_document_holding_most_of_its_scored_tokens():
    doc_starts = np.array([0, 10, 13, 30, 40])  # documents [0, 10), [10, 13), [13, 30), [30, 40)
    # a block of 8 scored tokens starting at s scores targets s + 1 .. s + 8
    assert block_documents(np.array([0]), 8, doc_starts).tolist() == [0]  # targets 1..8: all document 0
    assert block_documents(np.array([9]), 8, doc_starts).tolist() == [2]  # input 9 is document 0's; targets 10..17
    assert block_documents(np.array([5]), 8, doc_starts).tolist() == [0]  # 4 in doc 0, 3 in doc 1, 1 in doc 2
    assert block_documents(np.array([7]), 8, doc_starts).tolist() == [1]  # 2, 3, 3: a tie -> the earlier of 1, 2
    assert block_documents(np.array([22, 31]), 8, doc_starts).tolist() == [2, 3]  # 23..30: 7 in doc 2, 1 in 3


def test_allot_gives_every_document_a_block_then_the_rest_in_proportion():
    rng = np.random.default_rng(0)
    for _ in range(200):
        capacity = rng.integers(1, 50, rng.integers(1, 30))
        k = int(rng.integers(1, capacity.sum() + 1))
        out = allot(capacity, k, np.random.default_rng(1))
        assert out.sum() == k and (out <= capacity).all()
        if k >= capacity.size:
            assert (out >= 1).all()
            share = 1 + (k - capacity.size) * (capacity - 1) / max((capacity - 1).sum(), 1)
            assert np.abs(out - share).max() < 1  # the largest-remainder rounding of the proportional share
        else:
            assert set(np.unique(out)) <= {0, 1}


def test_blocks_drawn_by_document_cover_every_document_disjoint_and_seeded():
    """A split of one long document and 19 short ones: the uniform draw takes most blocks from the long one and
    misses short ones; the draw by document covers every document that owns a slot (all but the last, whose 60
    tokens straddle the last slot's end), disjoint, in stream order, fixed by the seed."""
    lengths = np.array([2000] + [60] * 19)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])
    n, block = int(doc_starts[-1]), 50
    owners = set(block_documents(np.arange((n - 1) // block) * block, block, doc_starts).tolist())
    assert owners == set(range(19))
    by_doc = slots_by_document(n, block, 24, seed=3, doc_starts=doc_starts)
    assert by_doc.size == 24 and (np.diff(by_doc) >= block).all() and (by_doc % block == 0).all()
    assert set(block_documents(by_doc, block, doc_starts).tolist()) == owners
    assert np.array_equal(by_doc, slots_by_document(n, block, 24, seed=3, doc_starts=doc_starts))
    assert not np.array_equal(by_doc, slots_by_document(n, block, 24, seed=4, doc_starts=doc_starts))
    uniform = uniform_slots(n, block, 24, seed=3)
    assert len(set(block_documents(uniform, block, doc_starts).tolist())) < 15
    # fewer blocks than documents: each block from another document
    few = block_documents(slots_by_document(n, block, 8, seed=0, doc_starts=doc_starts), block, doc_starts)
    assert len(set(few.tolist())) == 8
    # the whole split: every slot, as before
    assert np.array_equal(slots_by_document(n, block, None, 0, doc_starts), uniform_slots(n, block, None, 0))


def test_spread_blocks_keeps_the_old_draw_without_document_starts():
    """Runs before issue 49 drew slots uniformly (spread_blocks without doc_starts): that draw is unchanged, so
    their blocks can be rebuilt; with doc_starts the tokens are gathered at the stratified starts."""
    stream = torch.arange(1000)
    _, starts = spread_blocks(stream, 9, 20, seed=3)
    expected = np.sort(np.random.default_rng(3).choice(111, 20, replace=False)) * 9  # the draw before, verbatim
    assert np.array_equal(starts, expected) and np.array_equal(uniform_slots(1000, 9, 20, 3), expected)
    doc_starts = np.array([0, 300, 310, 700, 1000])
    new, new_starts = spread_blocks(stream, 9, 20, seed=3, doc_starts=doc_starts)
    assert np.array_equal(new_starts, slots_by_document(1000, 9, 20, 3, doc_starts))
    assert torch.equal(new[:, 0], torch.as_tensor(new_starts)) and new.shape == (20, 10)


# ---- the evaluation's record --------------------------------------------------------------------------------


def result_with(nll_by_length: dict[int, np.ndarray], docs: np.ndarray | None,
                per_block: int = 100) -> ExtrapolationResult:
    """An evaluation result holding the given per-block NLL (nonoverlap; the shortest length is the training
    length), with ``docs`` as its blocks' documents (None: a bare stream)."""
    k = len(next(iter(nll_by_length.values())))
    res = ExtrapolationResult(train_length=min(nll_by_length), lengths=sorted(nll_by_length),
                              protocols=("nonoverlap",), stride=min(nll_by_length), n_tokens=per_block * k, blocks=k)
    for L, nll in nll_by_length.items():
        res.cells[(L, "nonoverlap")] = ExtrapolationCell(L, "nonoverlap", L, float(nll.sum()), per_block * k,
                                                         block_nll=nll.tolist())
    res.block_docs = None if docs is None else docs.tolist()
    return res


def test_metrics_carry_the_clustered_intervals_and_the_point_estimates_do_not_move():
    base, docs = documents(12, 6, between=0.4, within=0.05)
    nll = {16: base, 64: base * 1.2}
    clustered, plain = result_with(nll, docs).metrics(), result_with(nll, None).metrics()
    for L in (16, 64):
        assert clustered[f"extrap/ppl@{L}"] == plain[f"extrap/ppl@{L}"]  # the estimate is the interval's business
        c = stats.clustered_ppl_interval(nll[L], 100, docs)
        assert (clustered[f"extrap/ppl_lo@{L}"], clustered[f"extrap/ppl_hi@{L}"]) == (c.lo, c.hi)
        assert clustered[f"extrap/ppl_hi@{L}"] - clustered[f"extrap/ppl_lo@{L}"] > (
            1.5 * (plain[f"extrap/ppl_hi@{L}"] - plain[f"extrap/ppl_lo@{L}"]))
    r = stats.clustered_ppl_interval(nll[64], 100, docs, base_nll=nll[16])
    assert (clustered["extrap/ppl_ratio_lo@64"], clustered["extrap/ppl_ratio_hi@64"]) == (r.lo, r.hi)
    assert clustered["extrap/ppl_ratio@64"] == plain["extrap/ppl_ratio@64"]


def test_summary_records_block_documents_count_design_effect_and_label():
    base, docs = documents(12, 6, between=0.4, within=0.05)
    d = result_with({16: base, 64: base * 1.2}, docs).to_dict()
    assert d["block_docs"] == docs.tolist() and d["n_documents"] == 12
    assert d["interval"] == "95% percentile bootstrap over 12 documents (approximate below 50)"
    assert set(d["design_effect"]) == {"nonoverlap@16", "nonoverlap@64", "ratio@64"}
    assert d["design_effect"]["nonoverlap@16"] == stats.clustered_ppl_interval(base, 100, docs).design_effect > 3
    json.dumps(d)  # plain JSON
    bare = result_with({16: base}, None).to_dict()
    assert bare["interval"] == "95% percentile bootstrap over blocks" and bare["block_docs"] is None
    assert bare["design_effect"] == {}


def test_a_real_evaluation_records_every_blocks_document(tmp_path):
    """A micro model evaluated by the suite on a folder of 60 documents (30% test): the blocks cover every test
    document that can own one, summary.json holds block_docs, n_documents and design effects, and the metrics'
    intervals are the clustered ones recomputed from the recorded block NLL."""
    from helpers.texts import text_dir_config, words_dir
    from pelab.evaluation.suite import run_evaluation
    from pelab.model import build_model
    from pelab.runs.build import build_datamodule

    folder = words_dir(tmp_path / "docs", 60, 1500)
    cfg = text_dir_config(folder, tmp_path / "cache", tmp_path / "out", "data.test_fraction=0.3",
                          "eval.tokens=4096", "eval.protocols=[nonoverlap]", "probes.enabled=false")
    dm = build_datamodule(cfg, 8)
    dm.setup("validate")
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.pe, dm.vocab_size, int(cfg.data.seq_len))
    summary: dict = {}
    metrics = run_evaluation(model, dm, cfg, tmp_path / "out", summary=summary)
    e = summary["evaluation"]["extrapolation"]
    doc_starts = dm.document_starts("test")
    n_split = doc_starts.size - 1
    assert e["split_documents"] == n_split >= 10
    assert len(e["block_docs"]) == e["blocks"] == 64 and e["n_documents"] == len(set(e["block_docs"]))
    owners = set(block_documents(np.arange((doc_starts[-1] - 1) // 64) * 64, 64, doc_starts).tolist())
    assert set(e["block_docs"]) == owners  # every document that owns a slot has a block
    for L in (32, 64):
        c = stats.clustered_ppl_interval(e["block_nll"][f"nonoverlap@{L}"], 64, e["block_docs"])
        assert (metrics[f"extrap/ppl_lo@{L}"], metrics[f"extrap/ppl_hi@{L}"]) == (c.lo, c.hi)
        assert metrics[f"extrap/ppl@{L}"] == pytest.approx(c.estimate, rel=1e-9)
        assert e["design_effect"][f"nonoverlap@{L}"] == c.design_effect
    assert e["interval"] == stats.cluster_label(e["n_documents"])


# ---- committed runs: the documents rebuilt ---------------------------------------------------------------------


def test_report_rebuilds_the_documents_of_a_run_made_before_and_says_when_it_cannot(tmp_path):
    """A run recorded with the old uniform draw and no block_docs: the report rebuilds its blocks' documents from
    the recorded draw and the token cache of the same corpus, and clusters; a run on a corpus this machine does
    not have keeps its bootstrap over blocks, labelled with why."""
    from omegaconf import OmegaConf

    from helpers.texts import text_dir_config, words_dir
    from pelab.report.discovery import Job
    from pelab.report.eval_text import clustered_ppl, clustered_ratio, run_interval
    from pelab.runs.build import build_datamodule

    folder = words_dir(tmp_path / "docs", 60, 1500)
    cfg = text_dir_config(folder, tmp_path / "cache", tmp_path / "out", "data.test_fraction=0.3")
    dm = build_datamodule(cfg, 8)
    dm.setup("validate")
    doc_starts = dm.document_starts("test")
    block, k, seed = 64, 40, 7
    docs = block_documents(uniform_slots(int(doc_starts[-1]), block, k, seed), block, doc_starts)
    rng = np.random.default_rng(0)
    level = rng.normal(3.0, 0.5, doc_starts.size)
    nll = {L: (level[docs] * (1 + L / 256) + rng.normal(0, 0.05, k)) * block for L in (32, 64)}
    extrap = {"train_length": 32, "lengths": [32, 64], "blocks": k, "seed": seed, "split": "test",
              "n_tokens": k * block, "block_nll": {f"nonoverlap@{L}": v.tolist() for L, v in nll.items()}}
    config = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("data", "tokenizer")}
    summary = {"config": config, "data": {"fingerprint": dm.fingerprint},
               "evaluation": {"extrapolation": extrap},
               "metrics": {"extrap/ppl@64": 9.0, "extrap/ppl_lo@64": 8.9, "extrap/ppl_hi@64": 9.1}}
    job = Job(tmp_path, "ok", summary)
    got = clustered_ppl(job, cache_dir=str(tmp_path / "cache"))
    for L in (32, 64):
        assert got[L] == stats.clustered_ppl_interval(nll[L], block, docs)
        assert got[L].n_documents == len(set(docs.tolist()))
    ratio = clustered_ratio(job, cache_dir=str(tmp_path / "cache"))
    assert list(ratio) == [64] and ratio[64] == stats.clustered_ppl_interval(nll[64], block, docs, base_nll=nll[32])
    # one table cell: the metric's own interval, none for what it does not cover
    cache = str(tmp_path / "cache")
    assert run_interval(job, "extrap/ppl@64", cache) == got[64]
    assert run_interval(job, "extrap/ppl_ratio@64", cache) == ratio[64]
    assert run_interval(job, "extrap/ppl_ratio@32", cache) is None  # the training length: 1 by definition
    assert run_interval(job, "extrap/ppl_sliding@64", cache) is None and run_interval(job, "val/ppl", cache) is None

    elsewhere = json.loads(json.dumps(summary))
    elsewhere["data"]["fingerprint"]["key"] = "0123456789abcdef"  # made on a corpus this machine does not build
    fallback = clustered_ppl(Job(tmp_path, "ok", elsewhere), cache_dir=str(tmp_path / "cache"))[64]
    assert (fallback.estimate, fallback.lo, fallback.hi, fallback.n_documents) == (9.0, 8.9, 9.1, 0)
    assert fallback.label.startswith("95% percentile bootstrap over 40 blocks (not clustered by document: ")
    assert "not the run's" in fallback.label and math.isnan(fallback.design_effect)


def test_the_report_shows_a_runs_perplexity_with_its_document_clustered_interval(tmp_path):
    """One seed's cell in the report's perplexity tables is the interval over documents, recomputed from the
    recorded block NLL and documents (not the block interval a run may carry), and the Runs table says how many
    documents and the design effect."""
    from pelab import report
    from pelab.summary import write_summary

    base, docs = documents(12, 6, between=0.4, within=0.05)
    res = result_with({16: base, 64: base * 1.2}, docs)
    metrics = {**res.metrics(), "extrap/ppl_lo@64": 1.0, "extrap/ppl_hi@64": 1e9}  # a stale block interval
    write_summary(tmp_path / "run", {
        "status": "ok", "metrics": metrics, "evaluation": {"extrapolation": res.to_dict()},
        "config": {"pe": {"name": "rope"}, "model": {"name": "tiny"}, "data": {"seq_len": 16}, "seed": 0}})
    md = report.build_report([tmp_path / "run"], tmp_path / "out").markdown
    c = stats.clustered_ppl_interval(base * 1.2, 100, docs)
    assert f"{c.estimate:.2f} [{c.lo:.2f}, {c.hi:.2f}]" in md and "[1.00, 1000000000" not in md
    deff = stats.clustered_ppl_interval(base * 1.2, 100, docs).design_effect
    assert f"| 12 (deff {deff:.3g} at 64) |" in md
