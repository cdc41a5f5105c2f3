"""Causal attention: the single dispatch point for every encoding.

  no score bias           -> F.scaled_dot_product_attention(is_causal=True)   (flash / fused kernels)
  score bias, CUDA        -> FlexAttention with a score_mod adding the bias (compiled; causal block mask)
  score bias, CPU/fallback-> SDPA with an additive float mask (bias + causal -inf), in query chunks of
                             ``chunk_size`` (keys only up to each chunk's last query): memory O(H*chunk*T);
                             the mask is passed 4-D, which SDPA's fused CPU kernel accepts (3-D -> math path);
                             a mask that needs a gradient (learned T5 bias, training) on CPU goes through
                             ``explicit_attention`` instead (the fused kernel gives no mask gradient)

The bias (``bias_fn``) is one of
  * a Tensor (H, T, T) or (B, H, T, T): the bias of every (query, key) pair; entries above the diagonal
    are ignored (masked here);
  * a ``CausalBias``: the same with the causal -inf already added -- what the model builds once per forward
    and shares across layers, so that each layer only slices it;
  * a callable ``bias_fn(q0, q1) -> Tensor (H | B,H, q1-q0, q1)``: the bias of queries q0..q1-1 against keys
    0..q1-1, computed on demand per query chunk, for inputs too long to materialise (H, T, T).
All paths return the same numbers as ``reference_attention`` (explicit softmax); see tests/test_attention.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class CausalBias:
    """A full (H, T, T) or (B, H, T, T) additive mask: score bias + causal -inf (see causal_bias)."""

    mask: Tensor


@dataclass(frozen=True)
class DistanceBias:
    """A translation-invariant bias + causal mask for T consecutive positions, as one value per distance:
    ``table[:, n]`` is the bias at distance (query - key) = T-1-n, n = 0..2T-2, and -inf where that distance
    is negative. The (C, K) mask of a query chunk is then a zero-copy strided view of it (``chunk``): memory
    O(H*T) for any chunk, where materialising the bias costs O(H*chunk*T) per chunk and layer.
    """

    table: Tensor  # (H, 2T-1)
    T: int

    def chunk(self, q0: int, q1: int) -> Tensor:
        """(1, H, q1-q0, q1) mask of queries q0..q1-1 against keys 0..q1-1, its rows in REVERSE query order.

        Row r (query i = q1-1-r), key j reads table[T - q1 + r + j], whose distance is i - j: the view
        steps +1 along both rows and keys (strides must be non-negative), hence the reversed rows."""
        t = self.table
        size, stride = (1, t.shape[0], q1 - q0, q1), (0, t.stride(0), 1, 1)
        return t.as_strided(size, stride, t.storage_offset() + self.T - q1)


def distance_bias(pe, T: int, device: torch.device) -> DistanceBias:
    """The encoding's per-distance bias table for positions 0..T-1 (any start, by translation invariance)."""
    keys = torch.arange(2 * T - 1, device=device)
    query = torch.full((1,), T - 1, device=device)
    values = pe.score_bias(query, keys)[:, 0]  # (H, 2T-1): distances T-1 .. -(T-1)
    return DistanceBias(values.masked_fill(keys > T - 1, float("-inf")).contiguous(), T)


BiasFn = Tensor | CausalBias | DistanceBias | Callable[[int, int], Tensor]

# FlexAttention materialises a callable bias for the whole sequence; above this many elements
# (H*T*T, times B for per-batch positions) the chunked SDPA path is used instead.
FLEX_MAX_BIAS_ELEMENTS = 64 * 2**20

# Distinct input signatures compiled with FlexAttention per process (each is one static-shape compile;
# dynamo's recompile limit is 8); further signatures use the chunked SDPA path.
FLEX_MAX_SIGNATURES = 8

