"""The recall training mix end to end: answer-only targets, disjoint train/probe instances, and a
small model that learns in-window kv retrieval from it (slow)."""

from __future__ import annotations

import itertools
import math
import random
import re
import time
from pathlib import Path

import pytest
import torch

from helpers.runs import compose
from pelab.data.batch import IGNORE_INDEX
from pelab.data.datamodule import LMDataModule
from pelab.data.recall import make_probe_samples
from pelab.errors import ConfigError
from pelab.runs.build import build_datamodule
from pelab.training.module import two_means

QUERY = re.compile(r'Key: "([0-9a-f]+)" Value: "')


@pytest.fixture(scope="module")
def small_texts(tmp_path_factory) -> Path:
    """40 short plain-text documents: enough for every split to hold a few windows."""
    root = tmp_path_factory.mktemp("recall-texts")
    rng = random.Random(0)
    words = ["the", "a", "model", "reads", "text", "and", "finds", "keys", "values", "in", "long", "contexts"]
    for i in range(40):
        (root / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(400)))
    return root


def _dm(texts: Path, cache: Path, **kw) -> LMDataModule:
    kw = {"seq_len": 64, "batch_size": 8, "seed": 3, "val_windows": 4, "recall_mix": 0.5,
          "recall_kinds": ["kv"], "recall_key_len": 2, "recall_value_len": 1, "recall_curriculum": None, **kw}
    dm = LMDataModule(data={"source": "text_dir", "path": str(texts), "glob": "*.txt"}, tokenizer="byte",
                      cache_dir=str(cache), **kw)
    dm.setup("fit")
    return dm


def test_answer_only_loss_scores_exactly_the_retrieved_values(small_texts, tmp_path):
    dm = _dm(small_texts, tmp_path, recall_loss="answers")
    answers, plain = dm.train_dataset(), _dm(small_texts, tmp_path, recall_loss="all").train_dataset()
    n_mixed = 0
    for step in range(6):
        batch = answers.batch(step)  # (B, T+1) tokens and masks
        x, y = batch.inputs, batch.targets
        ref = plain.batch(step).tokens
        assert torch.equal(batch.tokens, ref), "the answer-only option changes the targets, never the tokens"
        for row in range(x.shape[0]):
            text = dm.tokenizer.decode(ref[row].tolist())  # kv rows are ASCII: char index = token index
            scored = (y[row] != IGNORE_INDEX).nonzero().flatten().tolist()
            if "Key:" not in text:  # a text row: every token is a target
                assert torch.equal(y[row], ref[row, 1:])
                continue
            n_mixed += 1
            # the scored targets are exactly the value after each `Key: "k" Value: "` (1 hex char here)
            expected = [m.end() - 1 for m in QUERY.finditer(text) if m.end() < len(text)]
            assert scored == expected, (text, scored, expected)
            pairs = dict(re.findall(r'"([0-9a-f]{2})": "([0-9a-f])"', text))
            for m, t in zip(QUERY.finditer(text), scored, strict=False):
                assert chr(int(y[row, t])) == pairs[m.group(1)], "the target is the queried key's value"
    assert n_mixed >= 12  # recall_mix=0.5 of 8 rows over 6 batches


def test_recall_knobs_fail_with_the_setting_name(small_texts, tmp_path):
    for kw, name in [({"recall_loss": "values"}, "data.recall_loss"), ({"recall_kinds": ["kv", "nope"]}, "data.recall_kinds"),
                     ({"recall_key_len": 0}, "data.recall_key_len")]:
        with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
            _dm(small_texts, tmp_path, **kw)


