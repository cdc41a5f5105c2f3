"""The induction-heads task (pelab.data.recall.induction) as a training source: a LightningDataModule that serves
fresh sequences every step on the task's own 16-token vocabulary (Gu & Dao 2023, App. E.1: "randomly generating
data every step"), selected by ``data=induction_heads`` (conf/data/induction_heads.yaml names it as its
``_target_``).

What the harness reads from a data module, for this source:

* training batches (B, L + 2) int64, batch ``step`` on rank ``r`` drawn from SeedSequence([seed, step, r]) as the
  text stream's windows (`pelab.data.windows`): a resumed run sees the batches an uninterrupted run sees;
  ``data.targets``: ``all`` = every next token is a target (safari's labels: the L random draws are noise, the
  answer is the one predictable target), ``answer`` = the answer only (the other tokens are fed, not scored:
  the loss masks of `pelab.data.batch.Batch`);
* validation: ``data.val_windows`` fixed sequences (every position scored: val/ppl, about 14 for any model,
  the random draws); the answer accuracy is the probe's (``callbacks.retrieval_criterion`` during training);
* "text" of the val / test splits for the harness's perplexity evaluation: ``data.eval_rows`` fixed sequences
  end to end, each its own document;
* ``tokenizer`` = the task's vocabulary (`InductionVocabulary`), which the probes of ``induction_heads`` use.

`InductionCurve` (a Lightning callback, ``callbacks.induction_curve``) scores fixed probe instances at a few task
lengths every N steps: the along-training curve of each run, from which its plateau is judged.

``tokenizer.*`` is not read (the vocabulary is the task's); neither are the text-mix keys of
conf/data/_loader.yaml (recall_*): every row is an induction sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, IterableDataset

from pelab.conf_values import with_file_values
from pelab.data.batch import Batch
from pelab.data.config import loader_settings
from pelab.data.corpora import SPLITS, to_plain
from pelab.data.recall.factories import make_probe_samples
from pelab.data.recall.induction import (
    INDUCTION_HEADS,
    VOCABULARY,
    InductionVocabulary,
    check_length,
    induction_rows,
)
from pelab.data.windows import FixedWindows
from pelab.errors import ConfigError
from pelab.metric_keys import metric_key

TARGETS = ("all", "answer")  # data.targets
SPLIT_TAGS = {"val": 1, "test": 2}  # the fixed rows of a split: SeedSequence([tag, L]), whatever the run's seed


def induction_batch(rows: np.ndarray, targets: str) -> Batch:
    """(n, L + 2) rows as a training batch: every next token a target (``all``), or the answer only, marked as
    the answer (``answer``: the other tokens are fed, not scored)."""
    if targets == "all":
        return Batch.text(torch.from_numpy(rows))
    last = np.zeros(rows.shape, dtype=bool)  # (n, L + 2)
    last[:, -1] = True
    return Batch.of(rows, last, last.copy())


class InductionStream(IterableDataset):
    """Endless (or up to ``max_steps``) batches of fresh induction sequences; batch ``step`` = f(seed, step, rank)."""

    def __init__(self, length: int, batch_size: int, seed: int, rank: int = 0, start_step: int = 0,
                 max_steps: int | None = None, targets: str = "all"):
        self.length, self.batch_size, self.seed, self.rank = int(length), int(batch_size), int(seed), int(rank)
        self.start_step, self.max_steps, self.targets = int(start_step), max_steps, targets

    def batch(self, step: int) -> Batch:
        """(B, L + 2) rows for global micro-step ``step`` on this rank, with their loss masks."""
        g = np.random.default_rng(np.random.SeedSequence([self.seed, int(step), self.rank]))
        rows, _ = induction_rows(g, self.batch_size, self.length)
        return induction_batch(rows, self.targets)

    def __iter__(self) -> Iterator[Batch]:
        step = self.start_step
        while self.max_steps is None or step < self.max_steps:
            yield self.batch(step)
            step += 1


class InductionDataModule(L.LightningDataModule):
    """Fresh induction-heads sequences of task length ``data.seq_len`` (see the module doc). The arguments are
    those `pelab.runs.build.build_datamodule` passes any data module: ``data`` the data config (the loader
    keys of conf/data/_loader.yaml plus ``targets``, ``eval_rows``, ``long_probe_samples`` and ``long_probe_from``),
    ``tokenizer`` (not read), the per-device
    ``batch_size``, ``seed``, ``cache_dir`` (nothing is cached) and ``max_steps``."""

    def __init__(self, data: Mapping[str, Any], tokenizer: Any = None, batch_size: int | None = None,
                 seed: int = 0, cache_dir: str | None = None, max_steps: int | None = None, **loader: Any):
        super().__init__()
        data = to_plain(data)
        if not isinstance(data, Mapping) or data.get("source") != INDUCTION_HEADS:
            raise ConfigError(f"InductionDataModule serves data.source={INDUCTION_HEADS}; use data=induction_heads "
                              "(experiment=induction_heads), or another data config for a text corpus.")
        # a key the config lacks (one built by hand) comes from conf/data/induction_heads.yaml
        given = with_file_values({**data, **to_plain(loader)}, "data", INDUCTION_HEADS)
        if batch_size is not None:
            given["batch_size"] = batch_size
        check_length(given["seq_len"], "data.seq_len")
        # the text-mix keys are not read: typed without the mix, whose checks concern text rows
        settings = loader_settings({**given, "recall_mix": 0.0, "recall_curriculum": None})
        targets = str(given["targets"])
        if targets not in TARGETS:
            raise ConfigError(f"data.targets={targets!r} must be one of {', '.join(TARGETS)} (all: every position, "
                              "as safari's labels; answer: the answer only).")
        eval_rows = int(given["eval_rows"])
        if eval_rows < 1:
            raise ConfigError(f"data.eval_rows={eval_rows} must be >= 1 sequence per evaluation split.")
        long_samples, long_from = given["long_probe_samples"], int(given["long_probe_from"])
        if long_samples is not None and int(long_samples) < 1:
            raise ConfigError(f"data.long_probe_samples={long_samples} must be >= 1 or null (probes.samples at every "
                              "length).")
        self.seq_len = check_length(settings.seq_len, "data.seq_len")
        self.batch_size, self.seed, self.max_steps = int(settings.batch_size), int(seed), max_steps
        self.val_windows = int(settings.val_windows or 64)
        self.val_batch_size = int(settings.val_batch_size or settings.batch_size)
        self.targets, self.eval_rows = targets, eval_rows
        self.recall_pairs = 1  # read by callbacks.retrieval_criterion (its probes ignore it)
        self.recall_ruler = None  # the same (the RULER kinds' defaults)
        self.tokenizer = InductionVocabulary(None if long_samples is None else int(long_samples), long_from)
        self.vocab_size: int = VOCABULARY.vocab_size
        self.eot_id: int = VOCABULARY.eot_id
        self.reserved: dict[str, list[int]] = dict(VOCABULARY.reserved)
        self.bytes_per_token: float | None = None  # no text: no bits per byte
        self.fingerprint: dict[str, Any] = {
            "source": INDUCTION_HEADS, "vocabulary": list(VOCABULARY.symbols), "vocab_size": self.vocab_size,
            "task_length": self.seq_len, "row_tokens": self.seq_len + 2, "targets": targets,
            "tokenizer": "not read: the task's own vocabulary",
            "long_probe_samples": self.tokenizer.long_samples, "long_probe_from": long_from,
        }
        self._rows: dict[str, np.ndarray] = {}

    # -- Lightning hooks ----------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Nothing to build: the data is drawn."""

    def setup(self, stage: str | None = None) -> None:
        for split, n in (("val", max(self.val_windows, self.eval_rows)), ("test", self.eval_rows)):
            if split not in self._rows:
                g = np.random.default_rng(np.random.SeedSequence([SPLIT_TAGS[split], self.seq_len]))
                self._rows[split] = induction_rows(g, n, self.seq_len)[0]  # (n, L + 2)

    def train_dataset(self, start_step: int | None = None, rank: int | None = None) -> InductionStream:
        """The batch stream; defaults follow the attached trainer (resume step, global rank)."""
        trainer = self.trainer
        if start_step is None:
            start_step = int(trainer.global_step) * int(trainer.accumulate_grad_batches) if trainer else 0
        if rank is None:
            rank = int(trainer.global_rank) if trainer else 0
        return InductionStream(self.seq_len, self.batch_size, self.seed, rank, start_step, self.max_steps,
                               self.targets)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset(), batch_size=None)  # each item is a whole Batch of (B, L + 2) rows

    def val_dataloader(self) -> DataLoader:
        rows = torch.from_numpy(self._split("val")[: self.val_windows])
        return DataLoader(FixedWindows(rows), batch_size=self.val_batch_size, shuffle=False)

    def state_dict(self) -> dict[str, Any]:
        return {"source": INDUCTION_HEADS, "seed": self.seed, "seq_len": self.seq_len, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        changed = [k for k, v in self.state_dict().items() if state.get(k) is not None and state[k] != v]
        if changed:
            import warnings

            warnings.warn(f"resuming with different data settings ({', '.join(changed)}): the batch stream will not "
                          "continue the checkpointed run exactly", stacklevel=2)

    # -- evaluation access (the harness's perplexity evaluation and the probes' filler) ------------------
    def _split(self, split: str) -> np.ndarray:
        if not self._rows:
            raise RuntimeError("InductionDataModule.setup() must run first (Lightning calls it)")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
        if split == "train":
            raise ConfigError("eval.split=train: the induction-heads training data is drawn fresh each step; "
                              "evaluate on val or test.")
        return self._rows[split]

    def eval_tokens(self, split: str = "val", n_tokens: int | None = None) -> torch.Tensor:
        """(N,) int64: the split's fixed sequences end to end (the first ``n_tokens``; all if None)."""
        tokens = self._split(split).reshape(-1)
        n = len(tokens) if n_tokens is None else int(n_tokens)
        if not 0 < n <= len(tokens):
            raise ConfigError(f"asked for {n} {split} tokens but the split holds {len(tokens)} "
                              f"({len(self._split(split))} sequences); raise data.eval_rows or lower eval.tokens.")
        return torch.from_numpy(np.ascontiguousarray(tokens[:n]))

    def n_tokens(self, split: str) -> int:
        return int(self._split(split).size)

    def document_starts(self, split: str = "val") -> np.ndarray:
        """(n + 1,) int64: each sequence is its own document."""
        rows = self._split(split)
        return np.arange(len(rows) + 1, dtype=np.int64) * rows.shape[1]


class InductionCurve(Callback):
    """The answer accuracy at task lengths ``lengths`` along training: every ``every_n_steps`` steps, ``samples``
    fixed instances per length (the probe kind's, from ``seed``: the same at every point and in every run) are
    scored and logged as ``train/induction_acc@<L>`` (CSV, W&B). A sequence is right when the argmax at its last
    input (the query) is the answer: the probes' exact match for a one-token answer, without their batching
    conventions (`pelab.evaluation.probes`), so a point may differ from the final evaluation in the last ulp.
    Only the query row goes through the last block and the head (``GPT.hidden(from_index=...)``)."""

    def __init__(self, lengths: list[int] | tuple[int, ...] = (512, 1024, 2048), samples: int = 256,
                 every_n_steps: int = 2500, seed: int = 4321, batch_tokens: int = 16384):
        if not lengths or samples < 1 or every_n_steps < 1 or batch_tokens < 1:
            raise ValueError(f"callbacks.induction_curve: lengths={list(lengths)} must be non-empty, samples={samples}, "
                             f"every_n_steps={every_n_steps} and batch_tokens={batch_tokens} >= 1")
        self.lengths = [check_length(n, "callbacks.induction_curve.lengths") for n in lengths]
        self.n, self.every, self.seed, self.batch_tokens = int(samples), int(every_n_steps), int(seed), int(batch_tokens)
        self.instances: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # L -> inputs (n, L + 1), answers (n,)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for n in self.lengths:
            samples = make_probe_samples(INDUCTION_HEADS, VOCABULARY, n, 0.5, self.n, self.seed)
            self.instances[n] = (torch.tensor([s.input_ids for s in samples]),
                                 torch.tensor([s.answer_ids[0] for s in samples]))

    @torch.no_grad()
    def predictions(self, model: torch.nn.Module, length: int) -> torch.Tensor:
        """(n,) the argmax token at the query of each instance of task length ``length``."""
        x = self.instances[length][0]
        T, device, was_training = x.shape[1], next(model.parameters()).device, model.training
        per_batch = max(1, self.batch_tokens // T)
        model.eval()
        try:
            preds = [model.lm_head(model.hidden(x[i : i + per_batch].to(device), from_index=T - 1)[:, -1])
                     .argmax(-1).cpu() for i in range(0, len(x), per_batch)]  # (b,) each: the query rows only
        finally:
            model.train(was_training)
        return torch.cat(preds)

    def accuracy(self, model: torch.nn.Module, length: int) -> float:
        return float((self.predictions(model, length) == self.instances[length][1]).float().mean())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if int(trainer.global_step) % self.every:
            return
        accs = {metric_key("train/induction_acc", n): self.accuracy(pl_module.model, n) for n in self.lengths}
        pl_module.log_dict(accs, rank_zero_only=True)
