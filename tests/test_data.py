"""Data pipeline: corpora splits, tokenizers, the memmap token cache, the DataModule.

Small corpora (a generated text folder, local JSON / parquet files) and tiny vocabularies keep
this fast; one slow test builds the real default cache (stdlib + BPE 4096).
"""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pelab.data import (
    CacheDirError,
    CacheRebuildWarning,
    CorpusError,
    CorpusUnavailable,
    DataConfigError,
    LMDataModule,
    TokenizerError,
    build_corpus,
    make_tokenizer,
    open_cache,
    split_of,
)
from pelab.data.cache import verify_entry
from pelab.data.corpora import SPLITS, StdlibCorpus
from pelab.data.hf_corpus import _wikitext_articles
from pelab.data.tokenizer import load_pretrained
from pelab.harness.build import build_datamodule

_WORDS = "the of and to in is was for on that with as by at from an were are which this be or has"
_ODD = "naïve café 日本語 🙂 Ελληνικά def return self None True x1 y_2 (a, b) [0] {k: v} # -> == !="
WORDS = _WORDS.split(" ") + _ODD.split(" ")

TRICKY = [
    "héllo wörld 日本語 🙂 Ελληνικά\n",
    "\ttabbed\tline  with  double  spaces   \n  trailing spaces   ",
    "windows\r\nline\r\nendings\r\n",
    "",
    " ",
    "\n\n\n",
    "e\u0301 (combining) vs \u00e9, NBSP:\u00a0, ZWJ family: 👨\u200d👩\u200d👧, NUL:\x00, BOM:\ufeff",
    "def f(x):\n    return x  # comment\n\n\nclass A:\n\tpass\n",
    "<|endoftext|> written as plain text",
]


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
    # pure text unless a test asks for recall rows (32-token windows fit no kv / passkey row)
    kw = {"seq_len": 32, "batch_size": 4, "seed": 0, "val_windows": 8, "recall_mix": 0.0, **kw}
    dm = LMDataModule(source=_src(text_dir), tokenizer=tokenizer, cache_dir=str(cache), **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


# ----------------------------------------------------------------------------- splits


def test_stdlib_splits_are_deterministic_and_disjoint():
    a, b = StdlibCorpus(), StdlibCorpus()
    files = {s: a.files(s) for s in SPLITS}
    assert files == {s: b.files(s) for s in SPLITS}
    for s in SPLITS:
        assert files[s] == sorted(files[s]), "documents come in path order"
        assert not any("site-packages" in f or "__pycache__" in f for f in files[s])
        assert all(f.endswith(".py") for f in files[s])
    sets = [set(files[s]) for s in SPLITS]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2]), "a document in two splits"
    n = sum(map(len, sets))
    assert n == len(a.rel) > 500
    assert 0.005 < len(files["val"]) / n < 0.05 and 0.005 < len(files["test"]) / n < 0.05
    assert a.fingerprint() == b.fingerprint() and a.fingerprint()["python"].count(".") == 2


def test_split_of_does_not_depend_on_other_files(tmp_path):
    for i in range(300):
        (tmp_path / f"f{i:03d}.txt").write_text(f"doc {i}")
    before = build_corpus(_src(tmp_path))
    for i in range(300, 400):
        (tmp_path / f"f{i:03d}.txt").write_text(f"doc {i}")
    after = build_corpus(_src(tmp_path))
    for s in SPLITS:
        old = set(before.files(s))
        assert old <= set(after.files(s)), "adding files moved an existing document to another split"
    assert split_of("a/b.py") == split_of("a/b.py") in SPLITS


def test_text_dir_reads_documents_in_order(text_dir):
    c = build_corpus(_src(text_dir))
    assert len(c.rel) == 40 and "README.md" not in c.rel
    for s in SPLITS:
        docs = list(c.documents(s))
        assert len(docs) == len(c.files(s)) >= 1
        assert docs[0] == (text_dir / c.files(s)[0]).read_bytes().decode("utf-8")


def test_max_bytes_caps_each_split():
    c = build_corpus({"source": "stdlib", "max_bytes": 200_000})
    train = list(c.documents("train"))
    assert 1 <= len(train) < len(c.files("train"))
    assert sum(len(d.encode()) for d in train) <= 200_000 or len(train) == 1
    assert c.fingerprint() != build_corpus("stdlib").fingerprint(), "the cap must change the cache key"


def test_bpe_training_sample_is_spread_over_the_split():
    c = build_corpus("stdlib")
    files = c.files("train")
    sample = list(c.sample_documents("train", 3_000_000))
    n_bytes = sum(len(d.encode()) for d in sample)
    assert 1_500_000 < n_bytes < 4_500_000

    def read(rel: str) -> str:
        return (c.root / rel).read_bytes().decode("utf-8", "replace")

    assert sample[0] == read(files[0]) and len(sample) < len(files) / 3
    tail = {read(r) for r in files[int(0.9 * len(files)) :]}
    assert any(d in tail for d in sample), "the sample only covers the head of the split"