def test_preset_trains_and_probes_on_disjoint_kv_instances(small_texts, tmp_path):
    """The recall_micro preset end to end: its training mix and its probes use the same key/value
    lengths, and no probe key (hence no probe key -> value pair) ever appears in training."""
    cfg = compose(["experiment=recall_micro", "data=text_dir", f"data.path={small_texts}", "data.glob=*.txt",
                   f"paths.cache_dir={tmp_path}"])
    assert cfg.data.recall_key_len == cfg.probes.key_len and cfg.data.recall_value_len == cfg.probes.value_len
    dm = build_datamodule(cfg, cfg.data.batch_size)
    dm.setup("fit")
    ds = dm.train_dataset()
    train_keys: set[str] = set()
    for step in range(60):
        for row in ds.batch(step).inputs:
            text = dm.tokenizer.decode(row.tolist())
            train_keys |= set(re.findall(r'"([0-9a-f]+)": "', text)) | set(QUERY.findall(text))
    key_len = int(cfg.probes.key_len)
    assert {len(k) for k in train_keys} == {key_len}
    assert len(train_keys) > 0.9 * 16**key_len / 2, "the training mix covers (nearly) its whole key space"
    probe_keys: set[str] = set()
    for depth in cfg.probes.depths:
        for s in make_probe_samples("kv", dm.tokenizer, int(cfg.data.seq_len), depth, int(cfg.probes.samples),
                                    int(cfg.probes.seed), key_len=key_len, value_len=int(cfg.probes.value_len)):
            probe_keys |= set(re.findall(r'"([0-9a-f]+)": "', dm.tokenizer.decode(s.input_ids)))
    assert len(probe_keys) > 20
    assert not train_keys & probe_keys


# --------------------------------------------------------------------------------------------------
# mqar rows in the training mix: answer mask, two means, curriculum, disjoint from the probes


def _mqar_dm(texts: Path, cache: Path, **kw) -> LMDataModule:
    return _dm(texts, cache, **{"recall_kinds": ["mqar"], "recall_pairs": 4, "seq_len": 48, "recall_loss": "answers",
                                **kw})


@pytest.mark.parametrize("loss", ["answers", "two_means"])
def test_mqar_rows_score_exactly_their_answers(small_texts, tmp_path, loss):
    dm = _mqar_dm(small_texts, tmp_path, recall_loss=loss)
    plain = _mqar_dm(small_texts, tmp_path, recall_loss="all").train_dataset()
    K, M = dm.tokenizer.reserved_key_ids, dm.tokenizer.reserved_value_ids
    n_mixed = 0
    for step in range(5):
        batch = dm.train_dataset().batch(step)
        x, y, answers = batch.inputs, batch.targets, batch.answer_targets
        ref = plain.batch(step).tokens
        assert torch.equal(batch.tokens, ref)
        for row in range(x.shape[0]):
            ids = ref[row].tolist()
            scored = (y[row] != IGNORE_INDEX).nonzero().flatten().tolist()
            if not any(t in K for t in ids):  # a text row: every target scored, none an answer
                assert torch.equal(y[row], ref[row, 1:]) and not answers[row].any()
                continue
            n_mixed += 1
            # exactly the 4 answered values: the targets at the query keys of the last 8 tokens
            assert scored == answers[row].nonzero().flatten().tolist() == [49 - 8 + 2 * q for q in range(4)]
            assert all(int(y[row, t]) in M and int(x[row, t]) in K for t in scored)
    assert n_mixed >= 8


def test_two_means_weighs_text_and_answers_as_two_means():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    targets = torch.randint(0, 11, (3, 5))
    targets[2, :3] = IGNORE_INDEX  # context-only tokens of a mixed row
    answers = torch.zeros(3, 5, dtype=torch.bool)
    answers[2, 3:] = True
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
    text = (targets != IGNORE_INDEX) & ~answers
    text_mean, answer_mean = two_means(logits, targets, answers)
    assert torch.allclose(text_mean, nll[text].mean()) and torch.allclose(answer_mean, nll[answers].mean())
    # a batch without answers (or without text) is just the mean it has
    none = torch.zeros_like(answers)
    assert torch.allclose(sum(two_means(logits, targets, none)), nll[targets != IGNORE_INDEX].mean())
    only = torch.full_like(targets, IGNORE_INDEX)
    only[2, 3:] = targets[2, 3:]
    assert torch.allclose(sum(two_means(logits, only, answers)), nll[answers].mean())


def test_curriculum_keeps_the_recall_in_the_first_span_tokens(small_texts, tmp_path):
    dm = _mqar_dm(small_texts, tmp_path, recall_mix=1.0, recall_curriculum=[[0, 16], [3, 32]])
    K, M = dm.tokenizer.reserved_key_ids, dm.tokenizer.reserved_value_ids
    ds = dm.train_dataset()
    for step, span in [(0, 16), (2, 16), (3, 32), (9, 32)]:
        batch = ds.batch(step)
        for row, tgt in zip(batch.inputs, batch.targets):
            last = max(i for i, t in enumerate(row.tolist()) if t in K or t in M)
            assert last == span - 1  # the span ends with the last answer: positions 0..span-1 ...
            assert (tgt[span - 1 :] == IGNORE_INDEX).all()  # ... and the text after it is not scored
    with pytest.raises(ConfigError, match="data.recall_curriculum"):
        _mqar_dm(small_texts, tmp_path, recall_curriculum=[[0, 8]])  # 4 pairs need 16 tokens