_flex_state: dict = {"compiled": None, "failed": False, "block_masks": {}, "verified": set()}


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    """Plain causal softmax attention: softmax(q k^T / sqrt(Dh) + bias + causal) v. (B, H, T, Dh)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if bias is not None:
        scores = scores + bias
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias_fn: BiasFn | None = None,
    chunk_size: int = 1024,
    dropout_p: float = 0.0,
    backend: str = "auto",
    q_start: int = 0,
) -> Tensor:
    """q, k, v (B, H, T, Dh) -> (B, H, T, Dh), causal, with an optional score bias (see module doc).

    ``backend``: "auto" (as above), "sdpa" (never FlexAttention), "flex" (FlexAttention on any device,
    e.g. to test it on CPU under torch.compile). ``q_start`` > 0: only the queries q_start..T-1 (against
    keys 0..T-1), (B, H, T - q_start, Dh) -- evaluation of the last rows (``GPT.hidden(from_index=...)``);
    they take the chunked SDPA path whatever the bias (is_causal aligns a shorter query block top-left).
    """
    if q_start:
        return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p, q_start)
    if bias_fn is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    use_flex = backend == "flex" or (
        backend == "auto" and q.is_cuda and dropout_p == 0.0 and not _flex_state["failed"]
    )
    if use_flex:
        out = _flex_biased_attention(q, k, v, bias_fn, strict=backend == "flex")
        if out is not None:
            return out
    return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p)


# ---- SDPA with an additive mask, in query chunks -------------------------------------------------------
def _bias_chunk(bias_fn: BiasFn, q0: int, q1: int) -> Tensor:
    """Bias of queries q0..q1-1 against keys 0..q1-1: (..., q1-q0, q1)."""
    if isinstance(bias_fn, CausalBias):
        return bias_fn.mask[..., q0:q1, :q1]
    if isinstance(bias_fn, Tensor):
        return bias_fn[..., q0:q1, :q1]
    bias = bias_fn(q0, q1)
    if bias.shape[-2:] != (q1 - q0, q1):
        raise ValueError(
            f"bias_fn({q0}, {q1}) returned shape {tuple(bias.shape)}; expected (..., {q1 - q0}, {q1})"
        )
    return bias


def future_mask(q0: int, C: int, K: int, device: torch.device | None = None) -> Tensor:
    """(C, K) True where key j > query i, for queries q0..q0+C-1 and keys 0..K-1."""
    q_idx = torch.arange(q0, q0 + C, device=device)
    return torch.arange(K, device=device)[None, :] > q_idx[:, None]


def causal_additive_mask(bias: Tensor, q0: int) -> Tensor:
    """bias (..., C, K) for queries q0..q0+C-1 -> bias with -inf where key index > query index."""
    return bias.masked_fill(future_mask(q0, *bias.shape[-2:], device=bias.device), float("-inf"))


def causal_bias(bias: Tensor) -> CausalBias:
    """Add the causal mask to a full (..., T, T) bias once, for every layer of a forward to reuse."""
    return CausalBias(causal_additive_mask(bias, 0))


def chunked_biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, chunk_size: int = 1024, dropout_p: float = 0.0,
    q_start: int = 0,
) -> Tensor:
    """SDPA with mask = bias + causal, one query chunk at a time (memory O(H * chunk * T)); queries
    q_start..T-1 only -> (B, H, T - q_start, Dh). No bias (None): the mask is the causal -inf alone."""
    if chunk_size < 1:
        raise ValueError(f"model.attn_chunk_size must be >= 1; got {chunk_size}")
    T = q.shape[-2]
    if not 0 <= q_start < T:
        raise ValueError(f"q_start must be in [0, {T}); got {q_start}")
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        qc, kc, vc = q[..., q0:q1, :], k[..., :q1, :], v[..., :q1, :]
        if isinstance(bias_fn, DistanceBias):
            # the chunk's mask lists queries in reverse order: flip the queries in and the outputs back
            outs.append(_masked_attention(qc.flip(-2), kc, vc, bias_fn.chunk(q0, q1), dropout_p).flip(-2))
            continue
        if bias_fn is None:
            mask = causal_additive_mask(q.new_zeros(1, q1 - q0, q1), q0)  # (1, C, q1)
        else:
            mask = _bias_chunk(bias_fn, q0, q1)  # (H | B,H, C, q1)
            if not isinstance(bias_fn, CausalBias):
                mask = causal_additive_mask(mask, q0)
        if mask.dim() == 3:
            # (1, H, C, K) view: SDPA takes its fused CPU kernel for 4-D masks, the math path for 3-D ones
            mask = mask.unsqueeze(0)
        outs.append(_masked_attention(qc, kc, vc, mask, dropout_p))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float) -> Tensor:
    mask = mask.to(q.dtype)
    if mask.requires_grad and not q.is_cuda:
        # a learned bias (T5) needs dL/dscores: SDPA would take its math path, which is slower
        return explicit_attention(q, k, v, mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + mask) v with plain ops; the mask already holds the causal -inf.

    Why not SDPA's math path: it scales q and k separately, copies them, and uses a "safe" softmax that
    scans every score row for all -inf (never the case under a causal mask); this made the T5 training
    step 4-7% faster on CPU (experiments/benchmarks/README.md).
    """
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))  # (B, H, C, K)
    probs = torch.softmax(scores.add_(mask), dim=-1)  # in place: matmul's backward does not need scores
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v


