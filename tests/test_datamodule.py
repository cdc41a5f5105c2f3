"""The LightningDataModule (pelab.data.datamodule): a Lightning resume continues the exact batch stream,
validation windows and eval tokens, composition from the Hydra config, bad loader settings."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers.texts import text_datamodule, text_source
from pelab.data import LMDataModule
from pelab.errors import ConfigError
from pelab.runs.build import build_datamodule


class _Recorder:
    """A tiny LightningModule that records the batches it trains on."""

    @staticmethod
    def make(vocab_size: int):
        import lightning as L

        class Recorder(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, 4)
                self.seen: list[torch.Tensor] = []

            def training_step(self, batch, batch_idx):
                self.seen.append(batch.tokens.clone())
                return self.emb(batch.tokens).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Recorder()


def _fit(text_dir, cache, max_steps, accumulate=1, ckpt_in=None, ckpt_out=None):
    import lightning as L

    dm = LMDataModule(
        data=text_source(text_dir), tokenizer="byte", seq_len=16, batch_size=2, seed=3, cache_dir=str(cache),
        recall_mix=0.0,
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate,
    )
    model = _Recorder.make(257)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_in)
    if ckpt_out:
        trainer.save_checkpoint(ckpt_out)
    return model.seen


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_resume_continues_the_exact_batch_stream(accumulate, text_dir, tmp_path):
    full = _fit(text_dir, tmp_path, max_steps=6, accumulate=accumulate)
    assert len(full) == 6 * accumulate
    first = _fit(text_dir, tmp_path, max_steps=3, accumulate=accumulate, ckpt_out=tmp_path / "k3.ckpt")
    rest = _fit(text_dir, tmp_path, max_steps=6, accumulate=accumulate, ckpt_in=str(tmp_path / "k3.ckpt"))
    assert len(first) == 3 * accumulate and len(rest) == 3 * accumulate
    assert all(torch.equal(u, v) for u, v in zip(full, first + rest, strict=True))


def test_validation_windows_and_eval_tokens(text_dir, tmp_path):
    dm = text_datamodule(text_dir, tmp_path, seq_len=16, val_windows=5, val_batch_size=2)
    val = torch.cat(list(dm.val_dataloader()))
    assert val.shape == (5, 17)
    assert torch.equal(val, torch.cat(list(dm.val_dataloader()))), "validation windows are fixed"
    stream = dm.eval_tokens("val")
    assert len(stream) == dm.cache.n_tokens("val")
    starts = [
        next(s for s in range(0, len(stream) - 16, 16) if torch.equal(stream[s : s + 17], w)) for w in val
    ]
    assert starts == sorted(starts) and len(set(starts)) == 5, "windows are distinct grid positions"
    assert all(b - a >= 16 for a, b in itertools.pairwise(starts)), "targets do not overlap"
    assert torch.equal(dm.eval_tokens("test", 100), dm.eval_tokens("test")[:100])
    assert dm.eval_tokens("val", 50).dtype == torch.int64
    with pytest.raises(ConfigError, match="the split has"):
        dm.eval_tokens("val", len(stream) + 1)
    assert next(iter(dm.test_dataloader())).shape == (2, 17)


def test_from_hydra_config(text_dir, tmp_path):
    from helpers.runs import compose

    cfg = compose(
        [
            "data=text_dir",
            f"data.path={text_dir}",
            "data.seq_len=24",
            "data.recall_mix=0.0",  # 24-token windows are too short for a recall sequence
            "data.batch_size=3",
            "tokenizer=bpe",
            "tokenizer.vocab_size=300",
            f"paths.cache_dir={tmp_path}",
            "seed=5",
        ]
    )
    dm = build_datamodule(cfg, cfg.data.batch_size)
    dm.setup()
    assert dm.train_dataset().batch(0).tokens.shape == (3, 25) and dm.seed == 5
    assert dm.vocab_size == 300 + 128 and dm.cache.path.is_relative_to(tmp_path)
    assert dm.fingerprint["corpus"]["glob"] == "**/*.txt"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("seq_len", [0, -5])
def test_seq_len_must_be_positive(seq_len, text_dir, tmp_path):
    with pytest.raises(ConfigError, match="data.seq_len"):
        LMDataModule(
            data=text_source(text_dir), tokenizer="byte", seq_len=seq_len, batch_size=2, cache_dir=str(tmp_path)
        )


def test_seq_len_longer_than_val_split(text_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"data.seq_len=100000 .*split has only"):
        text_datamodule(text_dir, tmp_path, tokenizer="byte", seq_len=100_000)