def test_two_means_scores_the_text_after_the_span_and_a_stage_sets_the_share(small_texts, tmp_path):
    """recall_loss=two_means: a recall row's own text after its curriculum span is a text target (answer-only
    rows keep it context); [step, span, share] sets the fraction of recall rows from that step."""
    cur = [[0, 16, 1.0], [3, 32, 0.25]]
    two = _mqar_dm(small_texts, tmp_path, recall_mix=0.5, recall_loss="two_means", recall_curriculum=cur)
    ans = _mqar_dm(small_texts, tmp_path, recall_mix=0.5, recall_loss="answers", recall_curriculum=cur)
    K, M = two.tokenizer.reserved_key_ids, two.tokenizer.reserved_value_ids
    for step in (0, 1, 2):  # share 1.0, span 16: every row is recall, then text
        batch = two.train_dataset().batch(step)
        x, y, is_answer = batch.inputs, batch.targets, batch.answer_targets
        y_ans = ans.train_dataset().batch(step).targets
        assert torch.equal(y_ans[:, 16:], torch.full_like(y_ans[:, 16:], IGNORE_INDEX))
        assert torch.equal(y[:, 16:], batch.tokens[:, 17:])  # scored text
        assert not any(t in K or t in M for t in x[:, 16:].flatten().tolist())  # real text, no reserved id
        assert torch.equal(y[:, :15] != IGNORE_INDEX, is_answer[:, :15])  # in the span: the answers only
        assert is_answer[:, :15].sum() == 4 * x.shape[0]  # 4 answers per row
    rows = [two.train_dataset().batch(s).answer_targets.any(1).sum().item() for s in range(3, 103)]
    assert 0.2 < sum(rows) / (100 * 8) < 0.3  # share 0.25 from step 3 (not data.recall_mix=0.5)


def test_the_harness_datamodule_gets_every_loader_setting(tmp_path):
    """Every data.* loader key of the composed config reaches the DataModule (a key that once went missing
    silently fell back to the constructor's default: the curriculum was off and data.recall_pairs ignored in
    every harness run)."""
    from omegaconf import OmegaConf

    from pelab.data.config import LOADER_KEYS

    cfg = compose(["experiment=recall", "data.recall_pairs=6", "data.recall_curriculum=[[0,32],[7,64]]",
                   "data.val_windows=5", "data.val_batch_size=3", "data.recall_key_len=4", "data.num_workers=0",
                   f"paths.cache_dir={tmp_path}"])
    dm = build_datamodule(cfg, cfg.data.batch_size)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    assert dm.settings == {k: data[k] for k in LOADER_KEYS}
    assert dm.recall_pairs == 6 and dm.recall_curriculum == [[0, 32], [7, 64]] and dm.val_batch_size == 3


def test_probe_instances_never_appear_in_training_batches(small_texts, tmp_path):
    """Single-token probes and training rows draw from the same reserved ids, so they are disjoint by instance:
    an mqar / kv_single instance is its set of (key, value) pairs (with its filler: validation text for the
    probes, training text for the rows). No probe's pair set occurs in 1,600 training rows."""
    dm = _mqar_dm(small_texts, tmp_path, recall_mix=1.0, recall_kinds=["mqar", "kv_single"], seq_len=64)
    K, M = dm.tokenizer.reserved_key_ids, dm.tokenizer.reserved_value_ids

    def pair_set(ids: list[int]) -> frozenset:  # each reserved key with the reserved value that follows it
        r = [t for t in ids if t in K or t in M]
        return frozenset((a, b) for a, b in itertools.pairwise(r) if a in K and b in M)

    ds = dm.train_dataset()
    train = {pair_set(row) for step in range(200) for row in ds.batch(step).inputs.tolist()}
    val = dm.eval_tokens("val")
    probes = {pair_set(s.input_ids + s.answer_ids) for d in (0.0, 0.5, 1.0) for kind in ("mqar", "kv_single")
              for s in make_probe_samples(kind, dm.tokenizer, 64, d, 50, 1234, filler_ids=val, pairs=4)}
    assert len(train) > 1500 and len(probes) == 100 and all(probes | train)
    assert not probes & train


