"""The default recall mixer (pelab.data.mixer): recall sequences replace the first rows of a batch."""

from __future__ import annotations

import torch

from conftest import _dm


def test_recall_mix_default_mixer_uses_recall_sequences(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, tokenizer="byte", seq_len=96, batch_size=4, recall_mix=0.5)
    x = dm.train_dataset().batch(3)
    texts = [dm.tokenizer.decode(row.tolist()) for row in x]
    assert all("Key:" in t or "pass key" in t for t in texts[:2]), texts[:2]
    assert not any("Key:" in t or "pass key" in t for t in texts[2:])
    assert torch.equal(x, dm.train_dataset().batch(3))
