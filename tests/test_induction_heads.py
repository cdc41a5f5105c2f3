"""Issue 51: the induction-heads task of Mamba's Table 11 (Gu & Dao 2023, App. E.1) and its attention-only model.

The generator is checked against an independent reimplementation of HazyResearch/safari's
`generate_induction_head` (src/dataloaders/synthetics.py: string tokens, one sequence at a time, the numpy calls in
safari's order), not against a copy of pelab's vectorised code: both must draw the same distribution. The model's
parameter count is checked against a count written out from the architecture (the issue's 136,960, "137K")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from helpers.runs import compose, summary_of
from pelab.data.batch import IGNORE_INDEX
from pelab.data.recall import make_probe_samples
from pelab.data.recall.induction import INDUCTION_HEADS, VOCABULARY, InductionVocabulary, induction_rows
from pelab.data.recall.induction_data import InductionDataModule
from pelab.data.tokenizer import ByteTokenizer
from pelab.errors import ConfigError, RecallLengthError
from pelab.model import GPTConfig, build_model


# -- an independent reimplementation of safari's generator semantics ---------------------------------------------
def safari_induction_head(L: int, rng: np.random.Generator) -> list[str]:
    """safari's generate_induction_head with induction_len=1, num_triggers=1 on Vocab(16 - 2, {"=>", "."}), as
    strings: L draws from the 14 non-special symbols, the copy prefix appended, one trigger at
    rng.integers(L - 2), the token after it copied to the end."""
    non_special = [str(v) for v in range(14)]
    seq = list(rng.choice(non_special, L, replace=True)) + ["=>"]
    if rng.uniform() < 0.5:  # safari's coin for num_triggers (1 either way here)
        pass
    pos = int(rng.integers(L - (1 + 1)))
    to_copy = seq[pos + 1]
    seq[pos] = "=>"
    seq[pos + 1] = to_copy
    return seq + [to_copy]


def features(rows: list[list[str]]) -> dict[str, np.ndarray]:
    """What the issue specifies of a sequence, read from its symbols: where the copy prefixes are, the answer,
    and the ordinary symbols' counts."""
    first = np.array([r.index("=>") for r in rows])
    return {"first": first, "answer": np.array([int(r[-1]) for r in rows]),
            "symbols": np.array([int(s) for r in rows for s in r if s != "=>"])}


def pelab_rows(n: int, L: int, seed: int) -> list[list[str]]:
    rows, _ = induction_rows(np.random.default_rng(seed), n, L)
    return [VOCABULARY.decode(r).split() for r in rows]


@pytest.mark.parametrize("L", [6, 16])
def test_every_sequence_has_the_task_layout(L):
    for seq in pelab_rows(2000, L, 0) + [safari_induction_head(L, np.random.default_rng(i)) for i in range(200)]:
        assert len(seq) == L + 2  # L draws, the query, the answer
        at = [i for i, s in enumerate(seq) if s == "=>"]
        assert len(at) == 2 and at[1] == L and 0 <= at[0] <= L - 3  # once uniformly, once as the last input
        assert seq[-1] == seq[at[0] + 1] != "=>"  # the answer: the token after the first occurrence
        assert "." not in seq  # the no-op is never drawn


def test_the_distribution_is_safaris():
    """Trigger position uniform on {0, ..., L - 3}, answer uniform over the 14 ordinary symbols, ordinary symbols
    uniform, and the same histograms as the reference (two-sample chi-square); L = 10, 6,000 sequences each."""
    L, n = 10, 6000
    mine = features(pelab_rows(n, L, 1))
    rng = np.random.default_rng(2)
    ref = features([safari_induction_head(L, rng) for _ in range(n)])
    for f in (mine, ref):
        assert stats.chisquare(np.bincount(f["first"], minlength=L - 2)).pvalue > 1e-3
        assert stats.chisquare(np.bincount(f["answer"], minlength=14)).pvalue > 1e-3
        assert stats.chisquare(np.bincount(f["symbols"], minlength=14)).pvalue > 1e-3
        assert f["first"].max() == L - 3 and f["first"].min() == 0
    for key, bins in (("first", L - 2), ("answer", 14)):
        table = np.stack([np.bincount(mine[key], minlength=bins), np.bincount(ref[key], minlength=bins)])
        assert stats.chi2_contingency(table).pvalue > 1e-3, key


