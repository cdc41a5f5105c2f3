"""The window datasets: the deterministic training stream (`TrainWindows`) and the fixed validation / test
windows (`FixedWindows`, `fixed_windows`).

Training batches are `pelab.data.batch.Batch`es of `(B, seq_len + 1)` tokens (inputs = [:, :-1], targets =
[:, 1:]) with their loss masks. Batch number `step` on rank `r` is a pure function of (seed, step, r): its
window starts come from `np.random.default_rng(SeedSequence([seed, step, r]))`. So
- a run resumed at global step k sees exactly the batches an uninterrupted run sees
  (`train_dataloader()` starts at `trainer.global_step * accumulate_grad_batches`), and
- every DDP rank draws different windows, with no sampler coordination.
`step` counts micro-batches; the per-rank batch size is `batch_size`.

The stream is an IterableDataset (not map-style + sampler) on purpose: Lightning does not swap
in a DistributedSampler for iterable datasets, so the (seed, step, rank) scheme survives DDP
untouched, and an infinite stream never ends an "epoch" mid-run (the trainer stops at max_steps).

Recall mix hook: with `recall_mix = p > 0`, `mixer(n, length, rng, step, text) -> MixedRows` replaces the first
n rows of each batch, where n ~ p * B (fractional part drawn from rng, so the expected fraction is exactly p).
It receives the batch's own generator, the step (for a curriculum) and the (n, length) text rows it replaces
(real training text, e.g. filler), so mixed batches are as deterministic as plain ones. The default mixer is
`pelab.data.mixer.RecallMixer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from pelab.data.batch import Batch


class MixedRows(NamedTuple):
    """What a mixer returns: its rows and which of their tokens are answers and the row's own text."""

    tokens: np.ndarray  # (n, length) ids
    answers: np.ndarray  # (n, length) bool: scored (and an answer) under recall_loss answers / two_means
    text: np.ndarray  # (n, length) bool: real text (after a curriculum span): scored as text under two_means


Mixer = Callable[..., MixedRows]  # (n, length, rng, step, text) -> MixedRows


class TrainWindows(IterableDataset):
    """Infinite (or up to `max_steps`) stream of batches; batch `step` = f(seed, step, rank)."""

    def __init__(
        self,
        bin_path: str,
        dtype: str,
        n_tokens: int,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        start_step: int = 0,
        max_steps: int | None = None,
        recall_mix: float = 0.0,
        mixer: Mixer | None = None,
        recall_loss: str = "all",
    ):
        self.bin_path, self.dtype, self.n_tokens = bin_path, dtype, n_tokens
        self.seq_len, self.batch_size, self.seed, self.rank = seq_len, batch_size, seed, rank
        self.start_step, self.max_steps = start_step, max_steps
        self.recall_mix, self.mixer, self.recall_loss = recall_mix, mixer, recall_loss
        self._mm: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Workers reopen the memmap instead of receiving a pickled copy of the corpus.
        return {**self.__dict__, "_mm": None}

    @property
    def tokens(self) -> np.memmap:
        if self._mm is None:
            self._mm = np.memmap(self.bin_path, dtype=self.dtype, mode="r", shape=(self.n_tokens,))
        return self._mm

    def batch(self, step: int) -> Batch:
        """The (B, seq_len + 1) windows for global micro-step `step` on this rank, with their loss masks."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, step, self.rank]))
        starts = rng.integers(0, self.n_tokens - self.seq_len, size=self.batch_size)  # (B,)
        idx = starts[:, None] + np.arange(self.seq_len + 1)  # (B, T+1)
        x = self.tokens[idx].astype(np.int64)
        scored, answers = np.ones(x.shape, dtype=bool), np.zeros(x.shape, dtype=bool)  # (B, T+1) each
        if self.recall_mix > 0:
            self._mix(x, scored, answers, rng, step)
        return Batch.of(x, scored, answers)

    def _mix(self, x: np.ndarray, scored: np.ndarray, answers: np.ndarray, rng: np.random.Generator,
             step: int) -> None:
        """The mixer's rows into the first n rows of x, and their loss masks into scored / answers (in place)."""
        share = getattr(self.mixer, "share", None)  # a mixer may change the fraction per step (curriculum)
        p = share(step, self.recall_mix) if share is not None else self.recall_mix
        want = p * self.batch_size
        n = min(self.batch_size, int(want) + int(rng.random() < want - int(want)))
        if n:
            mixed = self.mixer(n, self.seq_len + 1, rng, step=step, text=x[:n].copy())
            x[:n] = np.asarray(mixed.tokens, dtype=np.int64)
            if self.recall_loss in ("answers", "two_means"):
                answer = np.asarray(mixed.answers, dtype=bool)  # (n, T+1)
                context = ~answer
                if self.recall_loss == "two_means":
                    context &= ~np.asarray(mixed.text, dtype=bool)  # the row's own text after the span: scored as text
                scored[:n], answers[:n] = ~context, answer

    def __iter__(self) -> Iterator[Batch]:
        # Worker w of W takes steps start+w, start+w+W, ...; DataLoader returns them in order.
        info = get_worker_info()
        w, n_w = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start_step + w
        while self.max_steps is None or step < self.max_steps:
            yield self.batch(step)
            step += n_w


class FixedWindows(Dataset):
    """Rows of a fixed (N, seq_len + 1) int64 tensor (validation / test)."""

    def __init__(self, windows: torch.Tensor):
        self.windows = windows

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.windows[i]


def fixed_windows(tokens: np.ndarray, seq_len: int, n_windows: int | None) -> torch.Tensor:
    """(N, seq_len + 1) windows on the grid start = i * seq_len (each target scored once),
    `n_windows` of them spread evenly over the split (all of them if None/0 or too few)."""
    available = (len(tokens) - 1) // seq_len
    if n_windows and n_windows < available:
        grid = np.unique(np.linspace(0, available - 1, n_windows).round().astype(np.int64))
    else:
        grid = np.arange(available)
    idx = grid[:, None] * seq_len + np.arange(seq_len + 1)  # (N, T+1)
    return torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