# ----------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_tokenizer_round_trip(kind, text_dir):
    corpus = build_corpus(_src(text_dir))
    tok = make_tokenizer(BPE_SMALL if kind == "bpe" else "byte", corpus.documents("train"))
    assert tok.vocab_size == (320 if kind == "bpe" else 257) + 64 + 64  # + the default reserved ids
    assert 0 <= tok.eot_id < tok.vocab_size
    texts = TRICKY + list(corpus.documents("val"))
    for text in texts:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text, repr(text)
    batch = tok.encode_batch(texts)
    assert [list(map(int, b)) for b in batch] == [tok.encode(t) for t in texts]
    if kind == "bpe":  # merges were learned: fewer tokens than bytes on in-domain text
        val = "".join(corpus.documents("val"))
        assert len(tok.encode(val)) < 0.7 * len(val.encode())
        assert tok.eot_id not in tok.encode(TRICKY[-1]), "the EOT string in text is not the EOT token"


def test_saved_bpe_tokenizer_reloads_identically(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path)
    from pelab.data.tokenizer import load_tokenizer

    again = load_tokenizer(dm.cache.path / "tokenizer.json", "bpe")
    for text in TRICKY:
        assert again.encode(text) == dm.tokenizer.encode(text)
    assert again.eot_id == dm.eot_id and again.vocab_size == dm.vocab_size == 320 + 128


# ----------------------------------------------------------------------------- reserved ids


def _local_pretrained(text_dir: Path, folder: Path) -> dict:
    """A 'pretrained' tokenizer without the network: a small BPE saved as <folder>/tokenizer.json (the
    hub's layout) and loaded through tokenizer=pretrained, tokenizer.name=<folder>."""
    from pelab.data.tokenizer import train_bpe

    folder.mkdir(parents=True, exist_ok=True)
    train_bpe(build_corpus(_src(text_dir)).documents("train"), vocab_size=300).tk.save(str(folder / "tokenizer.json"))
    return {"kind": "pretrained", "name": str(folder), "reserved_keys": 5, "reserved_values": 7}


@pytest.mark.parametrize("kind", ["byte", "bpe", "pretrained"])
def test_reserved_ids_come_after_the_vocabulary_and_never_encode_text(kind, text_dir, tmp_path):
    tok_cfg = {"byte": {"kind": "byte", "reserved_keys": 5, "reserved_values": 7},
               "bpe": {**BPE_SMALL, "reserved_keys": 5, "reserved_values": 7},
               "pretrained": _local_pretrained(text_dir, tmp_path / "hub")}[kind]
    dm = _dm(text_dir, tmp_path / "cache", tokenizer=tok_cfg)
    tok = dm.tokenizer
    v0 = tok.base_vocab_size
    assert (tok.reserved_key_ids, tok.reserved_value_ids) == (range(v0, v0 + 5), range(v0 + 5, v0 + 12))
    assert tok.vocab_size == dm.vocab_size == v0 + 12
    # recorded with the cache (meta.json, fingerprint -> summary.json data.fingerprint.reserved)
    reserved = {"keys": [v0, v0 + 5], "values": [v0 + 5, v0 + 12]}
    assert dm.reserved == dm.fingerprint["reserved"] == json.loads((dm.cache.path / "meta.json").read_text())["reserved"]
    assert dm.reserved == reserved
    assert dm.fingerprint["tokenizer"]["reserved_keys"] == 5
    # no text token is a key or a value: every split, and text that spells the decoded form
    for split in SPLITS:
        assert int(np.max(dm.cache.tokens(split))) < v0
    for text in [*TRICKY, "<k0> <v6> <|pelab_k0|>"]:
        assert max(tok.encode(text), default=0) < v0
    # decoded as <kN> / <vN> between text
    ids = tok.encode("key ") + [v0 + 2] + tok.encode(" value ") + [v0 + 5 + 6]
    assert tok.decode(ids) == "key <k2> value <v6>"
    # a different reserved count is a different cache entry, with its own meta
    other = _dm(text_dir, tmp_path / "cache", tokenizer={**tok_cfg, "reserved_keys": 6})
    assert other.cache.path != dm.cache.path and other.vocab_size == dm.vocab_size + 1
    assert other.reserved == {"keys": [v0, v0 + 6], "values": [v0 + 6, v0 + 13]}


def test_local_pretrained_tokenizer_is_keyed_on_its_content(text_dir, tmp_path):
    from pelab.data.tokenizer import tokenizer_fingerprint

    cfg = _local_pretrained(text_dir, tmp_path / "hub")
    before = tokenizer_fingerprint(cfg)
    assert before["sha256"]
    (tmp_path / "hub" / "tokenizer.json").write_text(
        (tmp_path / "hub" / "tokenizer.json").read_text().replace('"<|endoftext|>"', '"<|endoftext|>"', 1) + " ")
    assert tokenizer_fingerprint(cfg)["sha256"] != before["sha256"]