def test_probe_instances_are_fixed_exact_and_need_the_tasks_vocabulary():
    a = make_probe_samples(INDUCTION_HEADS, VOCABULARY, 64, 0.5, 5, seed=7)
    b = make_probe_samples(INDUCTION_HEADS, VOCABULARY, 64, 0.0, 3, seed=7)
    assert [s.input_ids for s in a[:3]] == [s.input_ids for s in b]  # instance i: whatever n and depth
    assert a[0].input_ids != make_probe_samples(INDUCTION_HEADS, VOCABULARY, 64, 0.5, 1, seed=8)[0].input_ids
    for s in a:
        assert len(s.input_ids) == 65 and len(s.answer_ids) == 1 and s.length == 66
        assert s.input_ids[-1] == VOCABULARY.copy_prefix and s.input_ids.count(VOCABULARY.copy_prefix) == 2
        assert s.input_ids[s.gold_index] == s.answer_ids[0] == s.candidates[0]
        assert s.input_ids[s.gold_index - 1] == VOCABULARY.copy_prefix
        assert s.answer_space == 14 and s.gold_distance == len(s.input_ids) - s.gold_index
    capped = make_probe_samples(INDUCTION_HEADS, InductionVocabulary(long_samples=2, long_from=64), 64, 0.5, 5, 7)
    assert [s.input_ids for s in capped] == [s.input_ids for s in a[:2]]  # the first instances
    assert len(make_probe_samples(INDUCTION_HEADS, InductionVocabulary(2, 128), 64, 0.5, 5, 7)) == 5
    with pytest.raises(RecallLengthError, match="data=induction_heads"):
        make_probe_samples(INDUCTION_HEADS, ByteTokenizer(0, 0), 64, 0.5, 1, seed=7)
    with pytest.raises(RecallLengthError, match="length >= 3"):
        make_probe_samples(INDUCTION_HEADS, VOCABULARY, 2, 0.5, 1, seed=7)


# -- the data module ---------------------------------------------------------------------------------------------
def datamodule(**data) -> InductionDataModule:
    dm = InductionDataModule({"source": INDUCTION_HEADS, "seq_len": 12, "batch_size": 4, "val_windows": 3,
                              "eval_rows": 5, **data}, tokenizer=None, seed=3)
    dm.setup("fit")
    return dm


def test_batches_are_a_function_of_seed_step_rank_and_resume_exactly():
    dm = datamodule()
    stream = [b.tokens for _, b in zip(range(5), dm.train_dataset(start_step=0, rank=0), strict=False)]
    resumed = [b.tokens for _, b in zip(range(2), dm.train_dataset(start_step=3, rank=0), strict=False)]
    assert torch.equal(stream[3], resumed[0]) and torch.equal(stream[4], resumed[1])
    assert not torch.equal(stream[0], stream[1])
    assert not torch.equal(stream[0], next(iter(dm.train_dataset(start_step=0, rank=1))).tokens)
    assert stream[0].shape == (4, 14) and dm.vocab_size == 16
    first = next(iter(dm.train_dataset(start_step=0, rank=0)))
    assert (first.targets != IGNORE_INDEX).all()  # targets=all: every next token, as safari's labels


def test_answer_only_targets_score_the_answer_alone():
    batch = next(iter(datamodule(targets="answer").train_dataset(0, 0)))
    plain = next(iter(datamodule().train_dataset(0, 0))).tokens
    x, y, answers = batch.inputs, batch.targets, batch.answer_targets
    assert torch.equal(x, plain[:, :-1])  # the same sequences are fed
    assert (y[:, :-1] == IGNORE_INDEX).all() and torch.equal(y[:, -1], plain[:, -1])
    assert answers[:, -1].all() and not answers[:, :-1].any()


def test_evaluation_splits_are_fixed_documents():
    a, b = datamodule(), InductionDataModule({"source": INDUCTION_HEADS, "seq_len": 12, "eval_rows": 5,
                                              "val_windows": 3}, seed=99)
    b.setup()
    assert torch.equal(a.eval_tokens("test"), b.eval_tokens("test"))  # whatever the training seed
    assert not torch.equal(a.eval_tokens("test"), a.eval_tokens("val")[: a.n_tokens("test")])
    assert list(a.document_starts("test")) == [0, 14, 28, 42, 56, 70] and a.n_tokens("test") == 70
    assert len(next(iter(a.val_dataloader()))) == 3
    with pytest.raises(ConfigError, match="eval.split=train"):
        a.eval_tokens("train")


@pytest.mark.parametrize(("data", "message"), [
    ({"targets": "answers"}, "data.targets='answers' must be one of all, answer"),
    ({"source": "stdlib"}, "use data=induction_heads"),
    ({"seq_len": 2}, r"induction_heads needs a task length >= 3 \(data.seq_len\)"),
    ({"long_probe_samples": 0}, r"data.long_probe_samples=0 must be >= 1 or null"),
])
def test_bad_settings_are_one_line_naming_the_key(data, message):
    with pytest.raises((ConfigError, RecallLengthError), match=message):
        datamodule(**data)


