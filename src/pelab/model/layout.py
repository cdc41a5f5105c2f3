"""Per-layer layouts (`model.layout`): which encoding, which attention span and which logit temperature each layer
has. Torch-free, so the command line checks a layout before any data or model is built.

One entry per layer, a short string (typed: a list of strings, so Hydra's override grammar takes it as written):

    <pe>[@<span>][+<modifier>...]
    pe        a conf/pe option (rope, nope, alibi, ...); the one named like the run's `pe` is the run's encoding
              (its command-line knobs, e.g. pe.base, apply), any other one is built from its YAML's defaults
    span      global (the default) | window:<W> (sliding: each query sees the last W keys, itself included) |
              chunk:<C> (queries see the keys of their own C-token chunk only, as Llama 4's attention_chunk_size)
    modifier  ssmax (Scalable-Softmax, Nakanishi 2025: logits x s_h log n, s_h learned per head and layer)
              llama4_temp (Llama 4's temperature tuning: q x (log(floor((pos + 1) / floor_scale) + 1) x attn_scale + 1))
              qk_norm (Llama 4's weightless RMS norm of q and k after the rotation, HF `use_qk_norm`)
              rotate_heads:<n> (a rotary encoding rotates the last n heads only, the others have no position
              signal: NoPE/RoPE mixing by heads, x-transformers' `rotate_num_heads`)

`model.layout=[rope@chunk:32, rope@chunk:32, rope@chunk:32, nope+llama4_temp]` is Llama 4's iRoPE at a 4-layer
scale. A layout shorter than model.n_layers repeats (its length must divide n_layers): a pattern and its interval.
Layers naming the same encoding share one module (its parameters, e.g. T5's table, are shared as they are
without a layout) and one `prepare(pos)` per forward; the temperature's parameters (ssmax) are per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pelab.errors import ConfigError

SPANS = ("global", "window", "chunk")
MODIFIERS = ("ssmax", "llama4_temp", "qk_norm", "rotate_heads:<n>")
TEMPERATURES = ("ssmax", "llama4_temp")  # at most one per layer
SYNTAX = ("<pe>[@global|@window:<W>|@chunk:<C>][+ssmax|+llama4_temp|+qk_norm|+rotate_heads:<n>], "
          "e.g. rope@chunk:32+qk_norm")


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a layout: its encoding (a conf/pe option), attention span and logit transforms."""

    pe: str
    span: str = "global"  # global | window | chunk
    size: int = 0  # tokens of the window / chunk; 0 for global
    temperature: str = "none"  # none | ssmax | llama4_temp
    qk_norm: bool = False
    rotate_heads: int = 0  # a rotary encoding rotates the last n heads only; 0 = every head

    @property
    def local(self) -> bool:
        return self.span != "global"


def parse_layer(text: str, key: str) -> LayerSpec:
    """`rope@chunk:32+qk_norm` -> LayerSpec; a ConfigError naming `key` and the syntax otherwise."""
    head, *mods = str(text).strip().split("+")
    pe, _, span_text = head.partition("@")
    span, _, size_text = (span_text or "global").partition(":")
    if not pe:
        raise ConfigError(f"{key}={text!r} names no encoding; write {SYNTAX}")
    if span not in SPANS:
        raise ConfigError(f"{key}={text!r}: span {span!r} is unknown; choose one of {list(SPANS)} ({SYNTAX})")
    if (span == "global") != (size_text == ""):
        want = "takes no size (global)" if span == "global" else f"needs a size in tokens ({span}:<tokens>)"
        raise ConfigError(f"{key}={text!r}: {span} {want}; write {SYNTAX}")
    if size_text and (not size_text.isdigit() or int(size_text) < 1):
        raise ConfigError(f"{key}={text!r}: the {span} size must be a positive integer; got {size_text!r}")
    rotate_heads = 0
    for mod in [m for m in mods if m.startswith("rotate_heads")]:
        n = mod.removeprefix("rotate_heads:")
        if not (mod.startswith("rotate_heads:") and n.isdigit() and int(n) >= 1):
            raise ConfigError(f"{key}={text!r}: write rotate_heads:<n>, n >= 1 heads (the last n rotate)")
        rotate_heads = int(n)
    mods = [m for m in mods if not m.startswith("rotate_heads")]
    unknown = [m for m in mods if m not in MODIFIERS]
    if unknown:
        raise ConfigError(f"{key}={text!r}: modifier {unknown[0]!r} is unknown; choose from {list(MODIFIERS)}")
    temps = [m for m in mods if m in TEMPERATURES]
    if len(temps) > 1:
        raise ConfigError(f"{key}={text!r} sets two temperatures ({' and '.join(temps)}); keep one")
    return LayerSpec(pe=pe, span=span, size=int(size_text or 0), temperature=temps[0] if temps else "none",
                     qk_norm="qk_norm" in mods, rotate_heads=rotate_heads)


def expand_layout(layout: list[str] | None, n_layers: int, default_pe: str | None = None) -> list[LayerSpec]:
    """The spec of every layer: `layout` repeated to n_layers (its length must divide it); without a layout,
    every layer `default_pe` with global attention (the model as it is without the key)."""
    if layout is None:
        return [LayerSpec(pe=default_pe or "")] * n_layers
    if len(layout) == 0 or n_layers % len(layout):
        raise ConfigError(f"model.layout has {len(layout)} entries for model.n_layers={n_layers}; give one per "
                          f"layer or a pattern whose length divides {n_layers} (it repeats), or null for none")
    specs = [parse_layer(text, f"model.layout[{i}]") for i, text in enumerate(layout)]
    return specs * (n_layers // len(specs))


def check_spans(specs: list[LayerSpec], train_length: int | None, layout: list[str]) -> None:
    """A local span must be shorter than the training length: at L tokens an L-token window is full attention
    in training, and the layer would be trained as a global one."""
    if train_length is None:
        return
    for i, spec in enumerate(specs[: len(layout)]):
        if spec.local and spec.size >= train_length:
            raise ConfigError(f"model.layout[{i}]={layout[i]!r}: a {spec.span} of {spec.size} tokens is not shorter "
                              f"than the training length {train_length} (data.seq_len), so it trains as full "
                              f"attention; use a {spec.span} < {train_length} or global")


def check_layout(layout: list[str] | None, n_layers: int, pe_name: str, encodings: list[str],
                 train_length: int | None) -> list[LayerSpec]:
    """Every check a layout needs that the model schema alone cannot do: its encodings exist (`encodings`: the
    conf/pe options), the run's `pe` is one of them, and local spans are shorter than the training length."""
    specs = expand_layout(layout, n_layers, pe_name)
    if layout is None:
        return specs
    for i, spec in enumerate(specs[: len(layout)]):
        if spec.pe not in encodings:
            raise ConfigError(f"model.layout[{i}]={layout[i]!r}: pe {spec.pe!r} is not an encoding; choose one of "
                              f"{encodings} (conf/pe)")
    if pe_name not in {s.pe for s in specs}:
        raise ConfigError(f"model.layout names no layer with the run's encoding pe={pe_name}; set pe= to one of "
                          f"{sorted({s.pe for s in specs})} (its knobs, e.g. pe.base, then apply to those layers)")
    check_spans(specs, train_length, layout)
    return specs