# ----------------------------------------------------------------------------- cache


def test_cache_contents_match_the_corpus(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, tokenizer="byte")
    corpus = build_corpus(_src(text_dir))
    for s in SPLITS:
        docs = list(corpus.documents(s))
        toks = dm.cache.tokens(s)
        assert toks.dtype == np.uint16
        offsets = dm.cache.offsets(s)
        assert len(offsets) == len(docs) + 1 and offsets[-1] == len(toks)
        for d, (a, b) in zip(docs, itertools.pairwise(offsets)):
            assert toks[b - 1] == dm.eot_id, "every document ends with EOT"
            assert dm.tokenizer.decode(toks[a : b - 1].tolist()) == d
        n_bytes = sum(len(d.encode()) for d in docs)
        assert dm.cache.meta["splits"][s]["n_bytes"] == n_bytes
    assert dm.bytes_per_token == pytest.approx(
        dm.cache.meta["splits"]["val"]["n_bytes"] / dm.cache.n_tokens("val")
    )
    fp = dm.fingerprint
    assert fp["corpus"]["source"] == "text_dir" and fp["tokenizer"]["kind"] == "byte"
    assert (
        fp["splits"]["train"]["n_docs"] + fp["splits"]["val"]["n_docs"] + fp["splits"]["test"]["n_docs"] == 40
    )


def test_cache_reuse_does_no_work(text_dir, tmp_path):
    corpus = build_corpus(_src(text_dir))
    first = open_cache(corpus, BPE_SMALL, tmp_path)
    assert first.built
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}
    t0 = time.perf_counter()
    second = open_cache(build_corpus(_src(text_dir)), BPE_SMALL, tmp_path)
    assert time.perf_counter() - t0 < 1.0
    assert not second.built and second.path == first.path
    assert {p.name: p.stat().st_mtime_ns for p in second.path.iterdir()} == mtimes, "files were rewritten"
    # Different settings -> a different entry; same settings via the DataModule -> the same one.
    other = open_cache(corpus, {**BPE_SMALL, "vocab_size": 300}, tmp_path)
    assert other.path != first.path and other.built
    assert _dm(text_dir, tmp_path).cache.built is False
    assert not [p for p in (tmp_path / "tokens").iterdir() if p.name.startswith((".tmp", ".old"))]


def test_env_var_sets_the_default_cache_dir(text_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PELAB_CACHE_DIR", str(tmp_path / "from-env"))
    cache = open_cache(build_corpus(_src(text_dir)), "byte", None)
    assert cache.path.is_relative_to(tmp_path / "from-env")


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "meta"])
def test_corrupt_cache_is_detected_and_rebuilt(damage, text_dir, tmp_path):
    corpus = build_corpus(_src(text_dir))
    good = open_cache(corpus, "byte", tmp_path)
    expected = np.array(good.tokens("train"))
    path = good.path / "train.bin"
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif damage == "overwrite":  # same size, different bytes at the head
        with open(path, "r+b") as f:
            f.write(b"\xff\xff" * 100)
    else:
        (good.path / "meta.json").write_text("{not json")
    assert verify_entry(good.path) is not None
    with pytest.warns(CacheRebuildWarning, match="rebuilding"):
        again = open_cache(corpus, "byte", tmp_path)
    assert again.built and verify_entry(again.path) is None
    np.testing.assert_array_equal(np.array(again.tokens("train")), expected)


def _open_in_child(src: dict, cache: str, queue) -> None:
    queue.put(open_cache(build_corpus(src), BPE_SMALL, cache).built)


def test_concurrent_builders_build_once(text_dir, tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_open_in_child, args=(_src(text_dir), str(tmp_path), queue)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert sorted(queue.get(timeout=5) for _ in procs) == [False, False, True], "exactly one process builds"
    assert len([p for p in (tmp_path / "tokens").iterdir() if p.is_dir()]) == 1


def test_failed_build_leaves_no_partial_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"{i}.txt").write_text(f"document {i} " * 50)
    cache = tmp_path / "cache"
    good = open_cache(build_corpus(_src(src)), "byte", cache)
    before = {p: p.read_bytes() for p in good.path.iterdir()}
    (src / "new.txt").write_text("a new file changes the key")
    corpus = build_corpus(_src(src))
    (src / "3.txt").unlink()  # vanishes mid-build: reading it fails
    with pytest.raises(FileNotFoundError):
        open_cache(corpus, "byte", cache)
    entries = sorted(p.name for p in (cache / "tokens").iterdir() if not p.name.endswith(".lock"))
    assert entries == [good.path.name], "a failed build left files behind"
    assert {p: p.read_bytes() for p in good.path.iterdir()} == before, "a failed build touched a good entry"