# --------------------------------------------------------------------------------------------------
# a micro model learns mqar from these rows (fast)


@pytest.mark.slow
def test_micro_model_learns_mqar_from_answer_only_rows(small_texts, tmp_path):
    from pelab.model import build_model

    torch.manual_seed(0)
    dm = _mqar_dm(small_texts, tmp_path, seq_len=15, recall_pairs=4, recall_mix=1.0, batch_size=32)
    model = build_model({"n_layers": 2, "n_heads": 1, "d_model": 64, "d_ff": None, "dropout": 0.0, "bias": False,
                         "attn_chunk_size": 512, "init": "kaiming", "tie_embeddings": False},
                        {"name": "rope"},
                        dm.vocab_size, 15)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0)
    probes = [s for d in (0.0, 0.25, 0.5, 0.75, 1.0)
              for s in make_probe_samples("mqar", dm.tokenizer, 15, d, 40, 1234, filler_ids=dm.eval_tokens("val"),
                                          pairs=4)]
    px = torch.tensor([s.input_ids for s in probes])
    gold = torch.tensor([s.answer_ids[0] for s in probes])

    def accuracy() -> float:
        model.eval()
        with torch.no_grad():
            acc = (model(px)[:, -1].argmax(-1) == gold).float().mean().item()
        model.train()
        return acc

    ds, t0, acc, step = dm.train_dataset(), time.perf_counter(), 0.0, 0
    for step in range(1, 1501):
        batch = ds.batch(step)
        x, y = batch.inputs, batch.targets
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 and (acc := accuracy()) >= 0.9:
            break
    print(f"\nmqar N=4 after {step} steps ({time.perf_counter() - t0:.0f}s): in-window accuracy {acc:.3f}")
    assert acc >= 0.75, f"accuracy {acc:.3f} after {step} steps; copying a random context value gives 0.25"

    # The in-window criterion (experiment=recall) reads the same skill on its own probe instances and stops
    # training on this trained model, not on an untrained one.
    from types import SimpleNamespace

    from pelab.training.callbacks.retrieval import RetrievalCriterion

    def criterion_run(net: torch.nn.Module, threshold: float) -> tuple[RetrievalCriterion, SimpleNamespace, dict]:
        trainer = SimpleNamespace(datamodule=dm, global_step=0, should_stop=False)
        logged: dict = {}
        module = SimpleNamespace(model=net, log=lambda k, v, **_: logged.__setitem__(k, v))
        cb = RetrievalCriterion(threshold=threshold, every_n_steps=1, samples=64, depths=4)
        cb.setup(trainer, module, "fit")
        cb.on_train_batch_end(trainer, module, None, None, 0)
        return cb, trainer, logged

    cb, trainer, logged = criterion_run(model, 0.6)
    assert logged["train/retrieval_acc"] >= 0.6 and trainer.should_stop and cb.reached == 0
    assert logged["train/steps_to_criterion"] == 0.0
    torch.manual_seed(1)
    fresh = build_model({"n_layers": 2, "n_heads": 1, "d_model": 64, "d_ff": None, "dropout": 0.0, "bias": False,
                         "attn_chunk_size": 512, "init": "kaiming", "tie_embeddings": False}, {"name": "rope"},
                        dm.vocab_size, 15)
    cb, trainer, logged = criterion_run(fresh, 0.6)
    assert logged["train/retrieval_acc"] < 0.6 and not trainer.should_stop and cb.reached is None
    assert math.isnan(logged["train/steps_to_criterion"])


# --------------------------------------------------------------------------------------------------
# the slow proof: the recall preset, micro-sized, acquires retrieval through the real harness


