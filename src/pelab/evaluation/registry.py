"""The evaluation table: one `Evaluation` per evaluation the suite runs, registered by name in `EVALUATIONS`
(a plain dict, like the probe-kind table). `suite.run_evaluation` loops over it: run, metrics, summary.json
entry, figures, W&B; the report reads each entry's `sections`. Torch-free (the report reads it): the run
functions import what they need.

The built-in evaluations (extrapolation, attention diagnostics, probes) are registered in `builtin.py`. One
defined outside the package registers itself when its module is imported (``register_evaluation(...)`` at
module level); a run names that module in ``+probes.plugins=[module]``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pelab.evaluation.config import EvalConfig, ProbesConfig


@dataclass
class EvalSettings:
    """What every evaluation of one suite run shares: the config (the run's whole config, for an evaluation
    defined outside the package), its `eval` and `probes` groups typed (`EvalConfig`, `ProbesConfig`), the
    training length, the evaluation lengths (tokens), the evaluation blocks of those lengths (K, max(lengths) + 1),
    the device and the figures' label; the document of each block (K,) and the split's document count (None: not
    known); the training length of the run this one extends (None: not an extended run)."""

    cfg: Any
    eval: EvalConfig
    probes: ProbesConfig
    train_length: int
    lengths: list[int]
    blocks: Any
    device: Any
    label: str
    block_docs: Any = None
    split_documents: int | None = None
    parent_train_length: int | None = None


@dataclass
class EvalResult:
    """What an evaluation returns. ``metrics``: metric keys (pelab.metric_keys) -> value; ``record``: its entry
    under summary.json's ``evaluation`` (plain JSON); ``figures``: name -> matplotlib figure (saved as
    plots/<name>.png); ``rows``: its table rows (W&B tables); ``seconds``: recorded under ``evaluation.seconds``
    (None: not timed); ``result``: the result object, for its W&B plots."""

    metrics: dict[str, float] = field(default_factory=dict)
    record: Any = None
    figures: dict[str, Any] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    seconds: float | None = None
    result: Any = None


@dataclass(frozen=True)
class ReportSection:
    """A report section of metric tables (one per (metric name, title)) and figures (names), with a text."""

    heading: str
    tables: tuple[tuple[str, str], ...] = ()
    figures: tuple[str, ...] = ()
    text: str = ""
    digits: int = 3


@dataclass(frozen=True)
class Evaluation:
    """One evaluation. ``run(model, datamodule, settings) -> EvalResult``; ``enabled(settings)``: whether this run
    asks for it (``settings``: the suite's `EvalSettings`); ``wandb(result, ns) -> dict``: its W&B tables and plots (wandb imported inside; ``ns`` the
    variant's namespace, "" or "prefix/"); ``null_when_off``: summary.json holds ``name: null`` when it is off
    (the probes always have); ``sections``: what the report shows of it, beyond the report's own sections."""

    name: str
    run: Callable[..., EvalResult]
    enabled: Callable[[EvalSettings], bool] = lambda settings: True
    wandb: Callable[[EvalResult, str], dict] | None = None
    null_when_off: bool = False
    sections: tuple[ReportSection, ...] = ()


EVALUATIONS: dict[str, Evaluation] = {}


def register_evaluation(evaluation: Evaluation) -> Evaluation:
    """Add ``evaluation`` to the table (its name must be new); returns it."""
    if evaluation.name in EVALUATIONS:
        raise ValueError(f"evaluation {evaluation.name!r} is already registered")
    EVALUATIONS[evaluation.name] = evaluation
    return evaluation
