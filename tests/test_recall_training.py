"""The recall training mix end to end: answer-only targets, disjoint train/probe instances, and a
small model that learns in-window kv retrieval from it (slow)."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest
import torch

from conftest import compose
from pelab.data.datamodule import IGNORE_INDEX, DataConfigError, LMDataModule, inputs_and_targets
from pelab.data.recall import make_probe_samples

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
          "recall_kinds": ["kv"], "recall_key_len": 2, "recall_value_len": 1, **kw}
    dm = LMDataModule(source={"source": "text_dir", "path": str(texts), "glob": "*.txt"}, tokenizer="byte",
                      cache_dir=str(cache), **kw)
    dm.setup("fit")
    return dm


def test_answer_only_loss_scores_exactly_the_retrieved_values(small_texts, tmp_path):
    dm = _dm(small_texts, tmp_path, recall_loss="answers")
    answers, plain = dm.train_dataset(), _dm(small_texts, tmp_path, recall_loss="all").train_dataset()
    n_mixed = 0
    for step in range(6):
        batch = answers.batch(step)  # (B, T+1), context-only tokens stored as -1 - id
        x, y = inputs_and_targets(batch)
        ref = plain.batch(step)
        assert torch.equal(x, ref[:, :-1]), "the answer-only option changes the targets, never the tokens"
        assert int(x.min()) >= 0
        for row in range(batch.shape[0]):
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
        with pytest.raises(DataConfigError, match=name.replace(".", r"\.")):
            _dm(small_texts, tmp_path, **kw)


def test_preset_trains_and_probes_on_disjoint_kv_instances(small_texts, tmp_path):
    """The recall_micro preset end to end: its training mix and its probes use the same key/value
    lengths, and no probe key (hence no probe key -> value pair) ever appears in training."""
    cfg = compose(["experiment=recall_micro", "data=text_dir", f"data.path={small_texts}", "data.glob=*.txt",
                   f"paths.cache_dir={tmp_path}"])
    assert cfg.data.recall_key_len == cfg.probes.key_len and cfg.data.recall_value_len == cfg.probes.value_len
    dm = LMDataModule.from_config(cfg)
    dm.setup("fit")
    ds = dm.train_dataset()
    train_keys: set[str] = set()
    for step in range(60):
        for row in ds.batch(step):
            text = dm.tokenizer.decode(inputs_and_targets(row[None])[0][0].tolist())
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
# the slow proof: a micro model trained on the mix retrieves in-window kv values


def _kv_cells(summary: dict) -> list[dict]:
    return [r for r in summary["evaluation"]["probes"]["rows"] if r["kind"] == "kv"]


@pytest.mark.slow
def test_micro_model_trained_on_the_recall_mix_retrieves_in_window(tmp_path):
    from pelab.tasks.train import train

    cfg = compose(["experiment=recall_micro", "trainer=cpu", "logger=csv", "callbacks.progress_bar=false",
                   "seed=0"], tmp_path)
    t0 = time.perf_counter()
    summary = train(cfg)
    elapsed = time.perf_counter() - t0
    assert summary["status"] == "ok"
    L = int(cfg.data.seq_len)
    cells = _kv_cells(summary)
    assert [c["length"] for c in cells] == [L] * len(cfg.probes.depths)
    acc = summary["metrics"][f"probe/kv/acc@{L}"]
    chance = sum(c["chance"] for c in cells) / len(cells)
    # chance_copy (1 / n_pairs: copy a random value of the context) from the very probe instances
    samples = [s for d in cfg.probes.depths
               for s in make_probe_samples("kv", _byte(), L, d, int(cfg.probes.samples), int(cfg.probes.seed),
                                           key_len=int(cfg.probes.key_len), value_len=int(cfg.probes.value_len))]
    chance_copy = sum(1.0 / s.n_items for s in samples) / len(samples)
    by_depth = {c["depth"]: c["acc"] for c in cells}
    print(f"\n{elapsed:.0f}s acc {acc:.3f} by depth {by_depth} logprob "
          f"{summary['metrics'][f'probe/kv/logprob@{L}']:.3f} chance {chance:.4f} chance_copy {chance_copy:.3f}")
    assert chance_copy > chance

    def se(p: float, n: int) -> float:  # binomial standard error of an accuracy at p over n instances
        return (p * (1 - p) / n) ** 0.5

    n, n_cell = len(samples), int(cfg.probes.samples)
    # Retrieval, not guessing: above copying a random value of the context (a stricter baseline than
    # uniform chance) by two standard errors over all 5 x 32 instances (measured: acc 0.39 vs 0.25).
    assert acc > chance_copy + 2 * se(chance_copy, n), (acc, chance_copy, by_depth)
    # ... and at every depth above uniform chance by three standard errors of one 32-instance cell.
    assert min(by_depth.values()) > chance + 3 * se(chance, n_cell), by_depth


def _byte():
    from pelab.data.tokenizer import ByteTokenizer

    return ByteTokenizer()