# ----------------------------------------------------------------------------- windows


def test_windows_deterministic_in_seed_step_rank(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, batch_size=4)
    a, b = dm.train_dataset(rank=0), dm.train_dataset(rank=0)
    x = a.batch(7)
    assert x.shape == (4, 33) and x.dtype == torch.int64
    assert torch.equal(x, b.batch(7))
    assert not torch.equal(x, a.batch(8)), "steps must differ"
    assert not torch.equal(x, dm.train_dataset(rank=1).batch(7)), "ranks must differ"
    other_seed = _dm(text_dir, tmp_path, batch_size=4, seed=1)
    assert not torch.equal(x, other_seed.train_dataset(rank=0).batch(7)), "seeds must differ"
    # Every row is a real contiguous span of the train stream.
    spans = np.lib.stride_tricks.sliding_window_view(np.array(dm.cache.tokens("train")), 33)  # (N, 33)
    for row in x.numpy():
        assert (spans == row).all(axis=1).any()


def test_stream_resumes_at_any_step_and_with_workers(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, max_steps=12)
    full = list(dm.train_dataloader())
    assert len(full) == 12
    resumed = list(torch.utils.data.DataLoader(dm.train_dataset(start_step=5), batch_size=None))
    assert all(torch.equal(u, v) for u, v in zip(full[5:], resumed, strict=True))
    ds = dm.train_dataset(start_step=3)
    with_workers = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert all(torch.equal(u, v) for u, v in zip(full[3:], with_workers, strict=True)), (
        "workers reorder steps"
    )


class _Recorder:
    """A tiny LightningModule that records the batches it trains on."""

    @staticmethod
    def make(vocab_size: int):
        import lightning as L

        class Recorder(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, 4)
                self.seen: list[torch.Tensor] = []

            def training_step(self, batch, batch_idx):
                self.seen.append(batch.clone())
                return self.emb(batch).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Recorder()


def _fit(text_dir, cache, max_steps, accumulate=1, ckpt_in=None, ckpt_out=None):
    import lightning as L

    dm = LMDataModule(
        source=_src(text_dir), tokenizer="byte", seq_len=16, batch_size=2, seed=3, cache_dir=str(cache),
        recall_mix=0.0,
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate,
    )
    model = _Recorder.make(257)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_in)
    if ckpt_out:
        trainer.save_checkpoint(ckpt_out)
    return model.seen


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_resume_continues_the_exact_batch_stream(accumulate, text_dir, tmp_path):
    full = _fit(text_dir, tmp_path, max_steps=6, accumulate=accumulate)
    assert len(full) == 6 * accumulate
    first = _fit(text_dir, tmp_path, max_steps=3, accumulate=accumulate, ckpt_out=tmp_path / "k3.ckpt")
    rest = _fit(text_dir, tmp_path, max_steps=6, accumulate=accumulate, ckpt_in=str(tmp_path / "k3.ckpt"))
    assert len(first) == 3 * accumulate and len(rest) == 3 * accumulate
    assert all(torch.equal(u, v) for u, v in zip(full, first + rest, strict=True))


def test_recall_mix_hook_is_deterministic(text_dir, tmp_path):
    seen = []

    def mixer(n, length, rng, step, text):  # marks rows with a recognisable pattern, drawn from the batch rng
        seen.append((step, text.shape))
        return np.full((n, length), 7) + rng.integers(0, 2, size=(n, 1))

    dm = _dm(text_dir, tmp_path, batch_size=8, recall_mix=0.25, mixer=mixer)
    ds = dm.train_dataset()
    for step in range(5):
        x = ds.batch(step)
        mixed = [bool((row == row[0]).all() and row[0] in (7, 8)) for row in x]
        assert mixed == [True, True] + [False] * 6
        assert torch.equal(x, dm.train_dataset().batch(step))
    assert seen[::2] == [(step, (2, 33)) for step in range(5)]  # the step and the text rows it replaces
    with pytest.raises(DataConfigError, match="data.recall_mix"):
        LMDataModule(source=_src(text_dir), tokenizer="byte", seq_len=8, batch_size=2, recall_mix=1.5)


def test_validation_windows_and_eval_tokens(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, seq_len=16, val_windows=5, val_batch_size=2)
    val = torch.cat(list(dm.val_dataloader()))
    assert val.shape == (5, 17)
    assert torch.equal(val, torch.cat(list(dm.val_dataloader()))), "validation windows are fixed"
    stream = dm.eval_tokens("val")
    assert len(stream) == dm.cache.n_tokens("val")
    starts = [
        next(s for s in range(0, len(stream) - 16, 16) if torch.equal(stream[s : s + 17], w)) for w in val
    ]
    assert starts == sorted(starts) and len(set(starts)) == 5, "windows are distinct grid positions"
    assert all(b - a >= 16 for a, b in itertools.pairwise(starts)), "targets do not overlap"
    assert torch.equal(dm.eval_tokens("test", 100), dm.eval_tokens("test")[:100])
    assert dm.eval_tokens("val", 50).dtype == torch.int64
    with pytest.raises(DataConfigError, match="the split has"):
        dm.eval_tokens("val", len(stream) + 1)
    assert next(iter(dm.test_dataloader())).shape == (2, 17)


