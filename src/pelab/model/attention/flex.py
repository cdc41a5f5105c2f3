"""FlexAttention (model.attn_backend=flex): the score bias added by a compiled score_mod under a causal block
mask (causal and a local span's for a local layer of model.layout: FlexAttention skips the blocks outside it);
refused, or falling back to the SDPA path (``pelab.model.attention.sdpa``), when it cannot run or disagrees with it."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from pelab.model.attention.sdpa import chunked_biased_attention
from pelab.model.attention.span import Span
from pelab.score_bias import BiasFn, CausalBias, DistanceBias

# FlexAttention materialises a callable bias for the whole sequence; above this many elements
# (H*T*T, times B for per-batch positions) the chunked SDPA path is used instead.
FLEX_MAX_BIAS_ELEMENTS = 64 * 2**20

# Distinct input signatures compiled with FlexAttention per process (each is one static-shape compile;
# dynamo's recompile limit is 8); further signatures use the chunked SDPA path.
FLEX_MAX_SIGNATURES = 8

# FlexAttention's tiles on CUDA for score_mods that read a bias table: the default tiles need more shared
# memory than an H200 has, these smaller ones compile and run there (experiments/benchmarks/README.md).
FLEX_CUDA_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}

flex_state: dict = {"compiled": None, "error": None, "block_masks": {}, "verified": set()}


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def mask_mod(span: Span | None) -> Callable:
    """The block mask's predicate: causal, and inside a local span (``pelab.model.attention.span``: the same sets of keys)."""
    if span is None:
        return _causal
    size = span.size
    if span.kind == "window":

        def window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < size)

        return window

    def chunk(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx // size == kv_idx // size)

    return chunk


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


def flex_biased_attention(q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, strict: bool,
                           span: Span | None = None) -> tuple[Tensor | None, str | None]:
    """FlexAttention with score + bias -> (output, None); or (None, why) for the caller to fall back to SDPA:
    refused (too large, too many compiled shapes), failed (a warning; flex is then off for this process)
    or disagreeing with SDPA on its first call for this signature (a warning). ``strict``: raise instead.
    ``span``: a local layer's block mask (no bias: ``bias_fn`` None, no score_mod)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    T = q.shape[-2]
    if bias_fn is None:  # a local span alone
        score_mod, signature = None, (tuple(q.shape), q.dtype, str(q.device), "none")
    else:
        score_mod, signature = _flex_inputs(q, bias_fn, strict)
        if score_mod is None:
            return None, signature
    if span is not None:
        signature = (*signature, span)
    # past dynamo's recompile limit flex would run eagerly (slow, O(T^2) memory): use SDPA for new shapes
    if not strict and len(flex_state["verified"]) >= FLEX_MAX_SIGNATURES and signature not in flex_state["verified"]:
        return None, f"model.attn_backend=flex refused: {FLEX_MAX_SIGNATURES} input shapes compiled already"
    options = dict(FLEX_CUDA_KERNEL_OPTIONS) if q.is_cuda else None
    if torch.compiler.is_compiling():
        # inside a compiled model dynamo traces flex directly: no process-level caches or self-check here
        block_mask = create_block_mask(mask_mod(span), None, None, T, T, device=q.device)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options), None
    try:
        if flex_state["compiled"] is None:
            # static shapes: inductor's dynamic-shape CPU flex kernel fails to build (torch 2.13)
            flex_state["compiled"] = torch.compile(flex_attention, dynamic=False)
        key = (T, str(q.device)) if span is None else (T, str(q.device), span)
        block_mask = flex_state["block_masks"].get(key)
        if block_mask is None:
            block_mask = create_block_mask(mask_mod(span), None, None, T, T, device=q.device)
            flex_state["block_masks"][key] = block_mask
        out = flex_state["compiled"](q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
    except Exception as err:  # any failure: disable flex for this process, use SDPA
        if strict:
            raise
        message = " ".join(f"{type(err).__name__}: {err}".split())[:500]
        flex_state["error"] = message
        warnings.warn(f"FlexAttention failed ({message}); using chunked SDPA instead (recorded in "
                      "summary.json under attention)", stacklevel=3)
        return None, f"model.attn_backend=flex failed, fell back: {message}"
    if not strict and not flex_matches_sdpa(out, q, k, v, bias_fn, signature, span):
        return None, f"model.attn_backend=flex fell back: {flex_state['error']}"
    return out, None


def _flex_signature(q: Tensor, bias: Tensor, form: str) -> tuple:
    """What a static-shape compiled flex kernel is specialised on."""
    return (tuple(q.shape), q.dtype, str(q.device), form, tuple(bias.shape[:-2]), bias.dtype)


def flex_matches_sdpa(out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None,
                       signature: tuple | None = None, span: Span | None = None) -> bool:
    """Check a compiled FlexAttention kernel once per input signature against the SDPA path.

    Why: a compiled kernel is reused for every later call with the same signature, and we have seen
    inductor's on-disk cache hand back wrong flex kernels (CPU, torch 2.13). One extra attention and one
    host sync per new shape buys the guarantee that the fast path gives the reference numbers.
    """
    key = signature or _flex_inputs(q, bias_fn, strict=True)[1]
    if key in flex_state["verified"]:
        return True
    with torch.no_grad():
        expected = chunked_biased_attention(q, k, v, bias_fn, span=span)
    # bf16 / fp16: each path rounds on its own (~1e-2 apart at T = 1024); a wrong kernel is off by O(1)
    tol = 1e-4 if q.dtype in (torch.float32, torch.float64) else 6e-2
    if torch.allclose(out.detach().float(), expected.float(), atol=tol, rtol=tol):
        flex_state["verified"].add(key)
        return True
    flex_state["error"] = "its output disagreed with SDPA's on a new input signature"
    warnings.warn("FlexAttention disagrees with SDPA on this input; using chunked SDPA from now on (recorded in "
                  "summary.json under attention)", stacklevel=3)
    return False
