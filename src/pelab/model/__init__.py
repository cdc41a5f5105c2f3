"""The decoder-only GPT and its attention dispatch."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.encodings import build_encoding
from pelab.model.attention import attention_paths, causal_attention, reference_attention
from pelab.model.gpt import GPT, GPTConfig
from pelab.model.paths import reset_attention_paths


def build_model(model_cfg: Any, pe_cfg: Any, vocab_size: int, train_length: int | None = None) -> GPT:
    """GPT from a ``conf/model/*.yaml`` mapping and a ``conf/pe/*.yaml`` config; ``train_length`` is the
    training length (data.seq_len), which fills the encoding's settings that mean "the training length"."""
    settings = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    config = GPTConfig.from_settings(settings, vocab_size, train_length)
    return GPT(config, build_encoding(pe_cfg, config.d_model, config.n_heads, train_length))


__all__ = ["GPT", "GPTConfig", "attention_paths", "build_model", "causal_attention", "reference_attention",
           "reset_attention_paths"]
