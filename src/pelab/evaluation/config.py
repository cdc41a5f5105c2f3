"""The evaluation layer's config schema: `eval` (length extrapolation, attention diagnostics) and `probes`
(retrieval by depth x length), typed and range-checked before any data or training cost. The values live
in conf/eval/ and conf/probes/."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.checks import need, resolved_value, show, typed_group
from pelab.data.corpora import SPLITS
from pelab.data.recall import OFFSET, import_plugins, kind_names, probe_kind
from pelab.data.recall.ruler_options import RulerOptions, check_ruler
from pelab.errors import ConfigError
from pelab.evaluation.effective_length import EffectiveLengthRule

PROTOCOLS = ("nonoverlap", "sliding")

# Values <= this are multiples of the training length; larger values are absolute token counts.
MAX_LENGTH_MULTIPLE = 64


def resolve_lengths(lengths: Sequence[int | float], train_length: int, key: str = "eval.lengths") -> list[int]:
    """Evaluation lengths in tokens, sorted and unique.

    Rule: a value ``v <= 64`` is a multiple of the training length (``round(v * train_length)``; fractions
    such as 0.5 are allowed); a value ``> 64`` is an absolute token count (must be an integer).
    So ``[1, 2, 4, 8, 16]`` at ``train_length=128`` gives ``[128, 256, 512, 1024, 2048]``.
    """
    if train_length <= 0:
        raise ValueError(f"train_length must be positive (data.seq_len), got {train_length}")
    out: set[int] = set()
    for v in lengths:
        v = float(v)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{key} entries must be positive, got {v}")
        if v <= MAX_LENGTH_MULTIPLE:
            n = round(v * train_length)
        else:
            if v != int(v):
                raise ValueError(
                    f"{key} entry {v} is > {MAX_LENGTH_MULTIPLE}, so it is read as an absolute token "
                    "count and must be an integer"
                )
            n = int(v)
        if n < 1:
            raise ValueError(f"{key} entry {v} resolves to {n} tokens at train_length={train_length}")
        out.add(n)
    if not out:
        raise ValueError(f"{key} is empty")
    return sorted(out)


FILLERS = ("val", "sentence")  # probes.filler: real validation text or the classic repeated sentence


@dataclass
class DiagnosticsConfig:
    enabled: bool
    windows: int


@dataclass
class EvalConfig:
    lengths: list[float]
    tokens: int | None  # null = the whole split
    seed: int  # draws the evaluation blocks (independent of the training seed)
    at: list[float]  # fractions of trainer.max_steps with an evaluation during training ([] = at the end only)
    at_tokens: int | None  # their budget (null = eval.tokens)
    stride: int | None
    protocols: list[str]
    split: str
    batch_tokens: int
    diagnostics: DiagnosticsConfig
    at_probes: bool = False  # the probes too at each eval.at point


@dataclass
class ProbesConfig:
    enabled: bool
    kinds: list[str]
    depths: list[float]
    lengths: list[float]
    samples: int
    seed: int
    key_len: int
    value_len: int
    filler: str
    pairs: int
    prefix_multiples: list[int]
    ruler: RulerOptions  # the RULER-style kinds' difficulty: data.recall_ruler's
    effective_length: EffectiveLengthRule  # floor and fraction of the effective length (evaluation.effective_length)
    # modules that register probe kinds / evaluations defined outside the package (pelab.data.recall.kinds);
    # not in conf/probes/default.yaml, so a run without plugins keeps its config: +probes.plugins=[module]
    plugins: list[str] = field(default_factory=list)


def check_lengths(key: str, lengths: Any, train_length: int) -> None:
    try:
        resolve_lengths(list(lengths), train_length, key)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}={show(lengths)}: {err}; use positive multiples of data.seq_len "
                          "(<= 64) or token counts (> 64).") from err


def check_eval(e: DictConfig, train_length: int) -> None:
    check_lengths("eval.lengths", e.lengths, train_length)
    need(e.tokens is None or e.tokens >= 1, "eval.tokens", e.tokens,
         "must be a positive number of tokens, or null (the whole split).")
    need(e.seed >= 0, "eval.seed", e.seed, "must be >= 0.")
    need(all(0.0 < f <= 1.0 for f in e.at), "eval.at", e.at,
         "must list fractions of trainer.max_steps in (0, 1], e.g. [0.25, 0.5, 1.0] ([] = at the end only).")
    need(e.at_tokens is None or e.at_tokens >= 1, "eval.at_tokens", e.at_tokens,
         "must be a positive number of tokens, or null (= eval.tokens).")
    need(not e.at_probes or len(e.at) > 0, "eval.at_probes", e.at_probes,
         "probes at the eval.at points, and eval.at lists none: set eval.at (e.g. [0.25, 0.5, 0.75]) or drop it.")
    need(e.stride is None or e.stride >= 1, "eval.stride", e.stride, "must be >= 1 or null (= data.seq_len).")
    need(len(e.protocols) > 0 and set(e.protocols) <= set(PROTOCOLS), "eval.protocols", e.protocols,
         f"must be a non-empty list of {show(PROTOCOLS)}.")
    need(e.split in SPLITS, "eval.split", e.split, f"must be one of {show(SPLITS)}.")
    need(e.batch_tokens >= 1, "eval.batch_tokens", e.batch_tokens, "must be >= 1.")
    need(e.diagnostics.windows >= 1, "eval.diagnostics.windows", e.diagnostics.windows,
         "must be >= 1 window per length.")


def check_probes(p: DictConfig, train_length: int) -> None:
    import_plugins(p.plugins)  # before the kinds are checked: a plugin registers its own
    known = kind_names()
    need(set(p.kinds) <= set(known), "probes.kinds", p.kinds, f"must list kinds of {show(known)} ([] = no probes).")
    need(len(p.depths) > 0 and all(0.0 <= d <= 1.0 for d in p.depths), "probes.depths", p.depths,
         "must be a non-empty list of depths in [0, 1] (0 = start of the context, 1 = its end).")
    if p.enabled:
        check_lengths("probes.lengths", p.lengths, train_length)
    need(p.samples >= 1, "probes.samples", p.samples, "must be >= 1 sample per cell.")
    for k in ("key_len", "value_len"):
        need(p[k] >= 1, f"probes.{k}", p[k], "must be >= 1 hex chars.")
    need(p.filler in FILLERS, "probes.filler", p.filler, f"must be one of {show(FILLERS)}.")
    need(p.pairs >= 1, "probes.pairs", p.pairs, "must be >= 1 key-value pairs per mqar probe.")
    need(len(p.prefix_multiples) > 0 and all(m >= 0 for m in p.prefix_multiples), "probes.prefix_multiples",
         p.prefix_multiples, "must be a non-empty list of whole numbers >= 0 (filler before the window, in "
         "multiples of data.seq_len).")
    check_ruler(p.ruler, "probes.ruler")
    r = p.effective_length
    need(0.0 <= r.floor <= 1.0, "probes.effective_length.floor", r.floor, "must be an accuracy in [0, 1].")
    need(0.0 < r.fraction <= 1.0, "probes.effective_length.fraction", r.fraction,
         "must be in (0, 1]: the share of the in-window accuracy every length up to the effective length keeps.")
    # kinds whose probes need a number of tokens set by probes.pairs (mqar: N pairs, the query, the answer),
    # probed at probes.lengths (depth layout) or at the training length (offset layout)
    sized = [probe_kind(k) for k in dict.fromkeys(p.kinds) if probe_kind(k).min_length]
    if p.enabled and sized:
        shortest = min(train_length if e.layout == OFFSET else min(resolve_lengths(list(p.lengths), train_length))
                       for e in sized)
        for e in sized:
            need(e.min_length(p.pairs) <= shortest, "probes.pairs", p.pairs,
                 f"does not fit: an {e.family} probe needs {e.min_length_rule} tokens and the shortest probe length is "
                 f"{shortest}; lower probes.pairs or drop the short probes.lengths.")


def check_at_probes(e: DictConfig, p: DictConfig) -> None:
    """eval.at_probes needs probes to run."""
    need(not e.at_probes or (p.enabled and len(p.kinds) > 0), "eval.at_probes", e.at_probes,
         "probes at the eval.at points, and the run has none: set probes.enabled=true and probes.kinds, or drop it.")


def typed_evaluation(cfg: DictConfig) -> tuple[EvalConfig, ProbesConfig]:
    """The `eval` and `probes` groups of a run config, typed and range-checked at its training length
    (`data.seq_len`): what the evaluation suite reads. A key the config lacks is a ConfigError naming it (eval.py
    brings a checkpoint's config written before the key existed to today's form first)."""
    train_length = int(cfg.data.seq_len)
    e = typed_group(EvalConfig, resolved_value(cfg, "eval"), "eval")
    p = typed_group(ProbesConfig, resolved_value(cfg, "probes"), "probes")
    check_eval(e, train_length)
    check_probes(p, train_length)
    check_at_probes(e, p)
    return OmegaConf.to_object(e), OmegaConf.to_object(p)
