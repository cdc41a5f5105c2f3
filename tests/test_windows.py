"""The training stream (pelab.data.windows): batches are a function of (seed, step, rank), resume at any step
and with workers, and the recall mix hook is as deterministic as plain batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.texts import text_datamodule, text_source
from pelab.data import LMDataModule
from pelab.data.batch import Batch
from pelab.data.windows import MixedRows
from pelab.errors import ConfigError


def same(a: Batch, b: Batch) -> bool:
    """The same tokens and the same loss masks."""
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_windows_deterministic_in_seed_step_rank(text_dir, tmp_path):
    dm = text_datamodule(text_dir, tmp_path, batch_size=4)
    a, b = dm.train_dataset(rank=0), dm.train_dataset(rank=0)
    batch = a.batch(7)
    x = batch.tokens
    assert x.shape == (4, 33) and x.dtype == torch.int64
    assert batch.scored.all() and not batch.answers.any()  # text rows: every token a target, none an answer
    assert same(batch, b.batch(7))
    assert not torch.equal(x, a.batch(8).tokens), "steps must differ"
    assert not torch.equal(x, dm.train_dataset(rank=1).batch(7).tokens), "ranks must differ"
    other_seed = text_datamodule(text_dir, tmp_path, batch_size=4, seed=1)
    assert not torch.equal(x, other_seed.train_dataset(rank=0).batch(7).tokens), "seeds must differ"
    # Every row is a real contiguous span of the train stream.
    spans = np.lib.stride_tricks.sliding_window_view(np.array(dm.cache.tokens("train")), 33)  # (N, 33)
    for row in x.numpy():
        assert (spans == row).all(axis=1).any()


def test_stream_resumes_at_any_step_and_with_workers(text_dir, tmp_path):
    dm = text_datamodule(text_dir, tmp_path, max_steps=12)
    full = list(dm.train_dataloader())
    assert len(full) == 12
    resumed = list(torch.utils.data.DataLoader(dm.train_dataset(start_step=5), batch_size=None))
    assert all(same(u, v) for u, v in zip(full[5:], resumed, strict=True))
    ds = dm.train_dataset(start_step=3)
    with_workers = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert all(same(u, v) for u, v in zip(full[3:], with_workers, strict=True)), (
        "workers reorder steps"
    )


def test_recall_mix_hook_is_deterministic(text_dir, tmp_path):
    seen = []

    def mixer(n, length, rng, step, text):  # marks rows with a recognisable pattern, drawn from the batch rng
        seen.append((step, text.shape))
        answers = np.zeros((n, length), dtype=bool)
        answers[:, -1] = True
        return MixedRows(np.full((n, length), 7) + rng.integers(0, 2, size=(n, 1)), answers, np.zeros_like(answers))

    dm = text_datamodule(text_dir, tmp_path, batch_size=8, recall_mix=0.25, mixer=mixer, recall_loss="answers")
    ds = dm.train_dataset()
    for step in range(5):
        batch = ds.batch(step)
        mixed = [bool((row == row[0]).all() and row[0] in (7, 8)) for row in batch.tokens]
        assert mixed == [True, True] + [False] * 6
        # the mixed rows score their answer alone; the text rows every token
        assert torch.equal(batch.scored[:2], batch.answers[:2]) and batch.answers[:2, -1].all()
        assert batch.scored[2:].all() and not batch.answers[2:].any()
        assert same(batch, dm.train_dataset().batch(step))
    assert seen[::2] == [(step, (2, 33)) for step in range(5)]  # the step and the text rows it replaces
    with pytest.raises(ConfigError, match="data.recall_mix"):
        LMDataModule(data=text_source(text_dir), tokenizer="byte", seq_len=8, batch_size=2, recall_mix=1.5)
