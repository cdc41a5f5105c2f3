"""Metric keys: the names of the evaluation's scalars in summary.json `metrics` and in W&B, built and read here only.

    extrap/<stat>@<L>                       extrap/ppl@512: perplexity of windows of L tokens (also ppl_ratio,
                                            ppl_sliding, bpb)
    extrap/<stat>@parent_x<x>               extrap/ppl@parent_x4: at x times the parent's training length (an
                                            extended run)
    probe/<kind>/<stat>@<L>                 probe/mqar/acc@1024: a probe kind at total length L (also lim_gap,
                                            logprob, rank, other_in_context, not_in_context)
    probe/<kind>/<stat>                     probe/mqar/auc: one number per kind (also effective_length, the
                                            longest length at accuracy >= 0.9; eff_length and eff_threshold,
                                            pelab.evaluation.effective_length's rule)
    attn/<stat>@<L>                         attn/entropy@512: attention statistic, mean over layers
    attn/<stat>@<L>/layer<l>                attn/entropy@512/layer0: the same, of one layer
    train/<stat>@<L>                        train/induction_acc@512: a curve logged during training at L tokens
                                            (the induction-heads callback)
    <family>/<variant>/...                  extrap/yarn/ppl@512, probe/step0/mqar/acc@128: the same key of a
                                            second evaluation of the run (eval.py's scaling type, an extended
                                            run's step-0 evaluation), the variant right after the family
    <stat>_lo, <stat>_hi                    extrap/ppl_ratio_lo@512: the bounds of the 95% interval of <stat>

L is a length in tokens. Everything before "@" is the metric's name (`MetricKey.name`). Stdlib only: the
result table, the report and the dashboard read keys without importing torch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

FAMILIES = ("extrap", "probe", "attn", "train")
KINDED = ("probe",)  # families whose names carry a kind segment before the stat
BOUNDS = ("lo", "hi")

_SEGMENT = re.compile(r"[\w.-]+")
_KEY = re.compile(r"(?P<name>[^@]+)(?:@(?:(?P<length>\d+)|parent_x(?P<x>\d+(?:\.\d+)?(?:e[+-]\d+)?))"
                  r"(?:/layer(?P<layer>\d+))?)?")


@dataclass(frozen=True)
class MetricKey:
    family: str  # extrap | probe | attn
    stat: str  # ppl, ppl_ratio, acc, lim_gap, entropy, ... (without _lo / _hi)
    length: int | None = None  # tokens; None for a parent_x key and for a per-kind name (probe/mqar/auc)
    kind: str = ""  # the probe kind (probe keys only)
    variant: str = ""  # a second evaluation of the same run: "yarn", "step0"
    bound: str = ""  # "lo" | "hi": a bound of the 95% interval of `stat`
    parent_x: float | None = None  # @parent_x4
    layer: int | None = None  # attn/<stat>@<L>/layer<l>

    @property
    def stat_name(self) -> str:
        """The stat with its bound: ppl_ratio_lo."""
        return f"{self.stat}_{self.bound}" if self.bound else self.stat

    @property
    def name(self) -> str:
        """Everything before "@": probe/step0/mqar/acc_lo."""
        return "/".join(s for s in (self.family, self.variant, self.kind, self.stat_name) if s)


def format_key(k: MetricKey) -> str:
    if k.parent_x is not None:
        at = f"@parent_x{k.parent_x:g}"
    else:
        at = "" if k.length is None else f"@{k.length}"
    return k.name + at + ("" if k.layer is None else f"/layer{k.layer}")


def _name_parts(name: str) -> dict | None:
    """family, variant, kind, stat, bound of a metric name; None when it is not one."""
    family, *rest = name.split("/")
    want = 2 if family in KINDED else 1  # the segments after the family, the variant aside
    if family not in FAMILIES or len(rest) not in (want, want + 1) or not all(_SEGMENT.fullmatch(s) for s in rest):
        return None
    variant = rest.pop(0) if len(rest) > want else ""
    kind = rest.pop(0) if family in KINDED else ""
    stat, bound = rest[0], ""
    if stat.endswith(tuple(f"_{b}" for b in BOUNDS)):
        stat, bound = stat[:-3], stat[-2:]
    if not stat:
        return None
    return {"family": family, "variant": variant, "kind": kind, "stat": stat, "bound": bound}


AT_A_LENGTH_ONLY = ("train",)  # families whose keys always carry @L (train/loss, train/lr are not metric keys)


@functools.lru_cache(maxsize=65536)  # readers parse the same few thousand keys of every run, many times over
def parse_key(key: str) -> MetricKey | None:
    """The MetricKey of `key`, or None when `key` is not one (val/ppl, train/loss, a malformed key). Only the
    canonical spelling parses (no leading zeros, no "4.0"): every key parsed formats back to itself."""
    k = _parse(key)
    return None if k is None or (k.family in AT_A_LENGTH_ONLY and k.length is None) else k


def _parse(key: str) -> MetricKey | None:
    m = _KEY.fullmatch(key)
    parts = _name_parts(m["name"]) if m else None
    if parts is None:
        return None
    k = MetricKey(**parts, length=None if m["length"] is None else int(m["length"]),
                  parent_x=None if m["x"] is None else float(m["x"]),
                  layer=None if m["layer"] is None else int(m["layer"]))
    return k if format_key(k) == key else None


def metric_key(name: str, length: int | None = None, bound: str = "", *, parent_x: float | None = None,
               layer: int | None = None) -> str:
    """The key of metric `name` (extrap/ppl, probe/mqar/acc) at `length` tokens or at `parent_x` times the
    parent's training length, of one bound ("lo" / "hi") of its interval, of one attention layer."""
    k = _parse(name)
    if k is None or k.length is not None or k.parent_x is not None or (bound and k.bound) or bound not in ("", *BOUNDS):
        raise ValueError(f"not a metric name (or bound) to put at a length: {name!r} {bound!r}")
    return format_key(replace(k, length=length, bound=bound or k.bound, parent_x=parent_x, layer=layer))


def interval_keys(key: str) -> tuple[str, str]:
    """The keys of the bounds of `key`'s 95% interval: extrap/ppl@512 -> extrap/ppl_lo@512, extrap/ppl_hi@512."""
    k = parse_key(key)
    if k is None or k.bound:
        raise ValueError(f"not a metric key with an interval: {key!r}")
    return format_key(replace(k, bound="lo")), format_key(replace(k, bound="hi"))


def with_variant(key: str, variant: str) -> str:
    """The same key of a second evaluation of the run: extrap/ppl@512, "yarn" -> extrap/yarn/ppl@512."""
    k = parse_key(key)
    if k is None or k.variant:
        raise ValueError(f"not a metric key without a variant: {key!r}")
    return format_key(replace(k, variant=variant))


def length_of(key: str, name: str) -> int | None:
    """L where `key` is `name@L`; None for any other key (another name, parent_x, one layer's)."""
    k = parse_key(key)
    return k.length if k is not None and k.layer is None and k.name == name else None


def lengths_of(keys: Iterable[str], name: str) -> list[int]:
    """The lengths L, ascending, at which `name@L` is among `keys`."""
    return sorted({L for key in keys if (L := length_of(key, name)) is not None})