def test_recall_mix_default_mixer_uses_recall_sequences(text_dir, tmp_path):
    dm = _dm(text_dir, tmp_path, tokenizer="byte", seq_len=96, batch_size=4, recall_mix=0.5)
    x = dm.train_dataset().batch(3)
    texts = [dm.tokenizer.decode(row.tolist()) for row in x]
    assert all("Key:" in t or "pass key" in t for t in texts[:2]), texts[:2]
    assert not any("Key:" in t or "pass key" in t for t in texts[2:])
    assert torch.equal(x, dm.train_dataset().batch(3))


def test_from_hydra_config(text_dir, tmp_path):
    from conftest import compose

    cfg = compose(
        [
            "data=text_dir",
            f"data.path={text_dir}",
            "data.seq_len=24",
            "data.recall_mix=0.0",  # 24-token windows are too short for a recall sequence
            "data.batch_size=3",
            "tokenizer=bpe",
            "tokenizer.vocab_size=300",
            f"paths.cache_dir={tmp_path}",
            "seed=5",
        ]
    )
    dm = build_datamodule(cfg, cfg.data.batch_size)
    dm.setup()
    assert dm.train_dataset().batch(0).shape == (3, 25) and dm.seed == 5
    assert dm.vocab_size == 300 + 128 and dm.cache.path.is_relative_to(tmp_path)
    assert dm.fingerprint["corpus"]["glob"] == "**/*.txt"


# ----------------------------------------------------------------------------- Hugging Face


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


def _rows(n: int, rng: random.Random) -> list[dict]:
    return [{"id": i, "text": _doc(rng)} for i in range(n)]


def test_hf_json_with_only_a_train_split(hf_offline, tmp_path):
    rows = _rows(60, random.Random(1))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    src = {
        "source": "hf",
        "name": "json",
        "data_files": str(path),
        "text_field": "text",
        "val_fraction": 0.1,
        "test_fraction": 0.1,
    }
    corpus = build_corpus(src)
    docs = {s: list(corpus.documents(s)) for s in SPLITS}
    assert sorted(itertools.chain(*docs.values())) == sorted(r["text"] for r in rows), (
        "every row in exactly one split"
    )
    assert all(docs[s] for s in SPLITS)
    assert docs == {s: list(build_corpus(src).documents(s)) for s in SPLITS}, "derived splits are stable"
    dm = LMDataModule(source=src, tokenizer="byte", seq_len=32, batch_size=2, cache_dir=str(tmp_path / "c"))
    dm.setup()
    assert dm.train_dataset().batch(0).shape == (2, 33)
    assert dm.fingerprint["corpus"]["data_files"][1] == path.stat().st_size