@pytest.mark.slow
def test_recall_preset_on_a_micro_model_reaches_its_criterion_and_retrieves(tmp_path):
    """experiment=recall through train(): Trainer, curriculum, answer-only loss, the criterion callback and
    the probes. Micro-sized (one head of 64, L = 32, 4 pairs; measured: criterion at step 575, 37 s); the
    >= 0.95 figure at L = 128 is the study's (experiments/lost_in_the_middle)."""
    from pelab.tasks.train import train

    cfg = compose(["experiment=recall", "model=micro", "model.d_model=64", "model.n_heads=1", "model.init=kaiming",
                   "model.tie_embeddings=false", "data.seq_len=32", "data.recall_pairs=4",
                   "data.recall_curriculum=[[0,16],[300,32]]", "callbacks.retrieval_criterion.every_n_steps=25",
                   "callbacks.retrieval_criterion.samples=64", "trainer.max_steps=1200", "probes.kinds=[mqar]",
                   "probes.lengths=[1]", "probes.samples=20", "eval.lengths=[1]", "trainer=cpu", "logger=csv",
                   "callbacks.progress_bar=false", "seed=0"], tmp_path)
    summary = train(cfg)
    m = summary["metrics"]
    steps = m["train/steps_to_criterion"]
    assert summary["status"] == "ok" and math.isfinite(steps) and steps < 1200, m
    assert summary["global_step"] == steps  # it stopped there
    # the probes (other instances than the criterion's): far above copying one of the 4 values (0.25)
    assert m["probe/mqar/acc_lo@32"] > 0.8, m["probe/mqar/acc@32"]
    from pelab.result_table import result_table

    assert f"retrieval criterion met at step {steps:.0f}" in result_table(summary)


def test_the_result_table_says_when_retrieval_was_not_learned():
    from pelab.result_table import result_table

    capped = {"config": {"trainer": {"max_steps": 3000}, "callbacks": {"retrieval_criterion": {"threshold": 0.95}}},
              "metrics": {"train/retrieval_acc": 0.922, "train/steps_to_criterion": "nan"}}
    assert max(map(len, result_table(capped).splitlines())) <= 80
    assert ("retrieval NOT acquired: the in-window criterion (0.95) was not reached by the cap (step 3000; last "
            "in-window accuracy 0.922)") in " ".join(result_table(capped).split())
    # no criterion (the main job): a kind whose in-window interval does not clear the copy baseline is named
    plain = {"metrics": {"probe/kv/acc_hi@128": 0.12, "probe/passkey/acc_hi@128": 0.9},
             "evaluation": {"probes": {"train_length": 128, "copy": {"kv": 0.125, "passkey": 0.2}}}}
    table = " ".join(result_table(plain).split())  # folded to 80 columns
    assert "kv: in-window accuracy is not above copying" in table and "passkey:" not in table


@pytest.mark.slow
def test_harness_trains_on_two_means(tmp_path):
    """Through the real harness: with recall_loss=two_means the first loss is two means of ~ln V each (random
    init), with answers one; the mqar mix and its curriculum run end to end; the reserved ranges reach
    summary.json."""
    import csv
    import math

    from helpers.runs import FAST
    from pelab.tasks.train import train

    first = {}
    for loss in ("answers", "two_means"):
        out = tmp_path / loss
        summary = train(compose([*FAST, "logger=csv", "data.seq_len=48", "data.recall_mix=0.5",
                                 "data.recall_kinds=[mqar]", "data.recall_pairs=4", f"data.recall_loss={loss}",
                                 "data.recall_curriculum=[[0,16],[3,48]]", "trainer.max_steps=4",
                                 "trainer.val_check_interval=4", "trainer.log_every_n_steps=1", "probes.enabled=false",
                                 "eval.lengths=[1]"], out))
        assert summary["status"] == "ok"
        with open(out / "csv" / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
        first[loss] = float(rows[0]["train/loss"])
        if loss == "two_means":  # both means are logged and sum to the loss
            parts = float(rows[0]["train/loss_text"]) + float(rows[0]["train/loss_answers"])
            assert abs(parts - first[loss]) < 1e-4 and float(rows[0]["train/loss_answers"]) > 1.0
    v = summary["data"]["vocab_size"]
    reserved = {"keys": [257, 321], "values": [321, 385]}
    assert summary["data"]["reserved"] == summary["data"]["fingerprint"]["reserved"] == reserved and v == 385
    assert abs(first["answers"] - math.log(v)) < 0.5 and abs(first["two_means"] - 2 * math.log(v)) < 1.0, first
