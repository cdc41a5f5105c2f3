"""The schema of every built-in encoding: ``PEConfig`` (the keys all share, conf/pe/_base.yaml) and one
dataclass per scheme with its own knobs -- types and defaults, ``resolve(train_length)`` (fills the settings that
mean "the training length") and ``validate(d_model, n_heads)`` (range checks naming ``pe.<key>``).

Torch-free on purpose: the command line types and range-checks ``pe`` before importing torch. Each encoding
class points to its schema (``RoPE.Config = RoPEConfig``); ``SCHEMAS`` finds a built-in schema from the
``_target_`` of its YAML without importing the class. An encoding outside this package keeps its ``Config``
on its class (found by importing it).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from omegaconf import MISSING

from pelab.checks import need
from pelab.conf_values import store_defaults
from pelab.errors import ConfigError

log = logging.getLogger(__name__)

# pe.scaling.type (RoPE; xPos and FoX: the frequency scalings only). The piecewise ones keep RoPE's frequencies and
# give the pairs past a window a second position map, merged per (query, key) pair (pelab.encodings.piecewise)
PIECEWISE_TYPES = ("rerope", "leaky_rerope", "self_extend", "string")
SCALING_TYPES = ("none", "linear", "ntk", "dynamic_ntk", "yarn", *PIECEWISE_TYPES)
FACTOR_FREE_TYPES = ("none", "rerope", "string")  # the types that do not read pe.scaling.factor
KERPLE_VARIANTS = ("log", "power")  # pe.variant of KERPLE


@dataclass
class RandomizedConfig:
    """Randomized positions (Ruoss et al. 2023): in training the T positions are a sorted random subset
    of [0, max_position); null = off. In code the range is ``PositionEncoding.randomized_range``."""

    max_position: int | None = None


@dataclass
class PEConfig:
    """Settings every encoding has; a scheme subclasses it with its own knobs (the schema of its YAML)."""

    _target_: str = MISSING  # the PositionEncoding subclass
    name: str = MISSING  # label (run names, reports)
    # The training length the encoding is fitted to (RoPE scaling's original length, the default size of
    # a learned table); null = data.seq_len, filled by resolve().
    train_length: int | None = None
    randomized: RandomizedConfig = field(default_factory=RandomizedConfig)

    # Capabilities the harness asks instead of names.
    supports_scaling: ClassVar[bool] = False  # has context-extension variants (``variant``), switchable at evaluation
    runtime_keys: ClassVar[tuple[str, ...]] = ()  # pe keys a checkpoint may be resumed/evaluated with changed

    @property
    def extends_context(self) -> bool:
        """True when these settings stretch positions relative to ``train_length`` (context extension): a
        run fine-tuned from a parent that leaves ``train_length`` null means the parent's training length."""
        return False

    @property
    def rotates(self) -> bool:
        """The encoding rotates q and k (its PositionEncoding.has_rotate; tests/test_layout.py checks they agree)."""
        return False

    @property
    def rotates_head_subset(self) -> bool:
        """A layout's ``+rotate_heads:<n>`` can rotate the last n heads alone, the others left position-free
        (PositionEncoding.rotates_head_subset): not when a per-head table or an added score spans every head."""
        return self.rotates

    def variant(self, name: str) -> PEConfig:
        """These settings under the encoding's context-extension variant ``name`` (``supports_scaling``
        encodings; e.g. RoPE's scaling types), for eval.py's ``scaling_sweep``."""
        raise ConfigError(f"pe={self.name} has no context-extension variants (asked for {name!r}); "
                          "drop scaling_sweep")

    def resolve(self, train_length: int | None) -> None:
        """Fill the settings left null that mean "the training length"."""
        if self.train_length is None and train_length is not None:
            self.train_length = int(train_length)

    def validate(self, d_model: int, n_heads: int) -> None:
        """Range checks of the resolved settings; raise ConfigError naming the key."""
        need(self.train_length is None or self.train_length >= 1, "pe.train_length", self.train_length,
             "must be a positive number of tokens (or null = data.seq_len)")
        n = self.randomized.max_position
        if n is not None:
            need(n >= (self.train_length or 1), "pe.randomized.max_position", n,
                 f"must be at least the training length {self.train_length}: randomized positions are a "
                 "sorted subset of [0, max_position) (the paper uses many times the training length); "
                 "null turns them off")