def test_hf_parquet_with_native_splits(hf_offline, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(2)
    files = {}
    for split, n in [("train", 30), ("validation", 5), ("test", 4)]:
        files[split] = str(tmp_path / f"{split}.parquet")
        pq.write_table(
            pa.Table.from_pylist([{"body": r["text"], "n": r["id"]} for r in _rows(n, rng)]), files[split]
        )
    src = {"source": "hf", "name": "parquet", "data_files": files, "text_field": "body"}
    corpus = build_corpus(src)
    assert [len(list(corpus.documents(s))) for s in SPLITS] == [30, 5, 4]
    assert next(iter(corpus.documents("val"))) == pq.read_table(files["validation"])["body"][0].as_py()
    dm = LMDataModule(
        source=src, tokenizer=BPE_SMALL, seq_len=32, batch_size=2, cache_dir=str(tmp_path / "c")
    )
    dm.setup()
    assert dm.vocab_size == 320 + 128 and dm.fingerprint["splits"]["val"]["n_docs"] == 5
    with pytest.raises(CorpusError, match=r"data.text_field='text'.*\['body', 'n'\]"):
        build_corpus({**src, "text_field": "text"}).documents("train")


def test_hf_wikitext_lines_become_articles(hf_offline, tmp_path):
    lines = [
        "",
        " = Alpha = \n",
        "",
        " Alpha is a letter . \n",
        " = = History = = \n",
        " Old . \n",
        "",
        " = Beta = \n",
        " Beta follows alpha . \n",
        "",
    ]
    assert list(_wikitext_articles(iter(lines))) == [
        " = Alpha = \n\n Alpha is a letter . \n = = History = = \n Old . ",
        " = Beta = \n Beta follows alpha . ",
    ]
    path = tmp_path / "wiki.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in lines * 3))
    corpus = build_corpus(
        {
            "source": "hf",
            "name": "json",
            "data_files": str(path),
            "doc_split": "wikitext",
            "val_fraction": 0.3,
            "test_fraction": 0.3,
        }
    )
    assert sum(len(list(corpus.documents(s))) for s in SPLITS) == 6


def test_hf_unavailable_dataset_names_the_offline_alternatives(hf_offline, tmp_path):
    corpus = build_corpus({"source": "hf", "name": "pelab-test/no-such-dataset", "text_field": "text"})
    with pytest.raises(CorpusUnavailable, match=r"data=stdlib.*data=text_dir"):
        list(corpus.documents("train"))


def test_pretrained_tokenizer_offline_error(hf_offline):
    with pytest.raises(TokenizerError, match=r"tokenizer.name='gpt2'.*tokenizer=bpe"):
        load_pretrained("gpt2")
    with pytest.raises(TokenizerError, match="tokenizer.name"):
        load_pretrained("???")


# ----------------------------------------------------------------------------- bad input


def test_bad_folders(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match=r"data.glob='\*\*/\*.txt'.*data.path"):
        build_corpus(_src(empty))
    (empty / "a.md").write_text("markdown only")
    with pytest.raises(CorpusError, match="data.glob"):
        build_corpus(_src(empty))
    with pytest.raises(CorpusError, match="data.path"):
        build_corpus(_src(tmp_path / "missing"))
    with pytest.raises(CorpusError, match="data.path"):
        build_corpus({"source": "text_dir", "path": "???"})
    with pytest.raises(CorpusError, match="at least 3"):
        build_corpus({**_src(empty), "glob": "*.md"})
    with pytest.raises(CorpusError, match="data.source='nope'"):
        build_corpus({"source": "nope"})
    with pytest.raises(TokenizerError, match="tokenizer.kind='nope'"):
        make_tokenizer({"kind": "nope"})


@pytest.mark.parametrize("seq_len", [0, -5])
def test_seq_len_must_be_positive(seq_len, text_dir, tmp_path):
    with pytest.raises(DataConfigError, match="data.seq_len"):
        LMDataModule(
            source=_src(text_dir), tokenizer="byte", seq_len=seq_len, batch_size=2, cache_dir=str(tmp_path)
        )


def test_seq_len_longer_than_val_split(text_dir, tmp_path):
    with pytest.raises(DataConfigError, match=r"data.seq_len=100000 .*split has only"):
        _dm(text_dir, tmp_path, tokenizer="byte", seq_len=100_000)


def test_unwritable_cache_dir(text_dir, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("a regular file, so nothing can be created below it (even as root)")
    with pytest.raises(CacheDirError, match="paths.cache_dir"):
        _dm(text_dir, afile / "sub", tokenizer="byte")
    assert afile.read_text().startswith("a regular file")


# ----------------------------------------------------------------------------- the real default


@pytest.mark.slow
def test_default_stdlib_cache_speed(tmp_path):
    t0 = time.perf_counter()
    dm = LMDataModule(
        source="stdlib",
        tokenizer={"kind": "bpe", "vocab_size": 4096},
        seq_len=256,
        batch_size=16,
        cache_dir=str(tmp_path),
    )
    dm.prepare_data()
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = LMDataModule(
        source="stdlib",
        tokenizer={"kind": "bpe", "vocab_size": 4096},
        seq_len=256,
        batch_size=16,
        cache_dir=str(tmp_path),
    )
    again.setup()
    load_s = time.perf_counter() - t0
    assert not again.cache.built
    it = iter(again.train_dataloader())
    t0 = time.perf_counter()
    n = sum(1 for _ in zip(range(500), it))
    batches_per_s = n / (time.perf_counter() - t0)
    stats = {s: again.fingerprint["splits"][s] for s in SPLITS}
    print(f"\nbuild {build_s:.1f}s load {load_s:.3f}s batches/s {batches_per_s:.0f} {stats}")
    assert build_s < 60, f"default cache build took {build_s:.1f}s"
    assert load_s < 1.0, f"loading the built cache took {load_s:.2f}s"
    assert batches_per_s > 200
    assert again.vocab_size == 4096 + 128 and 2.5 < again.bytes_per_token < 5


# ============================================================================= issue 17: checksums, honest text,
# fast hub failures (cache.verify_entry, corpora.TextDirCorpus, tokenizer.hub_tokenizer_file)


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
    from conftest import FAST, compose

    return compose([*FAST, "data=text_dir", f"data.path={folder}", f"paths.cache_dir={cache}", "logger=csv",
                    "trainer.max_steps=4", "trainer.val_check_interval=4", "evaluate_after_fit=false",
                    *extra], out)


def test_corruption_in_the_middle_of_the_cache_is_detected_rebuilt_and_the_run_trains(tmp_path):
    from pelab.harness.build import build_datamodule
    from pelab.tasks.train import train

    folder = _words_dir(tmp_path / "texts", 12, 40_000)
    cfg = _e2e(folder, tmp_path / "cache", tmp_path / "run")
    dm = build_datamodule(cfg, 8)
    dm.prepare_data()
    dm.setup()
    entry, size = dm.cache.path, (dm.cache.path / "train.bin").stat().st_size
    assert (entry / "verified.json").is_file() and verify_entry(entry) is None
    # The damage on an 18 MB train.bin (bytes 200,000..8,700,000 set to 0xFF), scaled to this file:
    # same size, head and tail intact; 0xFFFF is no byte-tokenizer id (the old cache let it reach the model).
    lo, hi = size * 200_000 // 18_118_066 & ~1, size * 8_700_000 // 18_118_066 & ~1
    with open(entry / "train.bin", "r+b") as f:
        f.seek(lo)
        f.write(b"\xff" * (hi - lo))
    assert (entry / "train.bin").stat().st_size == size
    with pytest.warns(CacheRebuildWarning, match=r"train\.bin does not match its checksum.*rebuilding"):
        summary = train(cfg)
    assert summary["status"] == "ok", summary.get("error")
    vocab = summary["data"]["vocab_size"]  # 257 byte ids + the reserved recall ids
    assert summary["metrics"]["val/ppl"] < vocab  # trained on real byte ids (guessing uniformly: the vocab)
    tokens = np.fromfile(entry / "train.bin", dtype=np.uint16)
    assert tokens.max() < 257 and len(tokens) * 2 == size


def test_checksums_cover_every_byte_and_verified_files_are_not_rehashed(tmp_path):
    folder = _words_dir(tmp_path / "texts", 6, 200_000)
    corpus = build_corpus(_src(folder))
    cache = open_cache(corpus, "byte", tmp_path)
    entry = cache.path
    meta = json.loads((entry / "meta.json").read_text())
    assert set(meta["files"]) == {"tokenizer.json", *(f"{s}{x}" for s in SPLITS for x in (".bin", ".idx.npy"))}
    stamps = json.loads((entry / "verified.json").read_text())
    assert set(stamps) == set(meta["files"]), "the build records every file as verified"
    # One byte at a quarter of the file: outside the old head / middle / tail samples.
    path = entry / "train.bin"
    assert path.stat().st_size > 4 * (1 << 16) * 2
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 4)
        old = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([old[0] ^ 1]))
    assert verify_entry(entry) == "train.bin does not match its checksum (corrupted)"
    with pytest.warns(CacheRebuildWarning, match=rf"{entry}: train\.bin does not match"):
        again = open_cache(corpus, "byte", tmp_path)
    assert again.built and verify_entry(entry) is None
    # A verified, unchanged file is not read again: its stamp (size, mtime, inode, sha256) stands for it.
    stamps = json.loads((entry / "verified.json").read_text())
    stamps["train.bin"][-1] = "0" * 64  # a stamp for another checksum does not count
    (entry / "verified.json").write_text(json.dumps(stamps))
    assert verify_entry(entry) is None
    assert json.loads((entry / "verified.json").read_text())["train.bin"][-1] == meta["files"]["train.bin"]["sha256"]