# ---- explicit logits: evaluation-time diagnostics and logit scaling -----------------------------------------
def causal_scores(q: Tensor, k: Tensor, bias_fn: BiasFn | None, q0: int, q1: int) -> Tensor:
    """The pre-softmax logits of queries q0..q1-1 against keys 0..q1-1, fp32 (B, H, q1-q0, q1):
    q k^T / sqrt(Dh) + bias, -inf on future keys -- what every path above softmaxes. For evaluation-time
    paths only (attention statistics, per-query logit scaling); training never calls it."""
    qc, kc = q[..., q0:q1, :].float(), k[..., :q1, :].float()
    scores = qc @ kc.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, C, q1)
    if bias_fn is None:
        return scores.masked_fill(future_mask(q0, q1 - q0, q1, device=q.device), float("-inf"))
    if isinstance(bias_fn, DistanceBias):
        mask = bias_fn.chunk(q0, q1).flip(-2)  # rows back in query order
    else:
        mask = _bias_chunk(bias_fn, q0, q1)
        if not isinstance(bias_fn, CausalBias):
            mask = causal_additive_mask(mask, q0)
    return scores + mask.float()


def log_length_scale(q0: int, q1: int, train_length: int, device: torch.device | None = None) -> Tensor:
    """(q1-q0, 1) logit multipliers log(n)/log(L) for the query at index i, n = i + 1 keys, where n > L, and 1
    within the training window (Chiang & Cholak 2022): attention stays as peaked as at L instead of
    diluting over more keys. L >= 2."""
    n = torch.arange(q0 + 1, q1 + 1, device=device, dtype=torch.float32)
    return (n.log() / math.log(train_length)).clamp_min(1.0).where(n > train_length, torch.ones_like(n))[:, None]


