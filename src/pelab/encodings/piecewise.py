"""Piecewise relative positions for RoPE at evaluation: ReRoPE, Leaky ReRoPE, Self-Extend and STRING.

Each keeps RoPE's trained positions for the pairs (query i, key j) closer than a window w and gives the pairs at
distance d = i - j >= w a second position map (q at f(i), k at g(j)), merged per pair. Two scores per pair, so
not a position map of q and k alone:

  rerope        (Su 2023, https://kexue.fm/archives/9708; bojone/rerope rerope_patch.py)
                far: q at w, k at 0: relative position min(d, w)
  leaky_rerope  (the same; leaky_rerope_patch.py): frequencies / k, q shifted by w (k - 1):
                relative position w + (d - w) / k past the window (k = pe.scaling.factor)
  self_extend   (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325; datamllab/LongLM self_extend_patch/
                Llama_4_40.py): far: q at i // G + w - w // G, k at j // G (G = pe.scaling.group; the integer
                w // G of the fix 715c1e3, "We accidentally use '/'")
  string        (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", arXiv 2410.18745;
                HKUNLP/STRING string_for_llama.py): far: q at i - w + W, k at j: relative position d - w + W
                (w = its shifted offset S, W = pe.scaling.local)

How it runs in the attention path (the least new machinery): RoPE rotates q and k to their exact positions as
always, so the fused kernels score every pair as RoPE does; the encoding sets ``has_content_bias`` and its
``content_bias`` adds, per query chunk, (far score - RoPE score) on the far pairs and 0 elsewhere. The model's
existing content-bias path (chunked SDPA with an additive mask, O(H * chunk * T) memory, the same path CoPE takes)
then softmaxes exactly the merged scores of the references, which select per pair with torch.where (ReRoPE,
Self-Extend) or merge two flash-attention passes by log-sum-exp (STRING: the same softmax over the union of the
two key sets). The far q and k are the exact ones turned on by f(i) - i and g(j) - j (``far_offsets``), one
rotation each; pairs inside the window get exactly RoPE's scores. Cost: the two scores of the references as one
matmul over 2 Dh channels (q_far . k_far - q . k) besides SDPA's own, and SDPA with a mask, not the fused causal
kernel; memory one (B, H, chunk, T) tensor more than a score bias. Training-free methods, so evaluation only in
practice (with a gradient the content-bias path is the explicit one on CPU).

Where each is meant to work (docs/context_extension.md): ReRoPE and Self-Extend extend a model past its training
length L; Leaky ReRoPE too, up to w + (T - w) / k < L. STRING targets the effective length INSIDE L (the paper
applies it at the training length): its far distances d - w + W stay below L only while T <= L + w - W, so past
that it scores unseen distances like plain RoPE. PELab evaluates it at every length of a sweep (same tokens, same
statistics) and its claim is the in-window rows.

Deviations: STRING's prefill code (``string_flash_forward``) gives the near pass flash-attention's window
[S, 0], which is inclusive, so the key at distance exactly S is in both passes (with distance S and with W); its
decoding path and the paper's position matrix put it in the far part only, as here. Positions are
``state.pos``, so an evaluation offset or per-row positions move the groups as position_ids move them in the
references. The log-n query scaling of the ReRoPE patches (and Self-Extend's optional ``scale_base``) is the
model's ``model.attn_logit_scale=log_length`` (the same max(1, log(i + 1) / log L), on the merged logits), off
unless asked for, so that the sweep compares position maps alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def far_offsets(kind: str, q_pos: Tensor, k_pos: Tensor, *, window: int, factor: float = 1.0,
                group: int | None = None, local: int | None = None) -> tuple[Tensor, Tensor]:
    """How far past its exact position the far regime puts each query and each key: (f(i) - i, g(j) - j), fp32,
    shapes of ``q_pos`` (C,) or (B, C) and ``k_pos`` (K,) or (B, K) (integer positions). For leaky_rerope in units
    of the base frequencies: its far positions are (i + w (k - 1)) / k and j / k."""
    i, j = q_pos.to(torch.float32), k_pos.to(torch.float32)
    if kind == "rerope":
        return window - i, -j
    if kind == "leaky_rerope":
        return (i + window * (factor - 1.0)) / factor - i, j / factor - j
    if kind == "self_extend":
        shift = window - window // group
        qg = torch.div(q_pos, group, rounding_mode="floor").to(torch.float32)
        kg = torch.div(k_pos, group, rounding_mode="floor").to(torch.float32)
        return qg + shift - i, kg - j
    if kind == "string":
        return torch.full_like(i, float(local - window)), torch.zeros_like(j)
    raise ValueError(f"{kind!r} is not a piecewise scaling type")


def far_correction(q: Tensor, k: Tensor, q_far: Tensor, k_far: Tensor, q_pos: Tensor, k_pos: Tensor,
                   window: int) -> Tensor:
    """(q_far . k_far - q . k) / sqrt(Dh) where q_pos - k_pos >= window, else 0: the bias that turns the RoPE scores
    of q, k (B, H, C, Dh), (B, H, K, Dh) into the merged scores. fp32 (B, H, C, K); future keys are masked by the
    attention."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    near = (q_pos[..., :, None] - k_pos[..., None, :]) < window  # (C, K) or (B, C, K)
    if near.dim() == 3:
        near = near[:, None]  # (B, 1, C, K): the same pairs in every head
    # q_far . k_far - q . k as one matmul over the concatenated channels: one (B, H, C, K) tensor, not three
    both_q = torch.cat((q_far, -q), dim=-1).float()  # (B, H, C, 2 Dh)
    both_k = torch.cat((k_far, k), dim=-1).float()  # (B, H, K, 2 Dh)
    return torch.matmul(both_q, both_k.transpose(-2, -1)).mul_(scale).masked_fill_(near, 0.0)
