"""The probe-kind table: one `ProbeKind` per recall kind, registered by name in `PROBE_KINDS` (in the style of
Hugging Face's ``ROPE_INIT_FUNCTIONS``: a plain dict from name to entry). The rest of the code asks the entry
(its builders, layout, vocabulary, minimum length) instead of branching on kind names.

The built-in kinds are registered in `builtin.py`. A kind defined outside the package registers itself when
its module is imported (``register_probe_kind(ProbeKind(...))`` at module level) and is named in
``probes.plugins`` (conf/probes/), which `import_plugins` imports before the probe settings are checked."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pelab.data.recall.ruler_options import RulerOptions
from pelab.errors import ConfigError

# The built-in kind names (registered in builtin.py, in this order).
KV = "kv"
PASSKEY = "passkey"
MQAR = "mqar"
KV_SINGLE = "kv_single"
PASSKEY_SINGLE = "passkey_single"
MQAR_OFFSET = "mqar_offset"

DEPTH, OFFSET = "depth", "offset"  # cell layouts: depth x length, or filler prefix before a training window


@dataclass(frozen=True)
class RecallOptions:
    """The settings a kind's builders read (probes.* for probes, data.recall_* for the training mix).
    ``filler_ids``: real text ids (None: the fixed sentence); ``space``: "train" / "probe" key space;
    ``prefix_multiple``: offset layout, filler before the window in multiples of it; ``ruler``: the RULER-style
    kinds' difficulty (data.recall_ruler / probes.ruler)."""

    space: str = "probe"
    filler_ids: Sequence[int] | None = None
    key_len: int = 3
    value_len: int = 3
    pairs: int = 8
    prefix_multiple: int = 0
    max_extra_queries: int = 3
    ruler: RulerOptions = field(default_factory=RulerOptions)


def no_vocabulary(pairs: int) -> dict[str, int]:
    """A kind that draws no reserved ids."""
    return {}


@dataclass(frozen=True)
class ProbeKind:
    """One recall kind.

    * ``family``: the generator it shares with its variants (kv, passkey, mqar), for documentation and reports.
    * ``probe(pc, name, length, depth, n, seed, opts) -> list[RecallSample]``: the probe samples of one cell.
    * ``row(pc, length, rng, opts) -> (ids, answer mask)``: one training-mix sequence; None = probe only.
    * ``rows(pc, text, g, span, opts) -> (rows, mask)``: optional vectorised training rows over real text
      ``text`` (n, T), built for a whole batch at once (numpy generator ``g``); used by make_recall_batch.
    * ``vocabulary(pairs) -> {tokenizer setting: ids needed}``: the reserved ids it draws from;
      ``ruler_vocabulary(ruler)``: the same for a kind whose needs follow its `RulerOptions` (used in its place).
    * ``single_token``: answers are one reserved id.
    * ``min_length(pairs)`` / ``row_min_length(pairs)``: tokens a probe / a training row needs, checked with
      the config (None: checked when a sample is built, RecallLengthError); ``min_length_rule`` /
      ``row_min_length_rule`` say it in words for the error message ("2 x pairs + 2").
    * ``layout``: DEPTH (cells by depth x length) or OFFSET (cells by filler prefix before a training-length
      window; probed once per probes.prefix_multiples entry).
    * ``title``: a subtitle for reports ("position vs distance").
    """

    name: str
    family: str
    probe: Callable[..., list]
    row: Callable[..., tuple[list[int], list[bool]]] | None = None
    rows: Callable[..., Any] | None = None
    vocabulary: Callable[[int], dict[str, int]] = no_vocabulary
    ruler_vocabulary: Callable[[RulerOptions], dict[str, int]] | None = None
    single_token: bool = False
    min_length: Callable[[int], int] | None = None
    row_min_length: Callable[[int], int] | None = None
    min_length_rule: str = ""
    row_min_length_rule: str = ""
    layout: str = DEPTH
    title: str = ""

    @property
    def trainable(self) -> bool:
        """Whether the training mix (data.recall_kinds) can draw it."""
        return self.row is not None


PROBE_KINDS: dict[str, ProbeKind] = {}


def register_probe_kind(kind: ProbeKind) -> ProbeKind:
    """Add ``kind`` to the table (its name must be new, its layout known); returns it."""
    if kind.name in PROBE_KINDS:
        raise ValueError(f"probe kind {kind.name!r} is already registered")
    if kind.layout not in (DEPTH, OFFSET):
        raise ValueError(f"probe kind {kind.name!r}: layout must be {DEPTH!r} or {OFFSET!r}, got {kind.layout!r}")
    PROBE_KINDS[kind.name] = kind
    return kind


def kind_names(trainable: bool | None = None) -> tuple[str, ...]:
    """The registered kind names in registration order (``trainable=True``: those the training mix can draw)."""
    return tuple(k for k, e in PROBE_KINDS.items() if trainable is None or e.trainable == trainable)


def probe_kind(name: str, what: str = "probes.kinds entry") -> ProbeKind:
    """The entry of ``name``; ValueError naming the known kinds otherwise."""
    if name not in PROBE_KINDS:
        raise ValueError(f"unknown {what} {name!r}; known: {list(PROBE_KINDS)}")
    return PROBE_KINDS[name]


def import_plugins(modules: Sequence[str], setting: str = "probes.plugins") -> None:
    """Import the modules that register kinds (or evaluations) defined outside the package."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"{setting}: cannot import {name!r} ({err}); put its folder on PYTHONPATH.") from err