@dataclass
class ScalingConfig:
    """Context extension of RoPE (pelab.encodings.rotary, pelab.encodings.piecewise); switchable at evaluation time
    on a checkpoint trained without it."""

    type: str = "none"  # none | linear | ntk | dynamic_ntk | yarn | rerope | leaky_rerope | self_extend | string
    # s: the target length is s * L (leaky_rerope: its k, the slope 1/k past the window; self_extend: the length its
    # default group size covers); unused by none, rerope and string
    factor: float = 1.0
    beta_fast: float = 32.0  # yarn ramp: pairs with >= beta_fast rotations within L keep their frequency
    beta_slow: float = 1.0  # yarn ramp: pairs with < beta_slow rotations within L are fully interpolated
    # The piecewise types: pairs closer than `window` keep their exact RoPE positions -- ReRoPE's w, Self-Extend's
    # neighbour window, STRING's shifted offset S; null = the reference's ratio to L (`piecewise_defaults`)
    window: int | None = None
    group: int | None = None  # self_extend: the group size G; null = the smallest that covers factor * L
    local: int | None = None  # string: W, the distance the shifted pairs start at; null = L / 16


def piecewise_defaults(kind: str, train_length: int, factor: float) -> dict[str, int]:
    """The piecewise settings left null, as each reference sets them relative to its training length L:
      rerope, leaky_rerope  window = L / 8      (bojone/rerope: window 512 for LLaMA-2's 4,096)
      self_extend           window = L / 4      (datamllab/LongLM README: neighbour window 1,024 for Llama-2's 4,096)
                            group = the smallest G with (L - window) * G + window >= factor * L (the README's rule
                                    for the maximum extended length)
      string                window = 0.33 L   (HKUNLP/STRING: shifted_offset = int(0.33 * L))
                            local = L / 16    (PELab's scaling, not the reference's: its default local value
                                    is 128 tokens for every model, a local context kept "for fluency", which
                                    at L = 128 would be all of L)
    Each at least 1."""
    if kind in ("rerope", "leaky_rerope"):
        return {"window": max(1, train_length // 8)}
    if kind == "self_extend":
        window = max(1, train_length // 4)
        span = max(1, train_length - window)
        return {"window": window, "group": max(1, math.ceil((factor * train_length - window) / span))}
    if kind == "string":
        return {"window": max(1, int(0.33 * train_length)), "local": max(1, train_length // 16)}
    return {}


@dataclass
class RoPEConfig(PEConfig):
    base: float = 10000.0
    rotary_fraction: float = 1.0  # rotate the first fraction of each head's channels (partial rotary)
    # p-RoPE (Barbero et al. 2024): keep this fraction p of the highest frequencies; the lowest are set to 0
    # (those pairs are not rotated). 0 = NoPE
    frequency_fraction: float = 1.0
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    supports_scaling: ClassVar[bool] = True
    runtime_keys: ClassVar[tuple[str, ...]] = ("scaling",)  # frequencies are not in the state dict

    @property
    def rotates(self) -> bool:
        return True

    @property
    def rotates_head_subset(self) -> bool:
        return self.rotates and self.scaling.type not in PIECEWISE_TYPES  # far-pair scores reach every head
    # The piecewise types merge two scores through the content-bias hook: not for an encoding that rotates q and k
    # otherwise (xPos's decay) or already has a bias hook (FoX's forget gate)
    piecewise_scaling: ClassVar[bool] = True

    @property
    def extends_context(self) -> bool:
        return self.scaling.type != "none"

    def variant(self, name: str) -> RoPEConfig:
        """The same settings under scaling type ``name`` (one of SCALING_TYPES)."""
        need(name in SCALING_TYPES, "pe.scaling.type", name,
             f"is unknown; choose one of {list(SCALING_TYPES)}")
        if self.scaling.factor == 1.0 and name not in FACTOR_FREE_TYPES:
            log.warning("pe.scaling.factor=1: scaling type %s equals no scaling; pass pe.scaling.factor=4, say.", name)
        return replace(self, scaling=replace(self.scaling, type=name))

    def resolve(self, train_length: int | None) -> None:
        super().resolve(train_length)
        s = self.scaling
        if s.type in PIECEWISE_TYPES and self.train_length is not None:
            for key, value in piecewise_defaults(s.type, self.train_length, s.factor).items():
                if getattr(s, key) is None:
                    setattr(s, key, value)

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.base > 1, "pe.base", self.base, "must be > 1")
        need(0.0 < self.rotary_fraction <= 1.0, "pe.rotary_fraction", self.rotary_fraction,
             "must be in (0, 1]")
        need(0.0 <= self.frequency_fraction <= 1.0, "pe.frequency_fraction", self.frequency_fraction,
             "(p-RoPE's p) must be in [0, 1]")
        rotary = rotary_dim(d_model // n_heads, self.rotary_fraction)
        need(rotary >= 2, "pe.rotary_fraction", self.rotary_fraction,
             f"of head_dim={d_model // n_heads} (model.d_model/model.n_heads) leaves no channel pair to "
             "rotate; raise pe.rotary_fraction or the head size")
        s = self.scaling
        need(s.type in SCALING_TYPES, "pe.scaling.type", s.type,
             f"is unknown; choose one of {list(SCALING_TYPES)}")
        need(s.factor > 0, "pe.scaling.factor", s.factor, "must be > 0 (1 = no scaling)")
        need(s.type not in ("ntk", "dynamic_ntk") or rotary > 2, "pe.scaling.type", s.type,
             f"needs more than 2 rotary dims; head_dim * pe.rotary_fraction gives {rotary}")
        need(s.type not in ("dynamic_ntk", "yarn") or self.train_length is not None, "pe.scaling.type",
             s.type, "needs pe.train_length (the training length); it is null -- set it, or let the harness "
             "fill it from data.seq_len")
        if s.type in PIECEWISE_TYPES:
            self._validate_piecewise()

    def _validate_piecewise(self) -> None:
        s, L = self.scaling, self.train_length
        need(self.piecewise_scaling, "pe.scaling.type", s.type,
             f"merges two attention scores, which pe={self.name} cannot (its rotation or bias hook is its own); "
             f"choose one of {[t for t in SCALING_TYPES if t not in PIECEWISE_TYPES]}")
        need(L is not None, "pe.scaling.type", s.type, "needs pe.train_length (the training length); it is null -- "
             "set it, or let the harness fill it from data.seq_len")
        need(s.window is not None and 1 <= s.window < L, "pe.scaling.window", s.window,
             f"must be in [1, {L}) (pe.train_length): the pairs closer than it keep their trained positions")
        if s.type == "leaky_rerope":
            need(s.factor >= 1, "pe.scaling.factor", s.factor,
                 "(Leaky ReRoPE's k) must be >= 1: past the window positions grow by 1/k per token")
        if s.type == "self_extend":
            need(s.group is not None and s.group >= 1, "pe.scaling.group", s.group,
                 "(Self-Extend's group size) must be >= 1 (or null: the smallest covering pe.scaling.factor x L)")
        if s.type == "string":
            need(s.local is not None and 0 <= s.local < s.window, "pe.scaling.local", s.local,
                 f"(STRING's W) must be in [0, pe.scaling.window={s.window}): the pairs past the window move down "
                 "to distance W onwards")


def rotary_dim(head_dim: int, rotary_fraction: float) -> int:
    """Rotated channels per head: the fraction of head_dim, rounded down to an even number (pairs)."""
    return int(head_dim * rotary_fraction) // 2 * 2


T5_BIAS_SCALES = ("sqrt_head_dim",)  # named values of pe.bias_scale


def t5_bias_scale(value: Any, head_dim: int) -> float | None:
    """pe.bias_scale as a number: a positive number as it is, "sqrt_head_dim" -> sqrt(d_head); None if invalid."""
    if isinstance(value, str):
        if value == "sqrt_head_dim":
            return math.sqrt(head_dim)
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


@dataclass
class SinusoidalConfig(PEConfig):
    base: float = 10000.0
    # Multiplier on the added vector. 0.02 = the token embeddings' init std, so sinusoid and token vectors start
    # in the same ratio as in fairseq's baseline of the ALiBi paper (see the class docstring). 1.0 = the raw
    # formula, which swamps 0.02-std token embeddings (measured: experiments/length_extrapolation/v2/README.md).
    scale: float = 0.02
    learn_scale: bool = False  # the multiplier is a learned scalar initialised at `scale`

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.base > 1, "pe.base", self.base, "must be > 1")
        if d_model % 2:
            raise ConfigError(f"model.d_model={d_model} must be even for pe=sinusoidal (sin/cos pairs)")


@dataclass
class LearnedConfig(PEConfig):
    # Rows of the table; null = the largest position training reaches: the training length, or with
    # randomized positions their range.
    max_position: int | None = None
    init_std: float = 0.02

    def resolve(self, train_length: int | None) -> None:
        super().resolve(train_length)
        if self.max_position is None:
            self.max_position = self.randomized.max_position or self.train_length

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.max_position is not None and self.max_position >= 1, "pe.max_position",
             self.max_position, "must be a positive number of table rows")
        reach = max(self.train_length or 0, self.randomized.max_position or 0)
        need(self.max_position >= reach, "pe.max_position", self.max_position,
             f"cannot hold the {reach} positions training reaches (data.seq_len / pe.randomized."
             "max_position); raise pe.max_position or leave it null")
        need(self.init_std > 0, "pe.init_std", self.init_std, "must be > 0")


@dataclass
class T5BiasConfig(PEConfig):
    num_buckets: int = 32
    max_distance: int = 128  # distances >= this share the last bucket
    init_std: float | None = None  # null = d_model^-0.5 (as Hugging Face T5)
    # Multiplier on the table before it is added to q.k/sqrt(d_head): a number > 0, or "sqrt_head_dim" =
    # x-transformers (RelativePositionBias scale dim_head**0.5); 1 = the table as it is, as Hugging Face's T5 adds
    # it (to q.k, which T5 does not scale). Under Adam it is also the bias's learning rate in logit
    # units: at 1 the table barely moves over a run, and T5 trains worse in-window and degrades past L (measured,
    # both scales: experiments/peer/README.md). See the class docstring.
    bias_scale: Any = "sqrt_head_dim"

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.num_buckets >= 2, "pe.num_buckets", self.num_buckets, "must be >= 2")
        need(t5_bias_scale(self.bias_scale, d_model // n_heads) is not None, "pe.bias_scale",
             self.bias_scale, f"must be a number > 0 or one of {list(T5_BIAS_SCALES)}")
        need(self.max_distance > self.num_buckets // 2, "pe.max_distance", self.max_distance,
             f"must exceed pe.num_buckets // 2 = {self.num_buckets // 2} (the exact buckets)")
        need(self.init_std is None or self.init_std > 0, "pe.init_std", self.init_std,
             "must be > 0 or null")


@dataclass
class KERPLEConfig(PEConfig):
    variant: str = "log"  # log | power
    eps: float = 0.01  # smallest initial r1, r2

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.variant in KERPLE_VARIANTS, "pe.variant", self.variant,
             f"is unknown; choose one of {list(KERPLE_VARIANTS)}")
        need(0 < self.eps < 1, "pe.eps", self.eps, "must be in (0, 1)")


@dataclass
class SandwichConfig(PEConfig):
    dim: int | None = None  # d'; null = model.d_model
    base: float = 10000.0

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        dim = self.dim if self.dim is not None else d_model
        need(dim >= 2 and dim % 2 == 0, "pe.dim", dim, "(d') must be an even number >= 2")
        need(self.base > 1, "pe.base", self.base, "must be > 1")


@dataclass
class FIREConfig(PEConfig):
    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float | None = None  # the threshold L's initial value; null = the training length
    eps: float = 1e-6

    def resolve(self, train_length: int | None) -> None:
        super().resolve(train_length)
        if self.init_L is None and self.train_length is not None:
            self.init_L = float(self.train_length)

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.init_L is not None, "pe.init_L", self.init_L,
             "means the training length, which is unknown here: set pe.init_L or pe.train_length")
        for key in ("mlp_width", "init_c", "init_L", "eps"):
            need(getattr(self, key) > 0, f"pe.{key}", getattr(self, key), "must be > 0")


@dataclass
class CoPEConfig(PEConfig):
    max_position: int | None = None  # positions clamp at max_position - 1; null = the training length

    def resolve(self, train_length: int | None) -> None:
        super().resolve(train_length)
        if self.max_position is None:
            self.max_position = self.train_length

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.max_position is not None and self.max_position >= 2, "pe.max_position",
             self.max_position, "must be an integer >= 2 (or null = the training length)")


