"""Calling an encoding the way the model does (its per-forward state prepared first)."""

from __future__ import annotations


def rotate(pe, q, k, pos):
    """An encoding's rotation of q, k at positions ``pos``."""
    return pe.rotate(q, k, pe.prepare(pos))


def embed(pe, x, pos):
    """What an encoding adds to token vectors x at positions ``pos``."""
    return pe.embed(x, pe.prepare(pos))