# -- attention-only blocks and the paper's 137K ------------------------------------------------------------------
def counted(V: int, D: int, layers: int) -> int:
    """The parameters of the attention-only model written out: per layer q, k, v and output weights (4 D^2) with
    their biases (4 D) and one LayerNorm (2 D); a final LayerNorm (2 D); the token embedding and an untied head
    (2 V D, no head bias)."""
    return layers * (4 * D * D + 4 * D + 2 * D) + 2 * D + 2 * V * D


@pytest.mark.parametrize("pe", ["sinusoidal", "rope", "xpos"])
def test_the_papers_models_have_137k_parameters(pe):
    from helpers.runs import compose

    cfg = compose(["experiment=induction_heads", f"pe={pe}"])
    model = build_model(cfg.model, cfg.pe, VOCABULARY.vocab_size, int(cfg.data.seq_len))
    assert model.num_params(exclude_embedding=False) == counted(16, 128, 2) == 136_960  # the count
    assert all(b.mlp is None and b.ln_2 is None for b in model.blocks)


def test_d_ff_zero_is_an_attention_only_block_and_negative_is_refused():
    torch.manual_seed(0)
    model = build_model({"n_layers": 2, "n_heads": 2, "d_model": 16, "d_ff": 0, "bias": True}, {"name": "rope"}, 16)
    x = torch.randint(0, 16, (2, 9))
    block = model.blocks[0]
    h = model.tok_emb(x)
    state = model.pe.prepare(torch.arange(9), True, 8)
    assert torch.allclose(block(h, model.pe, state), h + block.attn(block.ln_1(h), model.pe, state))
    model(x).sum().backward()  # trains
    last = model.lm_head(model.hidden(x, from_index=5))
    assert torch.allclose(last, model(x)[:, 5:], atol=1e-6)  # the probes' last-rows path
    with pytest.raises(ConfigError, match=r"model.d_ff=-1 must be >= 0 \(0 = attention-only blocks\)"):
        GPTConfig(vocab_size=16, n_layers=1, n_heads=1, d_model=8, d_ff=-1).validate()


# -- end to end --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_experiment_trains_and_probes_every_length(tmp_path):
    """experiment=induction_heads at tiny shapes: fresh rows, the in-window check along training, a probe cell per
    length with n instances and its interval. Through train() in this worker (real Hydra composition and Trainer; the
    command line is tests/test_train.py's and the signal tests'): `python train.py` re-imported torch and Lightning."""
    from pelab.tasks.train import train

    out = tmp_path / "run"
    summary = train(compose(["experiment=induction_heads", "data.seq_len=16", "model.d_model=16", "model.n_heads=2",
                 "trainer.max_steps=6", "trainer.val_check_interval=3", "callbacks.checkpoint.every_n_steps=null",
                 "callbacks.retrieval_criterion.every_n_steps=3", "callbacks.retrieval_criterion.samples=8",
                 "callbacks.induction_curve.every_n_steps=3", "callbacks.induction_curve.lengths=[32]",
                 "callbacks.induction_curve.samples=4",
                 "callbacks.progress_bar=false", "eval.tokens=32", "probes.lengths=[0.5,1,2]", "probes.samples=6",
                 "data.long_probe_samples=4", "data.long_probe_from=32",
                 "provenance.allow_dirty=true"], out))
    assert summary["status"] == "ok"
    s = summary_of(out)
    assert s["data"]["vocab_size"] == 16 and s["data"]["fingerprint"]["row_tokens"] == 18
    assert s["model"]["params"] == counted(16, 16, 2)
    rows = s["evaluation"]["probes"]["rows"]
    assert [(c["length"], c["n"]) for c in rows] == [(8, 6), (16, 6), (32, 4)]  # capped from 32 on
    assert all(0.0 <= c["lo"] <= c["acc"] <= c["hi"] <= 1.0 for c in rows)
    assert "train/retrieval_acc" in s["metrics"] and "train/induction_acc@32" in s["metrics"]


def test_the_along_training_curve_scores_as_the_probes():
    from pelab.data.recall.induction_data import InductionCurve
    from pelab.evaluation.probes import score_samples

    torch.manual_seed(0)
    model = build_model({"n_layers": 2, "n_heads": 2, "d_model": 16, "d_ff": 0, "bias": True, "init": "kaiming"},
                        {"name": "rope"}, 16)
    curve = InductionCurve([16, 40], samples=24, seed=5, batch_tokens=200)  # several batches per length
    curve.setup(None, None, "fit")
    for L in (16, 40):
        records = score_samples(model, make_probe_samples(INDUCTION_HEADS, VOCABULARY, L, 0.5, 24, 5))
        assert curve.predictions(model, L).tolist() == [r.pred for r in records]
        assert curve.accuracy(model, L) == sum(r.correct for r in records) / 24
    assert model.training  # restored
    with pytest.raises(RecallLengthError, match="callbacks.induction_curve.lengths"):
        InductionCurve([2])


