"""The difficulty of the RULER-style kinds (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", NVIDIA/RULER ``scripts/data/synthetic/``): how many keys, values, queries, hops, chains and words
an instance holds. One typed group, ``data.recall_ruler`` (the training rows), which ``probes.ruler`` follows; its
minimums (`MINIMUMS`) are the issue-56 floor every run must meet, checked with the config (`check_ruler`).

RULER's own settings (``scripts/synthetic.yaml``) for comparison: niah_multikey_1 4 keys (3 distractors),
niah_multivalue 4 values, niah_multiquery 4 queries, vt 1 chain of 4 hops, cwe 10 common words (30 repeats) among
uncommon ones (3 repeats). The minimums here are lower where a 2-layer model on a CPU must learn the task in minutes,
and add what RULER's defaults lack: a distractor chain for variable tracking."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from pelab.checks import need


@dataclass
class RulerOptions:
    """* ``distractor_keys``: niah_multikey's needles with other keys than the asked one (RULER: 3).
    * ``values``: niah_multivalue's values of the one key, all asked (RULER: 4).
    * ``queries``: niah_multiquery's keys asked at once, each with its own needle (RULER: 4).
    * ``hops``: vt's assignments after the value in each chain, ``X1 = v, X2 = X1, ...`` (RULER: 4).
    * ``chains``: vt's chains, the asked one and ``chains - 1`` distractor chains (RULER: 1).
    * ``words``: cwe's distinct words in the list (RULER: 10 common + the uncommon ones that fit).
    * ``common``: cwe's most frequent words asked, in decreasing frequency (RULER: 10, in any order)."""

    distractor_keys: int = 3
    values: int = 2
    queries: int = 2
    hops: int = 2
    chains: int = 2
    words: int = 10
    common: int = 3


# the least difficulty a run may set (issue 56): key -> (minimum, why)
MINIMUMS: dict[str, tuple[int, str]] = {
    "distractor_keys": (3, "multi-key needles need >= 3 distractor keys"),
    "values": (2, "multi-value needles need >= 2 values of the asked key"),
    "queries": (2, "multi-query needles need >= 2 keys asked"),
    "hops": (2, "variable tracking needs >= 2 hops"),
    "chains": (2, "variable tracking needs the asked chain and >= 1 distractor chain"),
    "words": (10, "common-words extraction needs >= 10 distinct words"),
    "common": (2, "common-words extraction asks >= 2 words"),
}


def as_ruler(value: RulerOptions | Mapping[str, Any] | None) -> RulerOptions:
    """`RulerOptions` from a typed group, a plain mapping (a DictConfig's container) or None (the defaults)."""
    if value is None or isinstance(value, RulerOptions):
        return value or RulerOptions()
    if hasattr(value, "items"):
        known = {f.name for f in fields(RulerOptions)}
        return RulerOptions(**{k: int(v) for k, v in dict(value.items()).items() if k in known})
    raise TypeError(f"RULER options must be a mapping of {[f.name for f in fields(RulerOptions)]}, got {value!r}")


def check_ruler(value: RulerOptions | Mapping[str, Any], key: str) -> None:
    """The minimum difficulty (`MINIMUMS`) and the words / common relation of group ``key`` (data.recall_ruler,
    probes.ruler): a one-line ConfigError naming the key and its minimum."""
    r = asdict(as_ruler(value)) if isinstance(value, RulerOptions) else dict(value.items())
    for name, (least, why) in MINIMUMS.items():
        need(r[name] >= least, f"{key}.{name}", r[name], f"is below the minimum {least}: {why} (RULER, issue 56).")
    need(r["common"] < r["words"], f"{key}.common", r["common"],
         f"must be below {key}.words={r['words']}: the list needs uncommon words beside the common ones.")