@dataclass
class XPosConfig(RoPEConfig):
    scale_base: float = 512.0

    piecewise_scaling: ClassVar[bool] = False  # the decay scales q and k: a second rotation of them would not

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.scale_base > 0, "pe.scale_base", self.scale_base, "must be > 0")


@dataclass
class FoXConfig(RoPEConfig):
    """The Forgetting Transformer (pelab.encodings.forgetting): the forget gate, and RoPE's knobs for pe.rope=true."""

    rope: bool = False  # also rotate q and k (FoX + RoPE); false: the gate is the only position signal
    # The gate's initial bias b: f = sigmoid(b) at the start. 0 = the reference's "full" gate (f = 1/2: a strong
    # decay to unlearn); x-transformers' DataDependentAlibi starts at 5 (f = 0.993: almost no decay). It decides
    # whether a small model learns recall: experiments/lost_in_the_middle/v4, "FoX's gate at x-transformers' start"
    gate_bias_init: float = 0.0

    piecewise_scaling: ClassVar[bool] = False  # the forget gate is its bias hook already

    @property
    def extends_context(self) -> bool:
        return self.rope and super().extends_context

    @property
    def rotates(self) -> bool:
        return self.rope

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.rope or self.scaling.type == "none", "pe.scaling.type", self.scaling.type,
             "scales RoPE's frequencies, and pe=fox rotates nothing; add pe.rope=true or drop the scaling")


