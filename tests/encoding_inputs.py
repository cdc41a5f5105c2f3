"""Shared by the encodings tests (tests/test_encodings*.py, tests/test_model.py): the sizes they build
encodings with, a micro model config, and a RoPE builder."""

from __future__ import annotations

from pelab.encodings import PositionEncoding, build_encoding

D, H = 32, 4
Dh = D // H
MICRO = {"n_layers": 2, "n_heads": H, "d_model": D, "attn_chunk_size": 512}


def rope(scaling: dict | None = None, d_model: int = D, n_heads: int = H, train_length: int | None = None,
         **knobs) -> PositionEncoding:
    scaling = dict(scaling or {})
    train_length = scaling.pop("train_length", train_length)  # the test tables keep L with the scaling
    return build_encoding({"name": "rope", "scaling": scaling, **knobs}, d_model, n_heads, train_length)
