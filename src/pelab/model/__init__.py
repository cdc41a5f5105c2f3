"""The decoder-only GPT and its attention dispatch."""

from __future__ import annotations

from typing import Any

from pelab.model.attention import causal_attention, reference_attention
from pelab.model.gpt import GPT, GPTConfig


def build_model(model_cfg: Any, pe_cfg: Any, vocab_size: int, seq_len: int | None = None) -> GPT:
    """GPT from a ``conf/model/*.yaml`` mapping (its ``name`` key is a label and is ignored) and a
    ``conf/pe/*.yaml`` mapping (dicts or DictConfigs). ``seq_len`` is the training length: it fills
    RoPE scaling's ``original_max_position`` when the config leaves it null."""
    from pelab.encodings import _plain, build_encoding

    fields = {key: value for key, value in _plain(model_cfg).items() if key != "name"}
    pe = _plain(pe_cfg)
    scaling = pe.get("scaling")
    if isinstance(scaling, dict) and scaling.get("original_max_position") is None and seq_len is not None:
        pe["scaling"] = {**scaling, "original_max_position": int(seq_len)}
    config = GPTConfig(vocab_size=vocab_size, **fields).validate()
    return GPT(config, build_encoding(pe, config.d_model, config.n_heads))


__all__ = ["GPT", "GPTConfig", "build_model", "causal_attention", "reference_attention"]
