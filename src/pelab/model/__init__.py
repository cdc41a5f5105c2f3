"""The decoder-only GPT and its attention dispatch."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.model.attention import causal_attention, reference_attention
from pelab.model.gpt import GPT, GPTConfig


def build_model(model_cfg: Any, pe_cfg: Any, vocab_size: int, train_length: int | None = None) -> GPT:
    """GPT from a ``conf/model/*.yaml`` mapping (its ``name`` key is a label and is ignored) and a
    ``conf/pe/*.yaml`` config; ``train_length`` is the training length (data.seq_len), which fills the
    encoding's settings that mean "the training length"."""
    from pelab.encodings import build_encoding

    fields = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    fields.pop("name", None)
    config = GPTConfig(vocab_size=vocab_size, train_length=train_length, **fields).validate()
    return GPT(config, build_encoding(pe_cfg, config.d_model, config.n_heads, train_length))


__all__ = ["GPT", "GPTConfig", "build_model", "causal_attention", "reference_attention"]