def test_the_agreement_rule():
    """experiments/induction_heads/compare.py: the issue's 95 % prediction interval for one new run."""
    import importlib.util

    from helpers.runs import ROOT

    spec = importlib.util.spec_from_file_location("ih_compare", ROOT / "experiments/induction_heads/compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    seeds = [0.55, 0.60, 0.62, 0.58, 0.65]
    mean, lo, hi = compare.prediction_interval(seeds)
    x = np.array(seeds)
    half = stats.t.ppf(0.975, 4) * np.sqrt(x.var(ddof=1) * 1.2 + x.mean() * (1 - x.mean()) / 256)
    assert (mean, lo, hi) == pytest.approx((x.mean(), x.mean() - half, x.mean() + half))
    assert compare.verdict(58.6, seeds)[0] == "agrees" and compare.verdict(83.6, seeds)[0] == "disagrees"
    assert compare.verdict(7.8, [0.07, 0.09, 0.06])[0] == "both at chance"
    assert compare.verdict(100.0, [1.0, 1.0])[0] == "both at 100 %"
    assert compare.verdict(99.6, [1.0] * 5)[0] == "agrees"  # x̄ = 1: Agresti-Coull keeps a width
    assert compare.verdict(58.6, seeds[:3])[0] == "3 seeds < 5: no verdict"  # the rule's n >= 5
    # the table counts the comparable rows' informative cells, and shows every informative cell apart
    runs = {"sinusoidal": {512: seeds, 1024: [0.26, 0.27, 0.25, 0.28, 0.27], 2048: [0.9] * 5},
            "rope": {512: seeds[:3]}}
    plateaus = {"sinusoidal": [("s0", True, "")], "rope": [("s0", False, "in-window")]}
    text = compare.table(runs, plateaus)
    assert "of the rows at plateau: 2 agree, 1 disagree." in text
    assert "whether or not its row is at plateau (not a count of the rule's): 2 agree, 1 disagree, 1 without" in text
    plateaus["sinusoidal"] = [("s0", False, "still moving")]
    assert "of the rows at plateau: 0 agree, 0 disagree." in compare.table(runs, plateaus)


def test_the_committed_comparison_is_compare_py_on_the_committed_runs():
    """experiments/induction_heads/comparison.md is what compare.py makes of runs/ now (no stale or typed table)."""
    import importlib.util

    from helpers.runs import ROOT

    here = ROOT / "experiments/induction_heads"
    spec = importlib.util.spec_from_file_location("ih_compare", here / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    assert compare.table(*compare.run_accuracies(here / "runs")) + "\n" == (here / "comparison.md").read_text()


def test_the_plateau_criterion(tmp_path):
    """compare.py's plateau: in-window 1.000 at the last five checks, 2^9-2^11 within 0.05 over the last 5,000 steps
    (read from csv/metrics.csv, whose rows name the step before and repeat a value between two points)."""
    import csv as csv_module
    import importlib.util
    import json

    from helpers.runs import ROOT

    spec = importlib.util.spec_from_file_location("ih_compare", ROOT / "experiments/induction_heads/compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)

    def run(name, inwindow, curve):
        folder = tmp_path / name
        (folder / "csv").mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"global_step": 25000}))
        keys = ["step", "train/retrieval_acc", *(f"train/induction_acc@{n}" for n in (512, 1024, 2048))]
        with open(folder / "csv" / "metrics.csv", "w", newline="") as f:
            w = csv_module.DictWriter(f, keys)
            w.writeheader()
            for step in range(50, 25001, 50):
                row = {"step": step - 1, "train/retrieval_acc": inwindow(step - step % 500)}
                row |= {f"train/induction_acc@{n}": curve(step - step % 2500, n) for n in (512, 1024, 2048)}
                w.writerow(row)
        return compare.plateau(folder)

    assert run("flat", lambda s: 1.0 if s >= 10000 else 0.5, lambda s, n: 0.8 if s >= 15000 else 0.1) == (True, "")
    ok, why = run("late", lambda s: 1.0 if s >= 24000 else 0.99, lambda s, n: 0.8)
    assert not ok and why.startswith("in-window at the last 5 checks: 0.990, 0.990, 1.000")
    ok, why = run("moving", lambda s: 1.0, lambda s, n: s / 25000)
    assert not ok and "2^9: 0.800 -> 1.000" in why
