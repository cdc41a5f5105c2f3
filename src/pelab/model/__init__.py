"""The decoder-only GPT and its attention dispatch."""

from __future__ import annotations

from typing import Any

from pelab.model.attention import causal_attention, reference_attention
from pelab.model.gpt import GPT, GPTConfig


def build_model(model_cfg: Any, pe_cfg: Any, vocab_size: int, seq_len: int | None = None) -> GPT:
    """GPT from a ``conf/model/*.yaml`` mapping (its ``name`` key is a label and is ignored) and a
    ``conf/pe/*.yaml`` mapping (dicts or DictConfigs). ``seq_len`` is the training length (see
    ``fill_training_length``)."""
    from pelab.encodings import _plain, build_encoding

    fields = {key: value for key, value in _plain(model_cfg).items() if key != "name"}
    pe = fill_training_length(_plain(pe_cfg), seq_len)
    config = GPTConfig(vocab_size=vocab_size, **fields).validate()
    return GPT(config, build_encoding(pe, config.d_model, config.n_heads))


def fill_training_length(pe: dict, seq_len: int | None) -> dict:
    """Settings left null in conf/pe/ that mean "the training length": RoPE scaling's
    ``original_max_position``, the learned table's ``max_positions`` (with randomized positions: their
    ``max_position``, the largest position training reaches) and CoPE's ``npos_max``."""
    if seq_len is None:
        return pe
    scaling = pe.get("scaling")
    if isinstance(scaling, dict) and scaling.get("original_max_position") is None:
        pe["scaling"] = {**scaling, "original_max_position": int(seq_len)}
    if "max_positions" in pe and pe["max_positions"] is None:
        randomized = pe.get("randomized") or {}
        pe["max_positions"] = int(randomized.get("max_position") or seq_len)
    if "npos_max" in pe and pe["npos_max"] is None:
        pe["npos_max"] = int(seq_len)
    return pe


__all__ = ["GPT", "GPTConfig", "build_model", "fill_training_length", "causal_attention", "reference_attention"]
