"""LightningDataModule: token cache -> training windows, validation windows, eval spans.

The corpus (`pelab.data.sources`) is tokenized once into the token cache (`pelab.data.cache`) and served as the
deterministic training stream and the fixed validation / test windows of `pelab.data.windows`; with
`recall_mix > 0` a share of each batch's rows is synthetic recall (`pelab.data.mixer.RecallMixer`, unless a
`mixer` is given), scored as `recall_loss` says (the loss masks of `pelab.data.batch.Batch`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, IterableDataset

from pelab.data.batch import Batch
from pelab.data.cache import TokenCache, open_cache
from pelab.data.config import LOADER_KEYS, check_reserved, loader_settings
from pelab.data.corpora import SPLITS, to_plain
from pelab.data.mixer import RecallMixer
from pelab.data.recall.ruler_options import as_ruler
from pelab.data.sources import build_corpus
from pelab.data.tokenizer import tokenizer_fingerprint
from pelab.data.windows import FixedWindows, Mixer, TrainWindows, fixed_windows
from pelab.errors import ConfigError

# Bad loader settings (seq_len, batch_size, recall_mix, ...): the package's one user-error class.


class LMDataModule(L.LightningDataModule):
    """Corpus + tokenizer + token cache, served as deterministic windows.

    data:      the data config: `source` (stdlib | text_dir | hf | django_docs | shakespeare) plus that
               source's knobs (path, glob, name, config, text_field, data_files, doc_split, max_bytes, ...) and the
               loader keys (`pelab.data.config.LoaderConfig`: seq_len, recall_mix, ...); conf/data/ without its
               `_target_` (which names this class). A bare kind string works.
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
        data: Mapping[str, Any] | str,
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
        # (`data`), then keyword arguments; conf/data/_loader.yaml fills the rest. `batch_size`: per device.
        data = to_plain(data)
        given = {**(data if isinstance(data, Mapping) else {}), **to_plain(loader)}
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
        self.recall_ruler = as_ruler(to_plain(settings.recall_ruler))
        self.data_cfg, self.tokenizer_cfg = data, to_plain(tokenizer)
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
        open_cache(build_corpus(self.data_cfg, self.cache_dir), self.tokenizer_cfg, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.cache is not None:
            return
        cache = open_cache(build_corpus(self.data_cfg, self.cache_dir), self.tokenizer_cfg, self.cache_dir)
        for split in SPLITS:
            if cache.n_tokens(split) < self.seq_len + 1:
                raise ConfigError(
                    f"data.seq_len={self.seq_len} needs windows of {self.seq_len + 1} tokens but the {split} "
                    f"split has only {cache.n_tokens(split)}; lower data.seq_len or use a larger corpus"
                )
        self.cache = cache
        self.tokenizer = cache.tokenizer
        if self.recall_mix > 0 and self.mixer is None:
            self.mixer = RecallMixer(
                self.tokenizer, self.recall_kinds, self.recall_key_len, self.recall_value_len,
                pairs=self.recall_pairs, curriculum=self.recall_curriculum, ruler=self.recall_ruler,
            )
            self.mixer.check(self.seq_len + 1)  # a kind too long for a span: one line, before the first step
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
        # batch_size=None: each item already is a whole batch (a Batch of (B, T+1) tensors).
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
            raise ConfigError(
                f"asked for {n_tokens} contiguous {split} tokens but the split has {len(tokens)}; "
                "evaluate at shorter lengths / fewer windows or use a larger corpus (data.source)"
            )
        return torch.from_numpy(np.asarray(tokens[:n_tokens], dtype=np.int64))

    def n_tokens(self, split: str) -> int:
        self._require_setup()
        return self.cache.n_tokens(split)

    def document_starts(self, split: str = "val") -> np.ndarray:
        """(n_docs + 1,) int64: where each document of the split starts in `eval_tokens(split)`, then its
        length (the cache's `{split}.idx.npy`)."""
        self._require_setup()
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
        return np.asarray(self.cache.offsets(split), dtype=np.int64)

    def _require_setup(self) -> None:
        if self.cache is None:
            raise RuntimeError(
                "LMDataModule.setup() must run first (Lightning calls it; call it yourself otherwise)"
            )


# -- one process drawing a DDP run's data (debug.emulate_world_size) ------------------------------------
class RankUnion(IterableDataset):
    """Batch `step` = rows of rank 0, then rank 1, ...: what a W-rank run trains on at that step."""

    def __init__(self, parts: list[IterableDataset]):
        self.parts = parts

    def __iter__(self) -> Iterator[Batch]:
        for rows in zip(*self.parts):  # each of (B/W, T+1) tensors
            yield Batch.cat(rows)  # (B, T+1) tensors


class EmulatedWorldDataModule(LMDataModule):
    """`LMDataModule` whose training stream is the union of `world` ranks' streams; `batch_size` is per rank.
    DDP averages the ranks' gradients, i.e. the gradient of the mean loss over these same B rows."""

    def __init__(self, *args: Any, world: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.world = int(world)

    def train_dataset(self, start_step: int | None = None, rank: int | None = None) -> IterableDataset:
        return RankUnion([super(EmulatedWorldDataModule, self).train_dataset(start_step, rank=r)
                          for r in range(self.world)])