def observed_attention(q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, chunk_size: int = 1024,
                       scale_from: int | None = None, observer: Callable | None = None, q_start: int = 0
                       ) -> Tensor:
    """Causal attention through explicit logits, one query chunk at a time: optionally scaled by
    ``log_length_scale`` (``scale_from`` = L) and shown to ``observer(scores (B, H, C, K), q0)`` before the
    softmax. (B, H, T, Dh) -> (B, H, T - q_start, Dh): queries q_start..T-1. The model takes this path only
    when one of the two is asked for at evaluation; otherwise ``causal_attention`` runs unchanged."""
    T = q.shape[-2]
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        scores = causal_scores(q, k, bias_fn, q0, q1)  # (B, H, C, q1)
        if scale_from is not None and q1 > scale_from:
            scores = scores * log_length_scale(q0, q1, scale_from, scores.device)
        if observer is not None:
            observer(scores, q0)
        outs.append((torch.softmax(scores, dim=-1) @ v[..., :q1, :].float()).to(v.dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


# ---- FlexAttention (CUDA) -------------------------------------------------------------------------------
def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _score_mod(bias: Tensor) -> Callable:
    """score + bias[h, q, k] for a (H, T, T) bias, score + bias[b, h, q, k] for (B, H, T, T)."""
    if bias.dim() == 3:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[h, q_idx, kv_idx]
    else:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[b, h, q_idx, kv_idx]

    return score_mod


def _flex_biased_attention(q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn, strict: bool) -> Tensor | None:
    """FlexAttention with score + bias[h, q, k]; None (caller falls back) if unavailable or too large."""
    T = q.shape[-2]
    if isinstance(bias_fn, CausalBias):
        bias = bias_fn.mask  # its -inf entries lie where the causal block mask masks anyway
    elif isinstance(bias_fn, DistanceBias):
        bias = bias_fn.chunk(0, T)[0].flip(-2)  # (H, T, T), rows back in query order
    elif isinstance(bias_fn, Tensor):
        bias = bias_fn
    else:
        n_elements = q.shape[1] * T * T  # estimate for (H, T, T); a per-batch bias is B times larger
        if n_elements > FLEX_MAX_BIAS_ELEMENTS and not strict:
            return None
        bias = bias_fn(0, T)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # past dynamo's recompile limit flex would run eagerly (slow, O(T^2) memory): use SDPA for new shapes
    n_compiled = len(_flex_state["verified"])
    if (
        not strict
        and n_compiled >= FLEX_MAX_SIGNATURES
        and _flex_signature(q, bias) not in _flex_state["verified"]
    ):
        return None

    if torch.compiler.is_compiling():
        # inside a compiled model dynamo traces flex directly: no process-level caches or self-check here
        block_mask = create_block_mask(_causal, None, None, T, T, device=q.device)
        return flex_attention(q, k, v, score_mod=_score_mod(bias), block_mask=block_mask)
    try:
        if _flex_state["compiled"] is None:
            # static shapes: inductor's dynamic-shape CPU flex kernel fails to build (torch 2.13)
            _flex_state["compiled"] = torch.compile(flex_attention, dynamic=False)
        key = (T, str(q.device))
        block_mask = _flex_state["block_masks"].get(key)
        if block_mask is None:
            block_mask = create_block_mask(_causal, None, None, T, T, device=q.device)
            _flex_state["block_masks"][key] = block_mask
        out = _flex_state["compiled"](q, k, v, score_mod=_score_mod(bias), block_mask=block_mask)
    except Exception as err:  # any failure: disable flex for this process, use SDPA
        if strict:
            raise
        _flex_state["failed"] = True
        warnings.warn(
            f"FlexAttention failed ({type(err).__name__}: {err}); using chunked SDPA instead", stacklevel=2
        )
        return None
    if not strict and not _flex_matches_sdpa(out, q, k, v, bias):
        return None
    return out


def _flex_signature(q: Tensor, bias: Tensor) -> tuple:
    """What a static-shape compiled flex kernel is specialised on."""
    return (tuple(q.shape), q.dtype, str(q.device), tuple(bias.shape[:-2]), bias.dtype)


def _flex_matches_sdpa(out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> bool:
    """Check a compiled FlexAttention kernel once per input signature against the SDPA path.

    Why: a compiled kernel is reused for every later call with the same signature, and we have seen
    inductor's on-disk cache hand back wrong flex kernels (CPU, torch 2.13). One extra attention and one
    host sync per new shape buys the guarantee that the fast path gives the reference numbers.
    """
    key = _flex_signature(q, bias)
    if key in _flex_state["verified"]:
        return True
    with torch.no_grad():
        expected = chunked_biased_attention(q, k, v, bias)
    tol = 1e-4 if q.dtype in (torch.float32, torch.float64) else 2e-2
    if torch.allclose(out.detach().float(), expected.float(), atol=tol, rtol=tol):
        _flex_state["verified"].add(key)
        return True
    _flex_state["failed"] = True
    warnings.warn(
        "FlexAttention disagrees with SDPA on this input; using chunked SDPA from now on", stacklevel=3
    )
    return False
