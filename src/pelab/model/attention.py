"""Causal attention: the single dispatch point for every encoding.

  no score bias     -> "sdpa_causal": F.scaled_dot_product_attention(is_causal=True) (flash / fused kernels)
  score bias        -> "sdpa_mask": SDPA with an additive float mask (bias + causal -inf), in query chunks of
                       ``chunk_size`` (keys only up to each chunk's last query): memory O(H*chunk*T); the
                       mask is passed 4-D, which SDPA's fused CPU kernel accepts (3-D -> math path). The
                       default on every device: on one H200 (B=16, H=6, T=1024, Dh=64, bf16, fwd+bwd) it took
                       0.55 ms where FlexAttention took 1.0 ms (and FlexAttention only compiled there with
                       smaller tiles, FLEX_CUDA_KERNEL_OPTIONS).
                    -> "explicit": on CPU, a mask that needs a gradient (a learned bias in training) goes
                       through ``explicit_attention`` (SDPA's fused CPU kernel gives no mask gradient)
  backend="flex"    -> "flex": FlexAttention with a score_mod adding the bias (compiled; causal block mask;
                       runs on CPU too under torch.compile); if it fails or is refused, a warning and the
                       SDPA path, with the reason recorded
Which path each scheme actually took is recorded per process (``attention_paths``: logged once per (scheme,
path) at INFO and written to summary.json), so that no fallback is silent.

The bias (``bias_fn``) is one of the forms of ``pelab.ops.bias`` (a tensor, ``CausalBias``, ``DistanceBias`` or a
per-chunk callable). All paths return the same numbers as ``reference_attention`` (explicit softmax); see tests/test_attention.py.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pelab.ops import BiasFn, CausalBias, DistanceBias, causal_additive_mask, future_mask

log = logging.getLogger(__name__)

ATTN_BACKENDS = ("auto", "sdpa", "flex")  # model.attn_backend

# FlexAttention materialises a callable bias for the whole sequence; above this many elements
# (H*T*T, times B for per-batch positions) the chunked SDPA path is used instead.
FLEX_MAX_BIAS_ELEMENTS = 64 * 2**20

# Distinct input signatures compiled with FlexAttention per process (each is one static-shape compile;
# dynamo's recompile limit is 8); further signatures use the chunked SDPA path.
FLEX_MAX_SIGNATURES = 8

# FlexAttention's tiles on CUDA for score_mods that read a bias table: with the defaults, an H200 (torch 2.11,
# triton 3.6; bf16, Dh=64, an fp32 (H, T, T) table) found "No valid triton configs" (shared memory: 245760 B
# required, 232448 B available); these compiled and ran there.
FLEX_CUDA_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}

_flex_state: dict = {"compiled": None, "error": None, "block_masks": {}, "verified": set()}


# ---- which path ran: per process, per scheme ----------------------------------------------------------------
_paths: dict[str, dict[str, dict]] = {}  # scheme -> path -> {"reason", "first_call", "compiled"}


def note_path(scheme: str, path: str, reason: str | None, signature: str, compiled: bool) -> None:
    """Record that ``scheme``'s attention ran on ``path`` (and why not a faster one); logged once per
    (scheme, path). Under torch.compile it is called after each compiled graph runs, never traced
    (registered with dynamo below), so recording adds no graph break and no recompile."""
    entry = _paths.setdefault(scheme, {})
    if path in entry:
        return
    entry[path] = {"reason": reason, "first_call": signature, "compiled": compiled}
    log.info("attention: pe=%s takes the %s path (%s)%s%s", scheme, path, signature,
             f"; {reason}" if reason else "", " under torch.compile" if compiled else "")


if hasattr(torch._dynamo.config, "reorderable_logging_functions"):
    torch._dynamo.config.reorderable_logging_functions.add(note_path)


def attention_paths() -> dict:
    """What this process's attention did so far, for summary.json: {"paths": {scheme: {path: {reason,
    first_call, compiled}}}, "flex_error": the FlexAttention failure that disabled it, or None}."""
    return {"paths": {s: {p: dict(v) for p, v in paths.items()} for s, paths in _paths.items()},
            "flex_error": _flex_state["error"]}


def reset_attention_paths() -> None:
    _paths.clear()


def _note(scheme: str | None, path: str, reason: str | None, q: Tensor, bias_fn: BiasFn | None) -> None:
    if scheme is None:  # internal calls (e.g. the flex self-check) are not the model's attention
        return
    kind = "none" if bias_fn is None else type(bias_fn).__name__
    B, H, T, Dh = q.shape
    signature = f"{q.device.type} {str(q.dtype).removeprefix('torch.')} B={B} H={H} T={T} Dh={Dh} bias={kind}"
    note_path(scheme, path, reason, signature, torch.compiler.is_compiling())


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
    scheme: str | None = None,
) -> Tensor:
    """q, k, v (B, H, T, Dh) -> (B, H, T, Dh), causal, with an optional score bias (see module doc).

    ``backend`` (model.attn_backend): "auto" and "sdpa": the SDPA paths; "flex": FlexAttention for a score
    bias (any device; on CPU under torch.compile), falling back to SDPA with a warning if it fails.
    ``q_start`` > 0: only the queries q_start..T-1 (against keys 0..T-1), (B, H, T - q_start, Dh) --
    evaluation of the last rows (``GPT.hidden(from_index=...)``); they take the chunked SDPA path whatever
    the bias (is_causal aligns a shorter query block top-left). ``scheme``: the label the path taken is
    recorded under (``attention_paths``); None records nothing.
    """
    if backend not in ATTN_BACKENDS:
        raise ValueError(f"model.attn_backend={backend} is unknown; choose one of {list(ATTN_BACKENDS)}")
    if q_start:
        return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p, q_start, scheme=scheme,
                                        reason="the last rows only (q_start > 0)")
    if bias_fn is None:
        _note(scheme, "sdpa_causal", None, q, None)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    reason = _sdpa_reason(q, backend, dropout_p)
    if reason is None:  # FlexAttention asked for and possible
        out, reason = _flex_biased_attention(q, k, v, bias_fn, strict=False)
        if out is not None:
            _note(scheme, "flex", "model.attn_backend=flex", q, bias_fn)
            return out
    return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p, scheme=scheme, reason=reason)


def _sdpa_reason(q: Tensor, backend: str, dropout_p: float) -> str | None:
    """Why a score bias takes the SDPA path rather than FlexAttention; None: try FlexAttention."""
    if backend == "sdpa":
        return "SDPA asked for: model.attn_backend=sdpa, or a content bias (CoPE: computed per layer and chunk)"
    if backend == "auto":
        if q.is_cuda:
            return ("model.attn_backend=auto: additive-mask SDPA, measured faster than FlexAttention on an H200 "
                    "(0.55 vs 1.0 ms fwd+bwd at B=16 H=6 T=1024 Dh=64 bf16)")
        return "model.attn_backend=auto"
    if dropout_p > 0.0:
        return "model.attn_backend=flex refused: FlexAttention has no attention dropout (model.dropout > 0)"
    if _flex_state["error"] is not None:
        return f"model.attn_backend=flex refused: FlexAttention failed earlier in this process ({_flex_state['error']})"
    return None


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


def chunked_biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, chunk_size: int = 1024, dropout_p: float = 0.0,
    q_start: int = 0, scheme: str | None = None, reason: str | None = None,
) -> Tensor:
    """SDPA with mask = bias + causal, one query chunk at a time (memory O(H * chunk * T)); queries
    q_start..T-1 only -> (B, H, T - q_start, Dh). No bias (None): the mask is the causal -inf alone.
    The path ("sdpa_mask" or "explicit") is recorded under ``scheme`` with ``reason`` (see note_path)."""
    if chunk_size < 1:
        raise ValueError(f"model.attn_chunk_size must be >= 1; got {chunk_size}")
    T = q.shape[-2]
    if not 0 <= q_start < T:
        raise ValueError(f"q_start must be in [0, {T}); got {q_start}")
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        qc, kc, vc = q[..., q0:q1, :], k[..., :q1, :], v[..., :q1, :]
        flipped = isinstance(bias_fn, DistanceBias)
        if flipped:
            # the chunk's mask lists queries in reverse order: flip the queries in and the outputs back
            qc, mask = qc.flip(-2), bias_fn.chunk(q0, q1)
        elif bias_fn is None:
            mask = causal_additive_mask(q.new_zeros(1, q1 - q0, q1), q0)  # (1, C, q1)
        else:
            mask = _bias_chunk(bias_fn, q0, q1)  # (H | B,H, C, q1)
            if not isinstance(bias_fn, CausalBias):
                mask = causal_additive_mask(mask, q0)
        if mask.dim() == 3:
            # (1, H, C, K) view: SDPA takes its fused CPU kernel for 4-D masks, the math path for 3-D ones
            mask = mask.unsqueeze(0)
        explicit = _needs_explicit(q, mask)
        if q0 == q_start:
            why = "CPU: the learned bias needs a mask gradient, which SDPA's fused CPU kernel does not give"
            _note(scheme, "explicit" if explicit else "sdpa_mask",
                  "; ".join(filter(None, (reason, why if explicit else None))), q, bias_fn)
        out = (explicit_attention if explicit else _sdpa_masked)(qc, kc, vc, mask.to(q.dtype), dropout_p)
        outs.append(out.flip(-2) if flipped else out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _needs_explicit(q: Tensor, mask: Tensor) -> bool:
    """A mask that needs a gradient (a learned bias in training) on CPU: SDPA would take its math path."""
    return mask.requires_grad and not q.is_cuda


def _sdpa_masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0) -> Tensor:
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
                       scale_from: int | None = None, observer: Callable | None = None, q_start: int = 0,
                       scheme: str | None = None) -> Tensor:
    """Causal attention through explicit logits, one query chunk at a time: optionally scaled by
    ``log_length_scale`` (``scale_from`` = L) and shown to ``observer(scores (B, H, C, K), q0)`` before the
    softmax. (B, H, T, Dh) -> (B, H, T - q_start, Dh): queries q_start..T-1. The model takes this path only
    when one of the two is asked for at evaluation; otherwise ``causal_attention`` runs unchanged."""
    why = [w for w, on in (("logits scaled past the training length", scale_from is not None),
                           ("attention statistics observed", observer is not None)) if on]
    _note(scheme, "explicit_logits", "evaluation: " + ", ".join(why), q, bias_fn)
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


# ---- FlexAttention (model.attn_backend=flex) ---------------------------------------------------------------
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


def _distance_score_mod(bias: DistanceBias) -> Callable:
    """score + table[h, T-1 - (q - k)]: a translation-invariant bias read per distance, (H, 2T-1), not per pair."""
    table, last = bias.table, bias.T - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, last - q_idx + kv_idx]

    return score_mod


def _flex_inputs(q: Tensor, bias_fn: BiasFn, strict: bool) -> tuple[Callable | None, tuple | str]:
    """The score_mod for ``bias_fn`` and the signature its compiled kernel is specialised on; or None and
    why FlexAttention is refused (a callable bias too large to materialise)."""
    T = q.shape[-2]
    if isinstance(bias_fn, DistanceBias):
        return _distance_score_mod(bias_fn), _flex_signature(q, bias_fn.table, "distance")
    if isinstance(bias_fn, CausalBias):
        bias = bias_fn.mask  # its -inf entries lie where the causal block mask masks anyway
    elif isinstance(bias_fn, Tensor):
        bias = bias_fn
    else:
        n_elements = q.shape[1] * T * T  # estimate for (H, T, T); a per-batch bias is B times larger
        if n_elements > FLEX_MAX_BIAS_ELEMENTS and not strict:
            return None, (f"model.attn_backend=flex refused: a {T}-token bias computed per chunk would be "
                          f"materialised whole (> {FLEX_MAX_BIAS_ELEMENTS} elements)")
        bias = bias_fn(0, T)
    return _score_mod(bias), _flex_signature(q, bias, "pairs")


def _flex_biased_attention(q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn, strict: bool
                           ) -> tuple[Tensor | None, str | None]:
    """FlexAttention with score + bias -> (output, None); or (None, why) for the caller to fall back to SDPA:
    refused (too large, too many compiled shapes), failed (a warning; flex is then off for this process)
    or disagreeing with SDPA on its first call for this signature (a warning). ``strict``: raise instead."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    T = q.shape[-2]
    score_mod, signature = _flex_inputs(q, bias_fn, strict)
    if score_mod is None:
        return None, signature
    # past dynamo's recompile limit flex would run eagerly (slow, O(T^2) memory): use SDPA for new shapes
    if not strict and len(_flex_state["verified"]) >= FLEX_MAX_SIGNATURES and signature not in _flex_state["verified"]:
        return None, f"model.attn_backend=flex refused: {FLEX_MAX_SIGNATURES} input shapes compiled already"
    options = dict(FLEX_CUDA_KERNEL_OPTIONS) if q.is_cuda else None
    if torch.compiler.is_compiling():
        # inside a compiled model dynamo traces flex directly: no process-level caches or self-check here
        block_mask = create_block_mask(_causal, None, None, T, T, device=q.device)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options), None
    try:
        if _flex_state["compiled"] is None:
            # static shapes: inductor's dynamic-shape CPU flex kernel fails to build (torch 2.13)
            _flex_state["compiled"] = torch.compile(flex_attention, dynamic=False)
        key = (T, str(q.device))
        block_mask = _flex_state["block_masks"].get(key)
        if block_mask is None:
            block_mask = create_block_mask(_causal, None, None, T, T, device=q.device)
            _flex_state["block_masks"][key] = block_mask
        out = _flex_state["compiled"](q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
    except Exception as err:  # any failure: disable flex for this process, use SDPA
        if strict:
            raise
        message = " ".join(f"{type(err).__name__}: {err}".split())[:500]
        _flex_state["error"] = message
        warnings.warn(f"FlexAttention failed ({message}); using chunked SDPA instead (recorded in "
                      "summary.json under attention)", stacklevel=3)
        return None, f"model.attn_backend=flex failed, fell back: {message}"
    if not strict and not _flex_matches_sdpa(out, q, k, v, bias_fn, signature):
        return None, f"model.attn_backend=flex fell back: {_flex_state['error']}"
    return out, None


def _flex_signature(q: Tensor, bias: Tensor, form: str) -> tuple:
    """What a static-shape compiled flex kernel is specialised on."""
    return (tuple(q.shape), q.dtype, str(q.device), form, tuple(bias.shape[:-2]), bias.dtype)


def _flex_matches_sdpa(out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn,
                       signature: tuple | None = None) -> bool:
    """Check a compiled FlexAttention kernel once per input signature against the SDPA path.

    Why: a compiled kernel is reused for every later call with the same signature, and we have seen
    inductor's on-disk cache hand back wrong flex kernels (CPU, torch 2.13). One extra attention and one
    host sync per new shape buys the guarantee that the fast path gives the reference numbers.
    """
    key = signature or _flex_inputs(q, bias_fn, strict=True)[1]
    if key in _flex_state["verified"]:
        return True
    with torch.no_grad():
        expected = chunked_biased_attention(q, k, v, bias_fn)
    # bf16 / fp16: each path rounds on its own (~1e-2 apart at T = 1024); a wrong kernel is off by O(1)
    tol = 1e-4 if q.dtype in (torch.float32, torch.float64) else 6e-2
    if torch.allclose(out.detach().float(), expected.float(), atol=tol, rtol=tol):
        _flex_state["verified"].add(key)
        return True
    _flex_state["error"] = "its output disagreed with SDPA's on a new input signature"
    warnings.warn("FlexAttention disagrees with SDPA on this input; using chunked SDPA from now on (recorded in "
                  "summary.json under attention)", stacklevel=3)
    return False