def _latin1_dir(root: Path) -> tuple[Path, list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    texts = [f"Café n°{i}: naïve façade, Ångström, señor, déjà vu, 50 µm, ±3 °C. " * 40 for i in range(5)]
    for i, t in enumerate(texts):
        (root / f"latin{i}.txt").write_bytes(t.encode("latin-1"))
    return root, texts


def test_latin1_files_decode_with_data_encoding_and_bits_per_byte_count_the_files_bytes(tmp_path):
    import warnings as _w

    from pelab.data.corpora import CorpusWarning

    folder, texts = _latin1_dir(tmp_path / "latin")
    with _w.catch_warnings():
        _w.simplefilter("error")  # correct decoding: nothing to report
        corpus = build_corpus(_src(folder, encoding="latin-1"))
        docs = {s: list(corpus.documents(s)) for s in SPLITS}
    assert sorted(itertools.chain(*docs.values())) == sorted(texts), "decoded exactly"
    cache = open_cache(corpus, "byte", tmp_path / "cache")
    for s in SPLITS:
        on_disk = sum((folder / r).stat().st_size for r in corpus.files(s))
        assert cache.meta["splits"][s]["n_bytes"] == on_disk  # not the UTF-8 re-encoding (2 bytes per é)
        assert cache.n_tokens(s) > on_disk  # the byte tokenizer sees UTF-8: more tokens than file bytes
    # Read as UTF-8 (the default) the same files are kept, with a warning counting the replaced bytes.
    wrong = build_corpus(_src(folder))
    with pytest.warns(CorpusWarning, match=r"data.encoding='utf-8'.*kept 5 files with \d+ undecodable .*latin0\.txt"):
        wrong.files("train")
    utf8 = open_cache(wrong, "byte", tmp_path / "cache")
    assert utf8.path != cache.path, "the encoding is part of the cache key"
    assert utf8.meta["splits"]["train"]["n_bytes"] == cache.meta["splits"]["train"]["n_bytes"], (
        "bits per byte count the file's bytes, not 3 per U+FFFD"
    )
    with pytest.raises(CorpusError, match=r"data.encoding='klingon'"):
        build_corpus(_src(folder, encoding="klingon"))
    with pytest.raises(CorpusError, match=r"data.encoding='rot13'"):
        build_corpus(_src(folder, encoding="rot13"))


def test_mixed_folder_skips_binaries_keeps_the_text_splits_and_trains(tmp_path):
    from pelab.data.corpora import CorpusWarning
    from pelab.tasks.train import train

    text = _words_dir(tmp_path / "mixed", 20, 3_000)
    before = build_corpus(_src(text, glob="*"))
    split_of_text = {s: before.files(s) for s in SPLITS}
    rng = random.Random(3)
    for i in range(4):
        (text / f"blob{i}.bin").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    (text / "zz-latin.txt").write_bytes("déjà vu, señor".encode("latin-1") * 50)
    corpus = build_corpus(_src(text, glob="*"))
    with pytest.warns(CorpusWarning) as rec:
        files = {s: corpus.files(s) for s in SPLITS}
    (msg,) = [str(w.message) for w in rec]
    assert "skipped 4 of 25 files as binary" in msg and "blob0.bin, blob1.bin, blob2.bin, ..." in msg
    assert "kept 1 files with 150 undecodable byte sequences" in msg and "zz-latin.txt (150)" in msg  # é, à, ñ x 50
    assert "\n" not in msg
    assert not any(f.startswith("blob") for f in itertools.chain(*files.values()))
    for s in SPLITS:  # the binaries take no text file's place
        assert [f for f in files[s] if f != "zz-latin.txt"] == split_of_text[s]
    with pytest.warns(CorpusWarning, match="skipped 4 of 25"):
        summary = train(_e2e(text, tmp_path / "cache", tmp_path / "run", "data.glob=*"))
    assert summary["status"] == "ok", summary.get("error")
    assert summary["data"]["fingerprint"]["corpus"]["n_files"] == 25


def test_folder_of_random_binary_files_is_one_error_before_tokenizing(tmp_path):
    from pelab.errors import is_user_error
    from pelab.tasks.train import train

    folder = tmp_path / "binary"
    folder.mkdir()
    rng = random.Random(4)
    for i in range(6):  # random bytes: NULs, or (small files) mostly undecodable
        (folder / f"f{i}.dat").write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([64, 5000]))))
    out = tmp_path / "run"
    with pytest.raises(CorpusError) as err:
        train(_e2e(folder, tmp_path / "cache", out, "data.glob=*"))
    message = str(err.value)
    assert is_user_error(err.value) and "\n" not in message
    for key in (f"data.path={folder}", "data.glob='*'", "data.encoding='utf-8'", "all 6 files are binary"):
        assert key in message
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "model" not in summary
    assert [p.suffix for p in (tmp_path / "cache" / "tokens").iterdir()] == [".lock"], "no cache entry left behind"


