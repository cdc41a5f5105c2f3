"""Shared test fixtures: a session-wide token cache, a clean environment per test, the runs that tests only read
(built once per session across xdist workers), the generated text corpora of the data tests and the tokenizers
of the recall tests. The helper functions and constants live in tests/helpers/.

Tests never leave WANDB_* variables set for other tests (the environment is restored after each test).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from helpers import schedule
from helpers.runs import FAST, ONE_THREAD, SWEEP_ARGS, compose, isolated_env, run_cli
from helpers.shared import build_once, shared_tmp
from helpers.texts import random_doc

# Tests run small tensors: one thread avoids OpenMP spin contention with subprocesses and helpers.
torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: the order is of the tests that will run
def pytest_collection_modifyitems(config, items):
    """The slowest tests first, spread over the xdist workers (helpers.schedule). Every worker collects and orders
    the same way, as xdist requires (a worker's own --dist option reads "no": its count is in workerinput)."""
    items[:] = schedule.order(items, getattr(config, "workerinput", {}).get("workercount", 1))


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
def failing_sweep(tmp_path_factory, cache_dir) -> tuple[Path, int]:
    """One real multirun of 8 jobs, 7 of which fail in three ways: a setting refused before W&B starts
    (model.n_heads=3 does not divide d_model=32), a data error after it (data.seq_len=100000000), a NaN loss at step
    3; the one good job must still run. (The multirun's folder, its exit code): read by the failing-job tests of
    tests/test_train.py and tests/test_nonfinite.py, built once per session."""
    def build(root: Path) -> None:
        out = run_cli(["-m", *FAST, "evaluate_after_fit=false", "trainer.max_steps=8", "trainer.val_check_interval=8",
                       # the basic sweeper nests the swept keys in command-line order, the first outermost
                       "data.seq_len=32,100000000", "model.n_heads=3,2", "debug.inject_nan_at_step=null,3",
                       f"hydra.sweep.dir={root / 'multirun'}", "logger=wandb", "logger.wandb.mode=offline"],
                      cwd=root, env={"PELAB_CACHE_DIR": str(cache_dir), **ONE_THREAD})
        (root / "returncode").write_text(str(out.returncode))

    root = build_once(tmp_path_factory, "failing-sweep", build)
    return root / "multirun", int((root / "returncode").read_text())


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


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, cache_dir):
    """One short RoPE run with W&B offline, evaluated at 1x, 2x, 4x the training length: trained once per session
    (the first xdist worker that asks; the tests only read it: one that writes copies it first)."""
    def build(root):
        from pelab.tasks.train import train

        with isolated_env(cache_dir):
            cfg = compose([*FAST, "pe=rope", "logger=wandb", "logger.wandb.mode=offline", "trainer.max_steps=30",
                           "eval.lengths=[1,2,4]", "eval.tokens=512", "probes.lengths=[1,2]"], root / "rope-run")
            assert train(cfg)["status"] == "ok"

    from pelab.summary import SUMMARY_FILE, read_summary

    out = build_once(tmp_path_factory, "rope-run", build) / "rope-run"
    return out, read_summary(out / SUMMARY_FILE)


# ----------------------------------------------------------------------------- data: generated text corpora

@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """40 generated .txt documents (~100 KB) in 3 sub-folders, plus one non-matching file."""
    root = tmp_path_factory.mktemp("texts")
    rng = random.Random(0)
    for i in range(40):
        sub = root / f"part{i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"doc{i:03d}.txt").write_bytes(random_doc(rng).encode("utf-8"))
    (root / "README.md").write_text("not a .txt file")
    return root


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


# ----------------------------------------------------------------------------- recall: tokenizers

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
