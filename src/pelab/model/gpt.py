"""A small decoder-only GPT (nanoGPT-style) whose positions come only from a PositionEncoding.

The model calls the encoding's hooks by their flags (has_embed / has_rotate / has_content_bias /
has_layer_input_bias) and never asks which encoding it holds. Per forward, ``pe.prepare(pos)`` does the
position-dependent work once (rotary tables, score bias) and its ``PositionState`` is passed to every layer
explicitly; a layer-input bias (FoX's forget gate) is a module of each layer, built by the encoding.

A layout (``model.layout``, ``pelab.model.layout``) gives each layer its own encoding, attention span and
temperature: each distinct encoding is one module (shared by its layers) prepared once per forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pelab.encodings import PositionEncoding, PositionState, build_encoding
from pelab.model.attention.dispatch import causal_attention
from pelab.model.attention.logits import observed_attention
from pelab.model.attention.span import Span, visible_keys
from pelab.model.attention.stickbreaking import stickbreaking_attention
from pelab.model.config import GPTConfig
from pelab.model.layout import LayerSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, spec: LayerSpec | None = None):
        super().__init__()
        spec = spec or LayerSpec(pe="")
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)  # fused q, k, v
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.proj.is_residual_proj = True  # scaled init (GPT-2)
        self.dropout = config.dropout
        self.resid_drop = nn.Dropout(config.dropout)
        self.chunk_size = config.attn_chunk_size
        self.backend = config.attn_backend
        self.attention = config.attention  # softmax | stickbreaking
        # Past this many keys, logits scale by log(n)/log(L) (model.attn_logit_scale=log_length); None = off.
        self.scale_from = config.train_length if config.attn_logit_scale == "log_length" else None
        # Evaluation-time diagnostics (pelab.evaluation.attention_stats) set a callable here; None in training.
        self.observer: Callable | None = None
        # The layer's place in a layout: local span, logit temperature, q/k norm (None / "none" / False: plain)
        self.span = Span(spec.span, spec.size) if spec.local else None
        self.temperature = spec.temperature
        self.qk_norm = spec.qk_norm
        self.rotate_heads = spec.rotate_heads  # 0 = every head
        if spec.temperature == "ssmax":  # s per head, learned (Nakanishi 2025); no weight decay (1-D)
            self.ssmax_scale = nn.Parameter(torch.full((config.n_heads,), float(config.ssmax_init)))
        self.floor_scale, self.attn_scale = config.temperature_floor_scale, config.temperature_attn_scale
        # The encoding's per-layer module that reads this layer's input (FoX's forget gate), set by GPT
        # after its own init (PositionEncoding.layer_input_bias); None for every other encoding
        self.input_bias: nn.Module | None = None

    def forward(self, x: Tensor, pe: PositionEncoding, state: PositionState, q_start: int = 0) -> Tensor:
        """x (B, T, D) -> (B, T - q_start, D): the outputs of queries q_start..T-1 (keys are all T rows)."""
        B, T, D = x.shape
        # (B, T, 3D) -> 3 x (B, H, T, Dh); q of every row too: rotation and CoPE index the full tensors
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if pe.has_rotate and self.rotate_heads:  # the last n heads rotate, the others keep no position signal
            n = self.rotate_heads  # (x-transformers' rotate_num_heads; tests/test_references.py)
            q_rot, k_rot = pe.rotate(q[:, -n:], k[:, -n:], state)
            q, k = torch.cat([q[:, :-n], q_rot], dim=1), torch.cat([k[:, :-n], k_rot], dim=1)
        elif pe.has_rotate:
            q, k = pe.rotate(q, k, state)
        if self.qk_norm:  # after the rotation, as HF Llama 4 (use_qk_norm)
            q, k = rms_normalise(q), rms_normalise(k)
        if self.temperature != "none":
            q = (q * self._temperature(state.pos, T, q.device)).to(q.dtype)
        bias, backend = state.bias, self.backend
        if pe.has_content_bias:
            bias, backend = self._content_bias_fn(pe, q, k, state), "sdpa"  # per layer: chunked SDPA path
        elif self.input_bias is not None:  # from this layer's input x, per layer: chunked SDPA path
            bias, backend = self.input_bias(x, state), "sdpa"
        dropout_p = self.dropout if self.training else 0.0
        # a local layer's queries see at most span < L keys: log-length scaling is 1 there, the fused path stays
        scaled = (self.scale_from is not None and T > self.scale_from
                  and (self.span is None or self.span.size > self.scale_from))
        if self.attention == "stickbreaking":  # no softmax: neither the kernels below nor explicit logits
            if self.observer is not None:
                raise ValueError("eval.diagnostics reads softmax attention; model.attention=stickbreaking has none: "
                                 "set eval.diagnostics.enabled=false")
            y = stickbreaking_attention(q, k, v, bias, self.chunk_size, dropout_p, q_start, scheme=pe.name,
                                        span=self.span)
        elif self.observer is None and not scaled:  # always in training (T <= L): the fused kernels
            y = causal_attention(q, k, v, bias, chunk_size=self.chunk_size, dropout_p=dropout_p, backend=backend,
                                 q_start=q_start, scheme=pe.name, span=self.span)
        else:  # explicit logits: scaled past L and / or shown to the diagnostics
            # an observer's statistics are over every query: with one, all rows are computed, then sliced
            first = q_start if self.observer is None else 0
            y = observed_attention(q, k, v, bias, self.chunk_size, self.scale_from if scaled else None,
                                   self.observer, q_start=first, scheme=pe.name,
                                   span=self.span)[..., q_start - first:, :]
        y = y.transpose(1, 2).reshape(B, T - q_start, D)  # (B, T - q_start, D)
        return self.resid_drop(self.proj(y))

    def _temperature(self, pos: Tensor, T: int, device: torch.device) -> Tensor:
        """The query multiplier of this layer's temperature, broadcastable to q (B, H, T, Dh).

        ssmax: s_h * log n, n = the keys query row i sees (i + 1, fewer in a local span): Scalable-Softmax
        (Nakanishi 2025, arXiv 2501.19399) multiplies the logits by it; on q it is the same for encodings without
        a score bias (a score bias is left unscaled). (H, T, 1).
        llama4_temp: log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1 at absolute position pos (HF
        transformers Llama4TextAttention, attn_temperature_tuning; checked in tests/test_references.py).
        (T, 1) or (B, 1, T, 1) for per-row positions."""
        if self.temperature == "ssmax":
            n = visible_keys(self.span, 0, T, device).float()  # (T,)
            return self.ssmax_scale[:, None, None] * n.log()[:, None]  # (H, T, 1)
        scale = torch.log1p(torch.floor((pos.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
        return scale[..., None] if pos.dim() == 1 else scale[:, None, :, None]

    @staticmethod
    def _content_bias_fn(pe: PositionEncoding, q: Tensor, k: Tensor, state: PositionState
                         ) -> Callable[[int, int], Tensor]:
        def bias_fn(q0: int, q1: int) -> Tensor:  # queries q0..q1-1 against keys 0..q1-1
            return pe.content_bias(q[..., q0:q1, :], k[..., :q1, :], q0, state)

        return bias_fn


def rms_normalise(x: Tensor, eps: float = 1e-5) -> Tensor:
    """x / rms(x) over the last dim, computed in fp32, no weight: HF Llama 4's Llama4TextWeightlessRMSNorm (q, k of
    its RoPE layers; L2-normalised times sqrt(Dh)); eps = Llama4TextConfig.rms_norm_eps."""
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=config.bias)
        self.proj.is_residual_proj = True
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x)). With ``d_ff=0`` an attention-only block, x + attn(ln(x)):
    no MLP and no second norm (``ln_2`` and ``mlp`` are None), as in the attention-only transformers of Olsson et
    al. 2022 and the 137K-parameter MHA models of Mamba's induction-heads table (Gu & Dao 2023, App. E.1)."""

    def __init__(self, config: GPTConfig, spec: LayerSpec | None = None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config, spec)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias) if config.d_ff else None
        self.mlp = MLP(config) if config.d_ff else None

    def forward(self, x: Tensor, pe: PositionEncoding, state: PositionState, q_start: int = 0) -> Tensor:
        """(B, T, D) -> (B, T - q_start, D): rows q_start..T-1, which attend to all T rows."""
        residual = x[:, q_start:] if q_start else x
        x = residual + self.attn(self.ln_1(x), pe, state, q_start)
        if self.mlp is None:  # attention-only block (model.d_ff=0)
            return x
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, pe: PositionEncoding):
        super().__init__()
        config.validate()
        if (pe.d_model, pe.n_heads) != (config.d_model, config.n_heads):
            raise ValueError(
                f"the encoding was built for d_model={pe.d_model}, n_heads={pe.n_heads} but the model has "
                f"d_model={config.d_model}, n_heads={config.n_heads}; build it with the model's sizes"
            )
        if pe.has_bias + pe.has_content_bias + pe.has_layer_input_bias > 1:
            raise NotImplementedError(
                f"pe={pe.name} sets more than one of has_bias, has_content_bias, has_layer_input_bias; "
                "fold its biases into one hook"
            )
        self.config = config
        self.pe = pe
        self.layer_specs = config.layer_specs(pe.name)
        if pe.name not in {spec.pe for spec in self.layer_specs}:
            raise ValueError(f"model.layout names no layer with the model's encoding pe={pe.name}; add one")
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, spec) for spec in self.layer_specs)
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # The model's own modules are initialised here; the encoding initialises its own parameters.
        if config.init == "gpt2":
            for module in (self.tok_emb, self.blocks, self.ln_f):
                module.apply(self._init_weights)
        else:  # kaiming: nn.Linear / nn.LayerNorm keep PyTorch's defaults (the untied head too)
            nn.init.kaiming_normal_(self.tok_emb.weight)  # (V, D): fan_in = D, std sqrt(2 / D)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        others = sorted({spec.pe for spec in self.layer_specs} - {pe.name})
        if others:  # only with a layout: the model without one keeps its state_dict keys and its RNG draws
            self.layer_pes = nn.ModuleDict({name: self._layer_encoding(name) for name in others})
        unrotated = sorted({s.pe for s in self.layer_specs if s.rotate_heads and not self.encodings()[s.pe].has_rotate})
        if unrotated:
            raise ValueError(f"model.layout: +rotate_heads needs a rotary encoding; pe {unrotated[0]} does not rotate "
                             "q and k (use rope or xpos, or drop +rotate_heads)")
        whole = sorted({s.pe for s in self.layer_specs if s.rotate_heads and not self.encodings()[s.pe].rotates_head_subset}
                       - set(unrotated))
        if whole:  # FoPE's per-head series, a piecewise scaling's far-pair scores: every head would get positions
            raise ValueError(f"model.layout: +rotate_heads rotates the last n heads only, but pe {whole[0]} positions every "
                             "head (FoPE's per-head coefficients, or a piecewise pe.scaling.type); drop +rotate_heads")
        for block, spec in zip(self.blocks, self.layer_specs, strict=True):  # last: other encodings' draws unchanged
            if self.encodings()[spec.pe].has_layer_input_bias:
                block.attn.input_bias = self.encodings()[spec.pe].layer_input_bias()

    def _layer_encoding(self, name: str) -> PositionEncoding:
        """A layout's encoding other than the model's own: conf/pe/<name>.yaml's defaults at the model's sizes."""
        c = self.config
        pe = build_encoding(name, c.d_model, c.n_heads, c.train_length)
        if pe.has_embed:
            raise ValueError(f"model.layout: pe {name} adds position vectors to the input (embed), which is not "
                             f"per layer; use it as the run's encoding (pe={name})")
        if pe.has_bias + pe.has_content_bias + pe.has_layer_input_bias > 1:
            raise NotImplementedError(f"pe={name} sets more than one of has_bias, has_content_bias, "
                                      "has_layer_input_bias")
        return pe

    def encodings(self) -> dict[str, PositionEncoding]:
        """Every encoding a layer uses, by name: the model's own first, then the layout's others."""
        others = self.layer_pes.items() if hasattr(self, "layer_pes") else ()
        return {self.pe.name: self.pe, **dict(others)}

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_proj", False):
                std = 0.02 / math.sqrt(2 * self.config.n_layers)  # residual stream grows with depth
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def score_keys(self, length: int) -> int:
        """The memory estimate's key columns at `length` tokens: the most that one query chunk of a layer whose
        path materialises its scores reads (a local layer: chunk + span - 1; a global layer with a score, content or
        layer-input bias, or stick-breaking attention: `length`); 0 when no layer materialises them (SDPA without a
        mask: flash / fused kernels)."""
        encodings = self.encodings()
        keys = [length if b.attn.span is None else b.attn.span.keys(self.config.attn_chunk_size, length)
                for b, spec in zip(self.blocks, self.layer_specs, strict=True)
                if b.attn.span is not None or b.attn.input_bias is not None or encodings[spec.pe].has_bias
                or encodings[spec.pe].has_content_bias or b.attn.attention == "stickbreaking"]
        return max(keys, default=0)

    def num_params(self, exclude_embedding: bool = True) -> int:
        """Unique parameters. ``exclude_embedding``: the non-embedding count of Kaplan et al. (2020), the
        blocks and the final norm: without the vocabulary's matrices (the token embedding and the LM head, tied
        or not) and the encoding's parameters (position and bias tables). nanoGPT's
        ``get_num_params(non_embedding=True)`` subtracts only its position table and keeps the tied head: that
        count is `matmul_params`."""
        excluded = ({id(p) for m in (self.tok_emb, self.lm_head, *self.encodings().values()) for p in m.parameters()}
                    if exclude_embedding else set())
        return sum(p.numel() for p in self.parameters() if id(p) not in excluded)

    def matmul_params(self) -> int:
        """The N of the 6N FLOPs-per-token estimate (PaLM, nanoGPT): the non-embedding parameters and the LM
        head's matrix, which a token multiplies by (tied or not); the input embedding and the encoding's
        tables are lookups."""
        return self.num_params(exclude_embedding=True) + self.lm_head.weight.numel()

    def positions(self, idx: Tensor, pos: Tensor | None, start: int) -> tuple[Tensor, int | None]:
        """The position tensor, and its largest value (inclusive) when known without a device sync."""
        B, T = idx.shape
        if pos is None:
            if start < 0:
                raise ValueError(f"start must be >= 0; got {start}")
            return torch.arange(start, start + T, device=idx.device), start + T - 1
        if pos.dim() not in (1, 2) or pos.shape[-1] != T or (pos.dim() == 2 and pos.shape[0] != B):
            raise ValueError(f"pos must have shape ({T},) or ({B}, {T}); got {tuple(pos.shape)}")
        return pos.to(device=idx.device, dtype=torch.long), None

    def hidden(self, idx: Tensor, pos: Tensor | None = None, start: int = 0, from_index: int = 0) -> Tensor:
        """idx (B, T) token ids -> the final hidden states (B, T - from_index, D) of the rows from_index..T-1,
        after ln_f and before the LM head (a caller that needs logits at a few positions applies ``lm_head``
        to those rows only). Positions: ``pos`` (T,) or (B, T), else arange(start, start + T).

        ``from_index`` > 0 (evaluation of the last rows, e.g. probe answers): every block but the last runs
        on all rows (the last one's keys need them); the last block's attention, MLP and ln_f run on rows
        from_index..T-1 only. ``from_index`` is a row index, not a position (with ``start`` they differ)."""
        T = idx.shape[1]
        if not 0 <= from_index < T:
            raise ValueError(f"from_index must be in [0, {T}) for a {T}-token input; got {from_index}")
        consecutive = pos is None
        pos, largest = self.positions(idx, pos, start)
        encodings = self.encodings()
        # once per encoding and forward, for every layer that uses it
        states = {name: pe.prepare(pos, consecutive, largest) for name, pe in encodings.items()}
        x = self.tok_emb(idx)  # (B, T, D)
        if self.pe.has_embed:
            x = self.pe.embed(x, states[self.pe.name])  # sum composition: still (B, T, D)
        x = self.drop(x)
        last = len(self.blocks) - 1
        for i, (block, spec) in enumerate(zip(self.blocks, self.layer_specs, strict=True)):
            x = block(x, encodings[spec.pe], states[spec.pe], from_index if i == last else 0)
        return self.ln_f(x)

    def forward(self, idx: Tensor, pos: Tensor | None = None, start: int = 0) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, V) fp32 (positions as in ``hidden``)."""
        return self.lm_head(self.hidden(idx, pos, start)).float()