def _hub_cache_with(root: Path, repo: str, tokenizer_json: Path) -> Path:
    """The Hugging Face hub cache layout (models--org--name/refs/main -> snapshots/<commit>/tokenizer.json)."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return root


def test_pretrained_tokenizer_from_the_local_hub_cache_offline(hf_offline, text_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    bpe = make_tokenizer(BPE_SMALL, build_corpus(_src(text_dir)).documents("train"))
    bpe.save(tmp_path / "tokenizer.json")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(_hub_cache_with(tmp_path / "hub", "org/tiny",
                                                                           tmp_path / "tokenizer.json")))
    t0 = time.perf_counter()
    tok = load_pretrained("org/tiny")
    assert time.perf_counter() - t0 < 2
    assert tok.encode(TRICKY[0]) == bpe.encode(TRICKY[0]) and tok.eot_id == bpe.eot_id
    with pytest.raises(TokenizerError, match=r"tokenizer.name='org/other' is not in the local .*HF_HUB_OFFLINE"):
        load_pretrained("org/other")


def test_unreachable_hub_fails_fast_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    # A real process against a hub endpoint that refuses connections, with an empty hub cache.
    code = ("from pelab.data.tokenizer import load_pretrained\n"
            "try:\n    load_pretrained('org/does-not-exist')\nexcept Exception as e:\n    print(repr(e))\n")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    elapsed = time.perf_counter() - t0
    assert ("TokenizerError(\"tokenizer.name='org/does-not-exist' is not in the local Hugging Face cache and the "
            "hub is unreachable") in out.stdout, out.stdout + out.stderr
    assert "Retrying" not in out.stderr and elapsed < 10, (elapsed, out.stderr)  # was ~25 s of retries
