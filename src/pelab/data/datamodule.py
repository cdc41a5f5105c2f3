"""LightningDataModule: token cache -> training windows, validation windows, eval spans.

Training batches are `(B, seq_len + 1)` LongTensors (inputs = [:, :-1], targets = [:, 1:]).
Batch number `step` on rank `r` is a pure function of (seed, step, r): its window starts come
from `np.random.default_rng(SeedSequence([seed, step, r]))`. So
- a run resumed at global step k sees exactly the batches an uninterrupted run sees
  (`train_dataloader()` starts at `trainer.global_step * accumulate_grad_batches`), and
- every DDP rank draws different windows, with no sampler coordination.
`step` counts micro-batches; the per-rank batch size is `batch_size`.

The stream is an IterableDataset (not map-style + sampler) on purpose: Lightning does not swap
in a DistributedSampler for iterable datasets, so the (seed, step, rank) scheme survives DDP
untouched, and an infinite stream never ends an "epoch" mid-run (the trainer stops at max_steps).

Recall mix hook: with `recall_mix = p > 0`, `mixer(n, length, rng, step, text) -> (n, length)` int array
(or `(rows, answer_mask)`) replaces the first n rows of each batch, where n ~ p * B (fractional part drawn
from rng, so the expected fraction is exactly p). It receives the batch's own generator, the step (for a
curriculum) and the (n, length) text rows it replaces (real training text, e.g. filler), so mixed batches
are as deterministic as plain ones. Without an explicit `mixer`, `RecallMixer` (synthetic sequences of the
`recall_kinds` from `pelab.data.recall.make_recall_batch`: "train" key space, `recall_key_len` /
`recall_value_len` hex chars, `recall_pairs` mqar pairs, `recall_curriculum` spans) is used.

Loss on mixed rows (`recall_loss`): "all" (default) = every token of a mixed row is a training target,
like text. "answers" = only the answer tokens (the retrieved values / passkeys) are. "two_means" = the mean
NLL over text targets (the text rows, and the real text that follows a curriculum span in a recall row)
plus the mean NLL over answer targets, each over the whole batch (`two_means`): the few answers weigh
as much as all the text. The batch stays one `(B, T+1)`
LongTensor; under "answers" and "two_means" a mixed row stores a token that is context only as `-1 - id`
(negative: fed, not scored) and an answer token as `id + ANSWER_FLAG` (fed, scored, and an answer);
`inputs_and_targets(batch)` turns a batch into model inputs (ids), targets (`IGNORE_INDEX` where not
scored) and, with `answers=True`, the answer mask. Text rows are never marked.
Why answer-only: a random key or value cannot be predicted, so with "all" most of a mixed row's
loss is irreducible noise and the few retrieval targets carry little of the gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from pelab.data.cache import TokenCache, open_cache
from pelab.data.config import LOADER_KEYS, check_reserved, loader_settings
from pelab.data.corpora import SPLITS, to_plain
from pelab.data.sources import build_corpus
from pelab.data.tokenizer import tokenizer_fingerprint
from pelab.errors import ConfigError

Mixer = Callable[..., Any]  # (n, length, rng, step, text) -> rows or (rows, answer_mask)

IGNORE_INDEX = -100  # target of a position that is not scored (F.cross_entropy's default ignore_index)
ANSWER_FLAG = 1 << 40  # added to an answer token's id in a batch (ids stay far below it)


def inputs_and_targets(
    batch: torch.Tensor, answers: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T+1) training batch -> inputs (B, T) ids, targets (B, T) ids or IGNORE_INDEX
    [, answer mask (B, T) bool: the target is a recall answer, with `answers=True`].

    Negative entries (`-1 - id`) are fed as `id` but not scored; entries >= ANSWER_FLAG are fed and scored as
    `id` and are answers (recall_loss answers / two_means; see the module doc).
    """
    is_answer = batch >= ANSWER_FLAG
    ids = torch.where(batch < 0, -1 - batch, batch - is_answer.long() * ANSWER_FLAG)  # (B, T+1)
    targets = torch.where(batch[:, 1:] < 0, IGNORE_INDEX, ids[:, 1:])  # (B, T)
    if answers:
        return ids[:, :-1], targets, is_answer[:, 1:]
    return ids[:, :-1], targets


# Bad loader settings (seq_len, batch_size, recall_mix, ...): the package's one user-error class.
DataConfigError = ConfigError