@dataclass
class FoPEConfig(PEConfig):
    """Fourier Position Embedding (pelab.encodings.fourier): RoPE's frequencies clipped below 2 pi / L, each pair a
    Fourier series over the rest."""

    base: float = 10000.0
    init_gain: float = 0.3  # xavier-normal gain of the series' off-diagonal coefficients (the reference: 0.3-0.6)
    learnable: bool = False  # the coefficients are trained (the reference's default: frozen)

    @property
    def rotates(self) -> bool:
        return True

    @property
    def rotates_head_subset(self) -> bool:
        return False  # the series' coefficients are per head, (H, M, P)

    def validate(self, d_model: int, n_heads: int) -> None:
        super().validate(d_model, n_heads)
        need(self.base > 1, "pe.base", self.base, "must be > 1")
        need(self.init_gain >= 0, "pe.init_gain", self.init_gain, "must be >= 0")
        need(self.train_length is not None, "pe.train_length", self.train_length,
             "is needed: FoPE clips the frequencies below 2 pi / L; set it or let the harness fill it from "
             "data.seq_len")
        need((d_model // n_heads) >= 4, "model.d_model", d_model,
             f"/ model.n_heads gives head_dim={d_model // n_heads}; FoPE needs >= 4 (Dh / 4 series pairs)")
        # the highest frequency is 1 (a period of 2 pi tokens): it must fit in L, or every frequency is clipped
        need(self.train_length is None or self.train_length >= 2 * math.pi, "pe.train_length", self.train_length,
             "leaves no RoPE frequency a full period (2 pi / L > 1): FoPE needs L >= 7")


# The schema of each built-in encoding by the `_target_` its YAML names (tests/test_encodings.py checks that
# each entry is its class's `Config` and that every built-in YAML has an entry).
SCHEMAS: dict[str, type[PEConfig]] = {
    "pelab.encodings.absolute.NoPE": PEConfig,
    "pelab.encodings.absolute.Sinusoidal": SinusoidalConfig,
    "pelab.encodings.absolute.Learned": LearnedConfig,
    "pelab.encodings.bias.ALiBi": PEConfig,
    "pelab.encodings.bias.T5Bias": T5BiasConfig,
    "pelab.encodings.bias.KERPLE": KERPLEConfig,
    "pelab.encodings.bias.Sandwich": SandwichConfig,
    "pelab.encodings.bias.FIRE": FIREConfig,
    "pelab.encodings.contextual.CoPE": CoPEConfig,
    "pelab.encodings.forgetting.FoX": FoXConfig,
    "pelab.encodings.fourier.FoPE": FoPEConfig,
    "pelab.encodings.rotary.RoPE": RoPEConfig,
    "pelab.encodings.rotary.XPos": XPosConfig,
}

# Each schema's defaults are the config node `pe/_<Class>` that its YAML composes first (pelab.conf_values).
for _schema in set(SCHEMAS.values()):
    store_defaults("pe", _schema)
