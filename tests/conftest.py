"""Shared test fixtures: real Hydra composition, a session-wide token cache, W&B readback, the generated text
corpora of the data tests and the tokenizers of the recall tests.

Tests never leave WANDB_* variables set for other tests (the environment is restored after each test).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from pelab.data import LMDataModule
    from pelab.data.recall import RecallSample

# Tests run small tensors: one thread avoids OpenMP spin contention with subprocesses and helpers.
torch.set_num_threads(1)

# Re-exported for the test files that still import them from here (moving to `helpers`).
from helpers.runs import (  # noqa: F401
    CONF_DIR,
    FAST,
    ROOT,
    SWEEP_ARGS,
    compose,
    isolated_env,
    offline_runs,
    run_cli,
    summaries,
    wandb_records,
    wandb_summary,
)
from helpers.shared import build_once, shared_tmp


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One token cache for the whole session and all its workers, so each corpus/tokenizer is built once
    (concurrent builders wait on the cache's own lock)."""
    return Path(os.environ.get("PELAB_TEST_CACHE_DIR") or shared_tmp(tmp_path_factory, "pelab-cache"))


@pytest.fixture(autouse=True)
def _isolated_env(cache_dir, monkeypatch):
    """Each test gets the shared cache dir and a clean W&B environment (restored afterwards)."""
    monkeypatch.setenv("PELAB_CACHE_DIR", str(cache_dir))
    for key in list(os.environ):
        if key.startswith("WANDB_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    yield


@pytest.fixture(scope="session")
def sweep(tmp_path_factory, cache_dir) -> Path:
    """One real 2 x 2 Hydra multirun (SWEEP_ARGS) for every test that reads a sweep's summaries: the
    sweep, report and dashboard tests (~25 s on 2 busy cores, once per session, whichever xdist worker asks first)."""
    def build(root: Path) -> None:
        out = run_cli(["-m", *SWEEP_ARGS, f"hydra.sweep.dir={root / 'multirun'}"], cwd=root,
                      env={"PELAB_CACHE_DIR": str(cache_dir)})
        assert out.returncode == 0, out.stderr[-3000:]

    return build_once(tmp_path_factory, "sweep", build) / "multirun"


@pytest.fixture(scope="session")
def reference(tmp_path_factory, cache_dir) -> Path:
    """The uninterrupted RESUME run (helpers.resume) that the kill, signal and checkpoint tests compare against or
    read: trained once per session, in this process (bit-identical to the same command line in a subprocess)."""
    from helpers.resume import RESUME
    from pelab.tasks.train import train

    def build(out: Path) -> None:
        with isolated_env(cache_dir):
            summary = train(compose(RESUME, out / "run"))
        assert summary["status"] == "ok" and summary["global_step"] == 60

    return build_once(tmp_path_factory, "reference", build) / "run"


def rotate(pe, q, k, pos):
    """An encoding's rotation of q, k at positions ``pos`` (its per-forward state prepared first)."""
    return pe.rotate(q, k, pe.prepare(pos))


def embed(pe, x, pos):
    """What an encoding adds to token vectors x at positions ``pos``."""
    return pe.embed(x, pe.prepare(pos))


# ----------------------------------------------------------------------------- data: generated text corpora
# (the data tests: test_corpora, test_hf_corpus, test_tokenizer, test_cache, test_windows, test_mixer,
# test_datamodule)

_WORDS = "the of and to in is was for on that with as by at from an were are which this be or has"
_ODD = "naïve café 日本語 🙂 Ελληνικά def return self None True x1 y_2 (a, b) [0] {k: v} # -> == !="
WORDS = _WORDS.split(" ") + _ODD.split(" ")


def _doc(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(25, 60)):
        indent = rng.choice(["", "    ", "\t", "        "])
        lines.append(indent + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))))
    return "\n".join(lines) + rng.choice(["\n", "\r\n", "  \n", ""])


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """40 generated .txt documents (~100 KB) in 3 sub-folders, plus one non-matching file."""
    root = tmp_path_factory.mktemp("texts")
    rng = random.Random(0)
    for i in range(40):
        sub = root / f"part{i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"doc{i:03d}.txt").write_bytes(_doc(rng).encode("utf-8"))
    (root / "README.md").write_text("not a .txt file")
    return root


def _src(path: Path, **kw) -> dict:
    return {"source": "text_dir", "path": str(path), "glob": "**/*.txt", **kw}


BPE_SMALL = {"kind": "bpe", "vocab_size": 320, "min_frequency": 2}


def _dm(text_dir: Path, cache: Path, tokenizer=BPE_SMALL, **kw) -> LMDataModule:
    from pelab.data import LMDataModule

    # pure text unless a test asks for recall rows (32-token windows fit no kv / passkey row)
    kw = {"seq_len": 32, "batch_size": 4, "seed": 0, "val_windows": 8, "recall_mix": 0.0, **kw}
    dm = LMDataModule(source=_src(text_dir), tokenizer=tokenizer, cache_dir=str(cache), **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture
def hf_offline(monkeypatch, tmp_path):
    """No network: offline flags (env + already-imported constants), a private datasets cache."""
    import datasets
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")


def _words_dir(root: Path, n_files: int, n_bytes: int, seed: int = 0) -> Path:
    """`n_files` UTF-8 text files of ~`n_bytes` each (generated words, some non-ASCII)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        text = ""
        while len(text) < n_bytes:
            text += _doc(rng) + "\n"
        (root / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return root


def _e2e(folder: Path, cache: Path, out: Path, *extra: str):
    return compose([*FAST, "data=text_dir", f"data.path={folder}", f"paths.cache_dir={cache}", "logger=csv",
                    "trainer.max_steps=4", "trainer.val_check_interval=4", "evaluate_after_fit=false",
                    *extra], out)


# ----------------------------------------------------------------------------- recall: tokenizers and helpers
# (the test_recall_* files)

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.fixture(scope="module")
def byte_tok():
    from pelab.data.tokenizer import ByteTokenizer

    return ByteTokenizer()


@pytest.fixture(scope="module")
def bpe_tok():
    """A small real byte-level BPE whose merges cut hex strings and punctuation unevenly."""
    from pelab.data.recall import PASSKEY_FILLER
    from pelab.data.tokenizer import train_bpe

    r = random.Random(0)
    docs = [
        " ".join(f'{{"{r.randrange(4096):03x}": "{r.randrange(65536):04x}"}}' for _ in range(40))
        + f" {PASSKEY_FILLER} The pass key is {r.randrange(10**5)}. What is the pass key?"
        for _ in range(40)
    ]
    return train_bpe(docs, vocab_size=400)


def kv_pairs(tok, s: RecallSample) -> tuple[list[tuple[str, str]], str]:
    """The (key, value) pairs of the JSON context, in order, and the queried key."""
    text = tok.decode(s.input_ids)
    obj = text[text.index("{") : text.rindex("}") + 1]
    pairs = json.loads(obj, object_pairs_hook=list)  # keeps duplicates, if any
    query = re.search(r'\nKey: "([0-9a-f]+|<k\d+>)" Value: "$', text)
    assert query, text[-40:]
    return pairs, query.group(1)


FILLER = list(range(32, 127)) * 8  # printable bytes: never a reserved id


def _reserved_only(tok, ids):
    return [t for t in ids if t >= tok.reserved_key_ids.start]
