"""The default recall mixer (pelab.data.mixer): recall sequences replace the first rows of a batch."""

from __future__ import annotations

import torch

from helpers.texts import text_datamodule


def test_recall_mix_default_mixer_uses_recall_sequences(text_dir, tmp_path):
    # the default kinds (mqar) in the default curriculum's first stage: half the rows, their first 32 tokens
    dm = text_datamodule(text_dir, tmp_path, tokenizer="byte", seq_len=96, batch_size=4, recall_mix=0.5)
    batch = dm.train_dataset().batch(3)
    keys = [[t in dm.tokenizer.reserved_key_ids for t in row.tolist()] for row in batch.tokens]
    assert all(any(k[:33]) and not any(k[33:]) for k in keys[:2]), keys[:2]  # 32 inputs + their last target
    assert not any(any(k) for k in keys[2:])
    kv = text_datamodule(text_dir, tmp_path, tokenizer="byte", seq_len=96, batch_size=4, recall_mix=0.5,
             recall_kinds=["kv", "passkey"], recall_curriculum=None, recall_loss="all").train_dataset().batch(3)
    texts = [dm.tokenizer.decode(row.tolist()) for row in kv.tokens]
    assert all("Key:" in t or "pass key" in t for t in texts[:2]), texts[:2]
    assert not any("Key:" in t or "pass key" in t for t in texts[2:])
    assert all(torch.equal(u, v) for u, v in zip(batch, dm.train_dataset().batch(3), strict=True))
