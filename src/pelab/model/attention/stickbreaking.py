"""Stick-breaking attention (Tan, Shen, Yang, Courville & Panda, "Scaling Stick-Breaking Attention", ICLR 2025,
arXiv 2410.17980): attention weights from a stick-breaking process over the keys, nearest first, instead of a
softmax. No position encoding is needed: the order of breaking is the position signal (use it with pe=nope).

For query i, logits z_ij = q_i . k_j / sqrt(Dh) (+ the encoding's score bias, if any) and keys j < i:

  beta_ij = sigmoid(z_ij)                            the share of what is left of the stick that key j takes
  A_ij    = beta_ij * prod_{j<k<i} (1 - beta_ik)     broken from the nearest key (i - 1) to the farthest (0)
  out_i   = sum_{j<i} A_ij v_j + (1 - sum_{j<i} A_ij) v_i   the remainder goes to the query's own value

computed in log space, log A_ij = logsigmoid(z_ij) + sum_{j<k<i} logsigmoid(-z_ik) (a reverse cumulative sum
over the keys), as the reference does. That is the reference's default, ``sb_attn(attend_current=False)`` with
``o + rem[..., None] * v`` (shawntan/stickbreaking-attention, ``tests/test_attn.py::ref_fwd`` and
``stickbreaking_attention/sb_ref.py``); ``attend_current=True`` lets key i take its share first (k <= i).

The naive O(T^2) form, one query chunk at a time (memory O(H * chunk * T), a few fp32 copies of the chunk's
logits), on every device; the reference's Triton kernels are not used. Checked against the reference's naive
formula and a loop over the definition (tests/test_references.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from pelab.model.attention.logits import causal_scores
from pelab.model.attention.record import note_call
from pelab.model.attention.span import Span
from pelab.score_bias import BiasFn


def stickbreaking_weights(z: Tensor, q0: int, attend_current: bool = False) -> Tensor:
    """Logits z (..., C, K) of queries q0..q0+C-1, -inf on keys a query cannot see -> weights A (..., C, K).

    A masked key (-inf) takes nothing (logsigmoid = -inf) and leaves the stick whole (logsigmoid(+inf) = 0).
    In place where autograd allows (no backward reads the overwritten tensors): at 16 x L the chunk's (B, H, C, K)
    copies are the evaluation's memory."""
    if not attend_current:  # the query's own key takes no share: it receives the remainder instead
        C, K = z.shape[-2:]
        own = torch.arange(K, device=z.device)[None, :] == torch.arange(q0, q0 + C, device=z.device)[:, None]
        z = z.masked_fill(own, float("-inf"))
    log_leave = F.logsigmoid(-z)  # log (1 - beta_ij)
    # sum over the keys nearer than j, k > j: a reverse cumsum without j's own term
    log_weights = log_leave.flip(-1).cumsum(-1).flip(-1).sub_(log_leave)
    del log_leave
    return log_weights.add_(F.logsigmoid(z)).exp_()  # + log beta_ij


def stickbreaking_attention(
    q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None = None, chunk_size: int = 512,
    dropout_p: float = 0.0, q_start: int = 0, scheme: str | None = None, span: Span | None = None,
    attend_current: bool = False,
) -> Tensor:
    """q, k, v (B, H, T, Dh) -> (B, H, T - q_start, Dh): stick-breaking attention of queries q_start..T-1, in query
    chunks of ``chunk_size``. ``bias_fn``: a score bias added to the logits (any form of ``pelab.score_bias``); ``span``:
    keys outside a local layer's span take nothing. Computed in fp32, returned in v's dtype."""
    if chunk_size < 1:
        raise ValueError(f"model.attn_chunk_size must be >= 1; got {chunk_size}")
    note_call(scheme, "stickbreaking", "model.attention=stickbreaking (naive O(T^2), in query chunks)", q, bias_fn)
    T = q.shape[-2]
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        weights = stickbreaking_weights(causal_scores(q, k, bias_fn, q0, q1, span), q0, attend_current)
        remainder = 1.0 - weights.sum(-1, keepdim=True)  # (B, H, C, 1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = weights @ v[..., :q1, :].float() + remainder * v[..., q0:q1, :].float()  # (B, H, C, Dh)
        outs.append(out.to(v.dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
