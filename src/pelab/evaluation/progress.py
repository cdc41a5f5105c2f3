"""The evaluation's progress bar: windows / probe instances done of their total and the time left, drawn as
Lightning's `TQDMProgressBar` draws training (tqdm on stdout, `dynamic_ncols`, the rate averaged over the whole
bar: `smoothing=0`).

The time left counts compute, not windows: each forward advances the bar by its FLOPs (`forward_flops_per_token`
at its length, PaLM's estimate for a forward: 2 N + 4 l d T per token, as `pelab.runs.eval_cost`), because the
lengths run shortest first and a window of 8 x L costs more than eight of L (attention).

The suite turns bars on for the evaluation it runs (`showing(True)`: the end of training with a progress bar,
`eval.py`); an evaluation opens one bar over its forwards (`opened(...)`), and
`pelab.evaluation.common.stoppable_forward` advances the open one. Anywhere else (an evaluation during training,
a library call) nothing is drawn. Standard library and tqdm only: `pelab.runs.eval_cost` reads the FLOPs
formula without torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

BAR_FORMAT = "{l_bar}{bar}| {count} [{elapsed}<{remaining}]"  # Lightning's, the items in place of n / total
LOG_REFRESH_SECONDS = 30.0  # stdout is a file (a log, CI, SLURM): a line every 30 s at most, not every forward


def forward_flops_per_token(matmul_params: int, n_layers: int, d_model: int, length: int) -> float:
    """A forward's FLOPs per token at window length `length`: 2 N + 4 l d T (PaLM's 6 N + 12 l d T for training,
    a third: no backward)."""
    return 2.0 * matmul_params + 4.0 * n_layers * d_model * length


def model_flops_per_token(model: Any) -> Callable[[int], float]:
    """length -> a forward's FLOPs per token of `model` (pelab's GPT); 1 for any other module (the bar then
    counts tokens)."""
    if not (hasattr(model, "matmul_params") and hasattr(model, "config")):
        return lambda length: 1.0
    n, layers, d = model.matmul_params(), model.config.n_layers, model.config.d_model
    return lambda length: forward_flops_per_token(n, layers, d, length)


class Progress:
    """One evaluation's bar. `parts`: (items, length) of each group of forwards it will run (windows of a
    length, probe instances of a length); the bar's position is the compute done, its postfix the items."""

    def __init__(self, desc: str, unit: str, parts: Sequence[tuple[int, int]], flops_per_token: Callable[[int], float]):
        self.unit, self.flops_per_token, self.done = unit, flops_per_token, 0
        self.items = sum(count for count, _ in parts)
        work = sum(count * length * flops_per_token(length) for count, length in parts)
        tty = sys.stdout.isatty()
        self.bar = _bar_class()(self.count(), total=work, desc=desc, leave=True, dynamic_ncols=True,
                                file=sys.stdout, smoothing=0, bar_format=BAR_FORMAT,
                                mininterval=0.1 if tty else LOG_REFRESH_SECONDS)

    def count(self) -> str:
        return f"{self.done}/{self.items} {self.unit}"

    def advance(self, items: int, length: int) -> None:
        """`items` forwards' rows of `length` tokens done (or skipped: a length the encoding cannot represent)."""
        self.done = min(self.items, self.done + items)
        self.bar.count = self.count()
        self.bar.update(items * length * self.flops_per_token(length))

    def close(self) -> None:
        self.bar.close()


def _bar_class() -> type:
    """tqdm with the `{count}` field of BAR_FORMAT (imported only when a bar is drawn; tqdm draws Lightning's
    bar too)."""
    from tqdm import tqdm

    class CountingBar(tqdm):
        def __init__(self, count: str, **kwargs: Any) -> None:
            self.count = count  # before tqdm draws the bar's first state
            super().__init__(**kwargs)

        @property
        def format_dict(self) -> dict[str, Any]:
            return {**super().format_dict, "count": self.count}

    return CountingBar


_state: dict[str, Any] = {"show": False, "open": None}


@contextmanager
def showing(show: bool) -> Iterator[None]:
    """Bars drawn (or not) for the evaluations run inside."""
    before = _state["show"]
    _state["show"] = bool(show)
    try:
        yield
    finally:
        _state["show"] = before


@contextmanager
def opened(desc: str, unit: str, parts: Sequence[tuple[int, int]], model: Any) -> Iterator[Progress | None]:
    """A bar over the forwards inside, when bars are shown (None otherwise); closed on the way out, a stop
    included."""
    if not _state["show"] or _state["open"] is not None:  # one bar at a time: an inner evaluation draws none
        yield None
        return
    progress = _state["open"] = Progress(desc, unit, parts, model_flops_per_token(model))
    try:
        yield progress
    finally:
        _state["open"] = None
        progress.close()


def advance(items: int, length: int) -> None:
    """The open bar (if any) by one forward of `items` rows of `length` tokens."""
    if _state["open"] is not None:
        _state["open"].advance(items, length)
