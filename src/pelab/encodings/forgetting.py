"""The Forgetting Transformer (FoX; Lin, Nikishin, He & Courville, ICLR 2025, arXiv 2503.02130): a per-head
forget gate read from each layer's input decays the attention logits, so positions depend on the data.

For the layer input x (B, T, D) (the normed residual that q, k, v are projected from) and head h:

  log f_t = logsigmoid(w_h . x_t + b_h)                 the forget gate, in (0, 1), one per token and head
  c_i     = sum_{l<=i} log f_l                          its running log-product
  bias_ij = c_i - c_j = sum_{j<l<=i} log f_l  <= 0      added to q_i . k_j / sqrt(Dh) before the softmax

The basic FoX, not "FoX Pro" (its output gate, output norm, QK-norm and key-value shift would confound a
comparison of position signals). With ``pe.rope=true`` the layer also rotates q and k (the paper's "FoX +
RoPE" ablation; the default FoX uses none). The bias is ``c[..., q0:q1, None] - c[..., None, :q1]`` per query
chunk, so memory stays O(H * chunk * T) like every other score bias on the chunked SDPA path.

Checked against (tests/test_references.py): x-transformers' ``DataDependentAlibi`` (the same gate and bias,
computed as ``cumsum`` then an outer difference) and the naive PyTorch reference of the FoX kernel's test,
``test_op`` in zhixuan-lin/forgetting-transformer ``src/forgetting_transformer/ops/forgetting_attention.py``
(``log_lambda = cumsum(log_fgate); decay_bias = log_lambda[..., :, None] - log_lambda[..., None, :]``).

The gate's weights are each layer's own: ``layer_input_bias()`` (the contract's per-layer hook, ``base.py``)
gives the model one ``ForgetGate`` per attention layer, initialised as the reference's "full" gate
(``nn.Linear(hidden, heads, bias=True)``, N(0, 0.02) weights; bias ``pe.gate_bias_init``, 0 there: f = 1/2 at
the start; x-transformers starts at 5, f = 0.993). They are layer parameters: counted in the model's
non-embedding parameters (D * H + H per layer), not in the encoding's.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from pelab.encodings.base import PositionState
from pelab.encodings.rotary import RoPE
from pelab.encodings.settings import FoXConfig
from pelab.score_bias import BiasFn


class ForgetGate(nn.Module):
    """One layer's forget gate: x (B, T, D) -> the FoX score bias of that layer, per query chunk."""

    def __init__(self, d_model: int, n_heads: int, bias_init: float):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads, bias=True)
        nn.init.normal_(self.proj.weight, mean=0.0, std=0.02)  # the reference's initializer_range
        nn.init.constant_(self.proj.bias, bias_init)

    def forward(self, x: Tensor, state: PositionState) -> BiasFn:
        # fp32 before the logsigmoid, as the reference asks: the cumsum of T small negatives loses bits in bf16
        log_f = F.logsigmoid(self.proj(x).float()).transpose(1, 2)  # (B, H, T)
        c = log_f.cumsum(-1)  # (B, H, T): c_i = sum_{l<=i} log f_l

        def bias_fn(q0: int, q1: int) -> Tensor:  # queries q0..q1-1 against keys 0..q1-1
            return c[..., q0:q1, None] - c[..., None, :q1]  # (B, H, C, q1); future entries are masked later

        return bias_fn


class FoX(RoPE):
    """Forget-gate decay of the logits (see the module docstring); a RoPE only when ``rope`` is true."""

    Config = FoXConfig
    has_layer_input_bias = True

    def __init__(self, d_model: int, n_heads: int, *, rope: bool, gate_bias_init: float, **rotary):
        super().__init__(d_model, n_heads, **rotary)
        # an instance flag: pe=fox rotates nothing (prepare makes no tables), pe=fox pe.rope=true is FoX + RoPE
        self.has_rotate = bool(rope)
        self.gate_bias_init = float(gate_bias_init)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return super().rotate(q, k, state) if self.has_rotate else (q, k)  # pe.rope=false: the no-op hook

    def layer_input_bias(self) -> nn.Module:
        return ForgetGate(self.d_model, self.n_heads, self.gate_bias_init)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rope={self.has_rotate}, gate_bias_init={self.gate_bias_init}"