# ----------------------------------------------------------------------------- datasets


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

    def batch(self, step: int) -> torch.Tensor:
        """(B, seq_len + 1) int64 windows for global micro-step `step` on this rank."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, step, self.rank]))
        starts = rng.integers(0, self.n_tokens - self.seq_len, size=self.batch_size)  # (B,)
        idx = starts[:, None] + np.arange(self.seq_len + 1)  # (B, T+1)
        x = self.tokens[idx].astype(np.int64)
        if self.recall_mix > 0:
            x = self._mix(x, rng, step)
        return torch.from_numpy(x)

    def _mix(self, x: np.ndarray, rng: np.random.Generator, step: int) -> np.ndarray:
        share = getattr(self.mixer, "share", None)  # a mixer may change the fraction per step (curriculum)
        p = share(step, self.recall_mix) if share is not None else self.recall_mix
        want = p * self.batch_size
        n = min(self.batch_size, int(want) + int(rng.random() < want - int(want)))
        if n:
            out = self.mixer(n, self.seq_len + 1, rng, step=step, text=x[:n].copy())
            rows, answers, text = (tuple(out) + (None,) * 2)[:3] if isinstance(out, tuple) else (out, None, None)
            x[:n] = np.asarray(rows, dtype=np.int64)
            if self.recall_loss in ("answers", "two_means") and answers is not None:
                answers = np.asarray(answers, dtype=bool)  # (n, T+1)
                context = ~answers
                if self.recall_loss == "two_means" and text is not None:
                    context &= ~np.asarray(text, dtype=bool)  # the row's own text after the span: scored as text
                mixed = x[:n]  # a view
                mixed[context] = -1 - mixed[context]
                mixed[answers] += ANSWER_FLAG
        return x

    def __iter__(self) -> Iterator[torch.Tensor]:
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


class RecallMixer:
    """Default `mixer`: rows of synthetic recall sequences (pelab.data.recall), seeded from the
    batch's generator. A class (not a closure) so it pickles into DataLoader workers.

    kinds: which generators to mix (pelab.data.recall.TRAIN_KINDS); key_len / value_len: hex chars of kv
    keys / values; pairs: N of mqar rows; curriculum: [[step, span], ...] or [[step, span, share], ...]
    (from `step` on, each recall sequence occupies only the first `span` tokens of its row, then the row's
    own text; before the first entry and with None: the whole row; `share`, where given, replaces
    data.recall_mix from that step). With `answers=True` it returns `(rows, answer_mask, text_mask)`, each
    (n, length): `text_mask` marks the row's own text after the span (scored as text under two_means)."""

    def __init__(
        self,
        tokenizer: Any,
        kinds: Sequence[str] = ("kv", "passkey"),
        key_len: int = 3,
        value_len: int = 3,
        answers: bool = False,
        pairs: int = 8,
        curriculum: Sequence[Sequence[int]] | None = None,
    ):
        self.tokenizer, self.kinds = tokenizer, tuple(kinds)
        self.key_len, self.value_len, self.answers = int(key_len), int(value_len), bool(answers)
        self.pairs = int(pairs)
        # (step, span, share or None), sorted by step
        self.curriculum = sorted(
            (int(e[0]), int(e[1]), float(e[2]) if len(e) > 2 else None) for e in curriculum
        ) if curriculum else []

    def _stage(self, step: int) -> tuple[int | None, float | None]:
        """(span, share) of the curriculum stage holding `step` ((None, None) before the first)."""
        stage: tuple[int | None, float | None] = (None, None)
        for start, width, share in self.curriculum:
            if step >= start:
                stage = (width, share)
        return stage

    def span(self, step: int) -> int | None:
        """The recall span at this step (None = the whole row)."""
        return self._stage(step)[0]

    def share(self, step: int, default: float) -> float:
        """The fraction of recall rows at this step: the stage's share, else `default` (data.recall_mix)."""
        share = self._stage(step)[1]
        return default if share is None else share

    def __call__(
        self, n: int, length: int, rng: np.random.Generator, step: int = 0, text: np.ndarray | None = None
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        from pelab.data.recall import make_recall_batch

        span = self.span(step)
        rows, mask = make_recall_batch(
            self.tokenizer, length - 1, n, int(rng.integers(2**62)), kinds=self.kinds,
            key_len=self.key_len, value_len=self.value_len, return_mask=True, pairs=self.pairs,
            span=span, text=text,
        )  # (n, length) each
        rows = np.asarray(rows, dtype=np.int64)
        if not self.answers:
            return rows
        text_mask = np.zeros((n, length), dtype=bool)
        if span is not None and text is not None:
            text_mask[:, span + 1 :] = True  # real text after the span (its first token follows recall tokens)
        return rows, mask.numpy(), text_mask


# ----------------------------------------------------------------------------- DataModule


class LMDataModule(L.LightningDataModule):
    """Corpus + tokenizer + token cache, served as deterministic windows.

    source:    the data config: `source` (stdlib | text_dir | hf) plus that source's knobs
               (path, glob, name, config, text_field, data_files, doc_split, max_bytes, ...) and the
               loader keys (`pelab.data.config.LoaderConfig`: seq_len, recall_mix, ...). A bare kind string
               works.
    tokenizer: the tokenizer config: `kind` (bpe | byte | pretrained) plus its knobs.
    batch_size: rows per step on this device (the harness divides the global data.batch_size); None = the
               data config's.
    max_steps: stop the training stream after this many batches (micro-steps); None = endless,
               which is what a Trainer wants (it stops at trainer.max_steps; with an endless
               stream `trainer.val_check_interval` must be an int number of steps).
    **loader:  loader keys that replace the data config's (e.g. seq_len=32, recall_mix=0); any key left
               out takes its value from conf/data/_loader.yaml, the one place the defaults are written.
    """

    def __init__(
        self,
        source: Mapping[str, Any] | str,
        tokenizer: Mapping[str, Any] | str,
        batch_size: int | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
        max_steps: int | None = None,
        mixer: Mixer | None = None,
        **loader: Any,
    ):
        super().__init__()
        # The loader keys (pelab.data.config.LoaderConfig: seq_len, recall_mix, ...) come from the data config
        # (`source`), then keyword arguments; conf/data/_loader.yaml fills the rest. `batch_size`: per device.
        source = to_plain(source)
        given = {**(source if isinstance(source, Mapping) else {}), **to_plain(loader)}
        if batch_size is not None:
            given["batch_size"] = batch_size
        if isinstance(given.get("recall_kinds"), str):
            given["recall_kinds"] = [given["recall_kinds"]]
        unknown = sorted(set(loader) - set(LOADER_KEYS))
        if unknown:
            raise TypeError(f"LMDataModule got unknown loader settings {unknown}; known: {list(LOADER_KEYS)}")
        settings = loader_settings(given)
        self.settings: dict[str, Any] = OmegaConf.to_container(settings)  # the loader keys, as used
        # pairs vs the reserved ids, before any data cost (the tokenizer config is not typed here).
        check_reserved(tokenizer_fingerprint(to_plain(tokenizer)), settings, probes=None)
        self.recall_kinds = tuple(settings.recall_kinds)
        self.recall_key_len, self.recall_value_len = settings.recall_key_len, settings.recall_value_len
        self.recall_loss = settings.recall_loss
        self.recall_pairs = settings.recall_pairs
        self.recall_curriculum = to_plain(settings.recall_curriculum)
        self.source_cfg, self.tokenizer_cfg = source, to_plain(tokenizer)
        self.seq_len, self.batch_size, self.seed = settings.seq_len, settings.batch_size, int(seed)
        self.cache_dir, self.val_windows = cache_dir, settings.val_windows
        self.val_batch_size = settings.val_batch_size or settings.batch_size
        self.recall_mix, self.mixer = settings.recall_mix, mixer
        self.num_workers, self.max_steps = settings.num_workers, max_steps
        self.cache: TokenCache | None = None

    # -- Lightning hooks ----------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Build the cache (Lightning calls this on one process per node; a file lock guards
        against other nodes sharing the folder)."""
        open_cache(build_corpus(self.source_cfg), self.tokenizer_cfg, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.cache is not None:
            return
        cache = open_cache(build_corpus(self.source_cfg), self.tokenizer_cfg, self.cache_dir)
        for split in SPLITS:
            if cache.n_tokens(split) < self.seq_len + 1:
                raise DataConfigError(
                    f"data.seq_len={self.seq_len} needs windows of {self.seq_len + 1} tokens but the {split} "
                    f"split has only {cache.n_tokens(split)}; lower data.seq_len or use a larger corpus"
                )
        self.cache = cache
        self.tokenizer = cache.tokenizer
        if self.recall_mix > 0 and self.mixer is None:
            self.mixer = RecallMixer(
                self.tokenizer, self.recall_kinds, self.recall_key_len, self.recall_value_len,
                answers=self.recall_loss in ("answers", "two_means"), pairs=self.recall_pairs,
                curriculum=self.recall_curriculum,
            )
        self.vocab_size: int = int(cache.meta["vocab_size"])
        self.eot_id: int = int(cache.meta["eot_id"])
        self.reserved: dict[str, list[int]] = dict(cache.meta["reserved"])  # {"keys": [a, b], "values": [b, c]}
        self.bytes_per_token: float = cache.bytes_per_token("val")
        self.fingerprint: dict[str, Any] = {
            **cache.meta["fingerprint"],
            "cache_path": str(cache.path),
            "vocab_size": self.vocab_size,
            "reserved": self.reserved,
            "splits": cache.meta["splits"],
        }
        self._val = fixed_windows(cache.tokens("val"), self.seq_len, self.val_windows)  # (N, T+1)
        self._test = fixed_windows(cache.tokens("test"), self.seq_len, self.val_windows)

    def _trainer_attr(self, name: str, default: int) -> int:
        trainer = self.trainer  # None outside a Trainer
        return int(getattr(trainer, name, default)) if trainer is not None else default

    def train_dataset(self, start_step: int | None = None, rank: int | None = None) -> TrainWindows:
        """The batch stream; defaults follow the attached trainer (resume step, global rank)."""
        self._require_setup()
        if start_step is None:
            start_step = self._trainer_attr("global_step", 0) * self._trainer_attr(
                "accumulate_grad_batches", 1
            )
        if rank is None:
            rank = self._trainer_attr("global_rank", 0)
        return TrainWindows(
            str(self.cache.path / "train.bin"),
            self.cache.dtype.name,
            self.cache.n_tokens("train"),
            self.seq_len,
            self.batch_size,
            self.seed,
            rank=rank,
            start_step=start_step,
            max_steps=self.max_steps,
            recall_mix=self.recall_mix,
            mixer=self.mixer,
            recall_loss=self.recall_loss,
        )

    def train_dataloader(self) -> DataLoader:
        # batch_size=None: each item already is a whole (B, T+1) batch.
        return DataLoader(
            self.train_dataset(),
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        self._require_setup()
        return DataLoader(FixedWindows(self._val), batch_size=self.val_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        self._require_setup()
        return DataLoader(FixedWindows(self._test), batch_size=self.val_batch_size, shuffle=False)

    def state_dict(self) -> dict[str, Any]:
        # Saved in checkpoints, so a resume can tell it is reading a different corpus/tokenizer.
        key = self.cache.meta["fingerprint"]["key"] if self.cache is not None else None
        return {"cache_key": key, "seed": self.seed, "seq_len": self.seq_len, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        changed = [
            k
            for k in ("cache_key", "seed", "seq_len", "batch_size")
            if state.get(k) is not None and mine[k] is not None and state[k] != mine[k]
        ]
        if changed:
            import warnings

            warnings.warn(
                f"resuming with different data settings ({', '.join(changed)}): the batch stream will not "
                "continue the checkpointed run exactly",
                stacklevel=2,
            )

    # -- evaluation access -------------------------------------------------------------------

    def eval_tokens(self, split: str = "val", n_tokens: int | None = None) -> torch.Tensor:
        """(N,) int64: the first `n_tokens` of the split's stream (documents joined by EOT);
        the whole split if None."""
        self._require_setup()
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
        tokens = self.cache.tokens(split)
        if n_tokens is None:
            n_tokens = len(tokens)
        if not 0 < n_tokens <= len(tokens):
            raise DataConfigError(
                f"asked for {n_tokens} contiguous {split} tokens but the split has {len(tokens)}; "
                "evaluate at shorter lengths / fewer windows or use a larger corpus (data.source)"
            )
        return torch.from_numpy(np.asarray(tokens[:n_tokens], dtype=np.int64))

    def n_tokens(self, split: str) -> int:
        self._require_setup()
        return self.cache.n_tokens(split)

    def _require_setup(self) -> None:
        if self.cache is None:
            raise RuntimeError(
                "LMDataModule.setup() must run first (Lightning calls it; call it yourself otherwise)"
            )
