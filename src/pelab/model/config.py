"""The model's config schema, `GPTConfig` (the keys of conf/model/*.yaml). Torch-free, so that the command
line types and range-checks a model before importing torch (`pelab.tasks.config.validate`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pelab.checks import typed_group
from pelab.conf_values import store_defaults
from pelab.errors import ConfigError
from pelab.model.layout import LayerSpec, check_spans, expand_layout

if TYPE_CHECKING:
    from pelab.encodings.settings import PEConfig

ATTN_BACKENDS = ("auto", "sdpa", "flex")  # model.attn_backend
ATTENTIONS = ("softmax", "stickbreaking")  # model.attention
INITS = ("gpt2", "kaiming")
LOGIT_SCALES = ("none", "log_length")  # model.attn_logit_scale


@dataclass
class GPTConfig:
    """The model's config schema: the keys of conf/model/*.yaml (`name` is a label), plus `vocab_size` (from
    the tokenizer) and `train_length` (data.seq_len), which the harness fills."""

    vocab_size: int
    n_layers: int
    n_heads: int
    d_model: int
    name: str = "custom"
    # None = 4 * d_model; 0 = attention-only blocks, no MLP and no second norm (the 2-layer models of Mamba's
    # induction-heads table, Gu & Dao 2023, App. E.1: 137K parameters at D = 128; experiments/induction_heads)
    d_ff: int | None = None
    dropout: float = 0.0
    bias: bool = False  # biases in Linear and LayerNorm layers
    # query chunk of the biased-attention SDPA path: memory O(heads * chunk * T); smaller chunks also skip more
    # masked keys (512: experiments/benchmarks/README.md)
    attn_chunk_size: int = 512
    # auto | sdpa: a score bias goes through SDPA with an additive mask (faster than FlexAttention on an H200:
    # experiments/benchmarks/README.md); flex: FlexAttention (compiled score_mod), with a warning and SDPA if
    # it fails
    attn_backend: str = "auto"
    # softmax: softmax(q k^T / sqrt(Dh) + bias) v, the kernels above. stickbreaking: stick-breaking attention
    # (Tan et al. ICLR 2025; pelab.model.attention.stickbreaking), weights broken off from the nearest key to the farthest, no
    # softmax: a different model, so not a runtime key; its position signal is the order itself (pe=nope)
    attention: str = "softmax"
    # gpt2: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 * layers) (GPT-2, nanoGPT).
    # kaiming: PyTorch's default Linear / LayerNorm init and kaiming-normal token embeddings, N(0, 2/d)
    # (x-transformers' TransformerWrapper; checked against x_transformers 2.31). The embedding scale is what
    # matters for retrieval: with N(0, 2/d) a small model leaves the mqar copy plateau far sooner than with
    # N(0, 1) (nn.Embedding's default) or N(0, 0.02) (gpt2) (measured: experiments/benchmarks/README.md).
    init: str = "gpt2"
    tie_embeddings: bool = True  # the LM head is the token embedding (GPT-2); False: its own matrix
    # log_length: logits of the query with n > L keys times log(n)/log(L) (Chiang & Cholak 2022); L = train_length
    attn_logit_scale: str = "none"
    # Per-layer encodings, attention spans and temperatures (pelab.model.layout, docs/layouts.md): a list of
    # "<pe>[@window:<W>|@chunk:<C>][+ssmax|+llama4_temp|+qk_norm|+rotate_heads:<n>]", repeated to n_layers;
    # null = every layer the run's pe with global attention (the model without the key, bit for bit)
    layout: list[str] | None = None
    # Scalable-Softmax (+ssmax): the initial s of every head (Nakanishi 2025; 0.43 is the default of the
    # unofficial `scalable-softmax` package, which attributes it to the paper)
    ssmax_init: float = 0.43
    # Llama 4's temperature tuning (+llama4_temp), HF Llama4TextConfig's defaults: q x (log(floor((pos+1) /
    # floor_scale) + 1) x attn_scale + 1); at 8192 it is exactly 1 below position 8191, so presets at
    # L = 128 scale floor_scale down (conf/layout/irope.yaml says how)
    temperature_floor_scale: int = 8192
    temperature_attn_scale: float = 0.1
    train_length: int | None = None  # data.seq_len, filled by build_model

    # Keys that change neither the weights nor their meaning: a checkpoint may be resumed, extended or
    # evaluated with other values (dropout, chunking, kernel choice, evaluation-time logit scaling).
    RUNTIME_KEYS: ClassVar[tuple[str, ...]] = ("name", "dropout", "attn_chunk_size", "attn_backend",
                                               "attn_logit_scale")
    FILLED_KEYS: ClassVar[tuple[str, ...]] = ("vocab_size", "train_length")  # not in conf/model/*.yaml

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], vocab_size: int = 1,
                      train_length: int | None = None) -> GPTConfig:
        """A `model` config group (conf/model/*.yaml) typed against this schema and range-checked: a wrong
        type, an unknown or missing key, or a value out of range is a ConfigError naming model.<key>. The
        vocabulary comes from the data: before it is built, a stand-in size."""
        from omegaconf import OmegaConf

        unset = sorted(k for k, v in settings.items() if v == "???")  # a merge would keep the default instead
        if unset:
            raise ConfigError(f"model.{unset[0]} has no value and this config needs one; set it "
                              f"(model.{unset[0]}=...).")
        filled = sorted(set(settings) & set(cls.FILLED_KEYS))
        if filled:
            raise ConfigError(f"model.{filled[0]} is not a model setting: the harness fills it (the tokenizer's "
                              "vocabulary, data.seq_len).")
        layout = settings.get("layout")
        if layout is not None and not isinstance(layout, list | tuple):  # OmegaConf's own message names no fix
            raise ConfigError(f"model.layout={layout} must be a list (one entry per layer, or a pattern that "
                              f"repeats): model.layout=[{layout}] or e.g. model.layout=[rope@chunk:32,nope]")
        values = {**settings, "vocab_size": int(vocab_size), "train_length": train_length}
        return OmegaConf.to_object(typed_group(cls, values, "model")).validate()

    def __post_init__(self) -> None:
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> GPTConfig:
        checks = [
            (self.vocab_size > 0, f"vocab_size must be positive; got {self.vocab_size}"),
            (self.n_layers > 0, f"model.n_layers must be positive; got {self.n_layers}"),
            (self.n_heads > 0, f"model.n_heads must be positive; got {self.n_heads}"),
            (
                self.d_model > 0 and self.d_model % max(self.n_heads, 1) == 0,
                f"model.d_model={self.d_model} must be a positive multiple of model.n_heads={self.n_heads}",
            ),
            (
                self.d_ff is not None and self.d_ff >= 0,
                f"model.d_ff={self.d_ff} must be >= 0 (0 = attention-only blocks) or null (= 4 * model.d_model)",
            ),
            (0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1); got {self.dropout}"),
            (self.attn_chunk_size >= 1, f"model.attn_chunk_size must be >= 1; got {self.attn_chunk_size}"),
            (self.init in INITS, f"model.init={self.init} is unknown; choose one of {list(INITS)}"),
            (self.attention in ATTENTIONS,
             f"model.attention={self.attention} is unknown; choose one of {list(ATTENTIONS)}"),
            (self.attention == "softmax" or self.attn_logit_scale == "none",
             (f"model.attn_logit_scale={self.attn_logit_scale} scales softmax logits; model.attention="
              f"{self.attention} has no softmax: drop one of the two")),
            (self.attn_backend in ATTN_BACKENDS,
             f"model.attn_backend={self.attn_backend} is unknown; choose one of {list(ATTN_BACKENDS)}"),
            (self.attn_logit_scale in LOGIT_SCALES,
             f"model.attn_logit_scale={self.attn_logit_scale} is unknown; choose one of {list(LOGIT_SCALES)}"),
            (self.ssmax_init > 0, f"model.ssmax_init must be > 0; got {self.ssmax_init}"),
            (self.temperature_floor_scale >= 1,
             f"model.temperature_floor_scale must be >= 1 (tokens); got {self.temperature_floor_scale}"),
            (self.temperature_attn_scale >= 0,
             f"model.temperature_attn_scale must be >= 0; got {self.temperature_attn_scale}"),
            (self.attn_logit_scale == "none" or self.train_length is None or self.train_length >= 2,
             f"model.attn_logit_scale=log_length needs a training length >= 2 (log L > 0); got {self.train_length}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.layout is not None:
            specs = expand_layout(self.layout, self.n_layers)
            check_spans(specs, self.train_length, self.layout)
            for i, spec in enumerate(specs[: len(self.layout)]):
                if spec.rotate_heads > self.n_heads:
                    raise ConfigError(f"model.layout[{i}]={self.layout[i]!r}: rotate_heads:{spec.rotate_heads} is more "
                                      f"than model.n_heads={self.n_heads}; choose 1..{self.n_heads}")
        return self

    def layer_specs(self, pe_name: str) -> list[LayerSpec]:
        """Every layer's encoding, span and temperature (`model.layout` repeated; without it, `pe_name` global)."""
        return expand_layout(self.layout, self.n_layers, pe_name)


# The defaults are the config node `model/_GPTConfig` that every conf/model YAML composes first (pelab.conf_values).
store_defaults("model", GPTConfig, leave_out=GPTConfig.FILLED_KEYS)


def validate_layout(model: GPTConfig, pe: PEConfig, train_length: int | None) -> list[LayerSpec]:
    """`model.layout` against the encodings of conf/pe and the run's settings `pe` (one-line ConfigErrors, no
    torch): each layer's encoding exists, the run's is one of them, every other one's defaults are valid at the
    model's sizes, local spans are shorter than the training length, and `+rotate_heads` layers rotate per head."""
    from pelab.encodings.config import available_encodings, default_pe_config, pe_settings
    from pelab.model.layout import check_layout

    specs = check_layout(model.layout, model.n_layers, pe.name, available_encodings(), train_length)
    settings = {pe.name: pe}
    for name in sorted({s.pe for s in specs} - {pe.name}):
        try:
            settings[name] = pe_settings(default_pe_config(name), d_model=model.d_model, n_heads=model.n_heads,
                                         train_length=train_length)
        except ConfigError as err:  # its knobs are conf/pe/<name>.yaml's, not the run's pe.*: say so
            raise ConfigError(f"model.layout: the layers of pe {name} (conf/pe/{name}.yaml's defaults; only the "
                              f"run's pe={pe.name} takes pe.* knobs): {err}") from None
    for i, spec in enumerate(specs):
        s = settings[spec.pe]
        if spec.rotate_heads and not s.rotates:
            raise ConfigError(f"model.layout[{i}]: +rotate_heads needs a rotary encoding; pe {spec.pe} does not "
                              "rotate q and k (use rope or xpos, or drop +rotate_heads)")
        if spec.rotate_heads and not s.rotates_head_subset:
            raise ConfigError(f"model.layout[{i}]: +rotate_heads rotates the last n heads only, but pe {spec.pe} "
                              "positions every head (FoPE's per-head coefficients, or a piecewise pe.scaling.type); "
                              "drop +rotate_heads")
    return specs
