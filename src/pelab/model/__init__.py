"""The decoder-only GPT and its attention dispatch.

`GPTConfig` (the schema) is torch-free; the model names load torch on first use, so the command line can
validate a config without it."""

from __future__ import annotations

from typing import Any

from pelab.model.config import GPTConfig

_LAZY = {"GPT": "gpt", "attention_paths": "attention", "causal_attention": "attention",
         "reference_attention": "attention", "reset_attention_paths": "attention"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pelab.model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"pelab.model.{_LAZY[name]}"), name)


def build_model(model_cfg: Any, pe_cfg: Any, vocab_size: int, train_length: int | None = None) -> Any:
    """GPT from a ``conf/model/*.yaml`` mapping and a ``conf/pe/*.yaml`` config; ``train_length`` is the
    training length (data.seq_len), which fills the encoding's settings that mean "the training length"."""
    from omegaconf import DictConfig, OmegaConf

    from pelab.encodings import build_encoding
    from pelab.model.gpt import GPT

    settings = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    config = GPTConfig.from_settings(settings, vocab_size, train_length)
    return GPT(config, build_encoding(pe_cfg, config.d_model, config.n_heads, train_length))


__all__ = ["GPT", "GPTConfig", "attention_paths", "build_model", "causal_attention", "reference_attention",
           "reset_attention_paths"]
