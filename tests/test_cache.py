"""The token cache (pelab.data.cache): contents, reuse, rebuilds of corrupt entries, concurrent builders,
checksums, the real default cache (slow)."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from helpers.texts import BPE_SMALL, text_datamodule, text_dir_config, text_source, words_dir
from pelab.data import LMDataModule, build_corpus, open_cache
from pelab.data.cache import verify_entry
from pelab.data.corpora import SPLITS
from pelab.errors import CacheDirError, CacheRebuildWarning

# ----------------------------------------------------------------------------- cache


def test_cache_contents_match_the_corpus(text_dir, tmp_path):
    dm = text_datamodule(text_dir, tmp_path, tokenizer="byte")
    corpus = build_corpus(text_source(text_dir))
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
    corpus = build_corpus(text_source(text_dir))
    first = open_cache(corpus, BPE_SMALL, tmp_path)
    assert first.built
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}
    # (its speed, < 1 s: experiments/benchmarks/timing_targets.py cache_reuse)
    second = open_cache(build_corpus(text_source(text_dir)), BPE_SMALL, tmp_path)
    assert not second.built and second.path == first.path
    assert {p.name: p.stat().st_mtime_ns for p in second.path.iterdir()} == mtimes, "files were rewritten"
    # Different settings -> a different entry; same settings via the DataModule -> the same one.
    other = open_cache(corpus, {**BPE_SMALL, "vocab_size": 300}, tmp_path)
    assert other.path != first.path and other.built
    assert text_datamodule(text_dir, tmp_path).cache.built is False
    assert not [p for p in (tmp_path / "tokens").iterdir() if p.name.startswith((".tmp", ".old"))]


def test_env_var_sets_the_default_cache_dir(text_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PELAB_CACHE_DIR", str(tmp_path / "from-env"))
    cache = open_cache(build_corpus(text_source(text_dir)), "byte", None)
    assert cache.path.is_relative_to(tmp_path / "from-env")


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "meta", "flip_keep_mtime"])
def test_corrupt_cache_is_detected_and_rebuilt(damage, text_dir, tmp_path):
    corpus = build_corpus(text_source(text_dir))
    good = open_cache(corpus, "byte", tmp_path)
    expected = np.array(good.tokens("train"))
    path = good.path / "train.bin"
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif damage == "overwrite":  # same size, different bytes at the head
        with open(path, "r+b") as f:
            f.write(b"\xff\xff" * 100)
    elif damage == "flip_keep_mtime":  # one byte in the middle, the file's stamp restored (the mtime too)
        st = path.stat()
        with open(path, "r+b") as f:
            f.seek(st.st_size // 2)
            byte = f.read(1)
            f.seek(st.st_size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
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
        ctx.Process(target=_open_in_child, args=(text_source(text_dir), str(tmp_path), queue)) for _ in range(3)
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
    good = open_cache(build_corpus(text_source(src)), "byte", cache)
    before = {p: p.read_bytes() for p in good.path.iterdir()}
    (src / "new.txt").write_text("a new file changes the key")
    corpus = build_corpus(text_source(src))
    (src / "3.txt").unlink()  # vanishes mid-build: reading it fails
    with pytest.raises(FileNotFoundError):
        open_cache(corpus, "byte", cache)
    entries = sorted(p.name for p in (cache / "tokens").iterdir() if not p.name.endswith(".lock"))
    assert entries == [good.path.name], "a failed build left files behind"
    assert {p: p.read_bytes() for p in good.path.iterdir()} == before, "a failed build touched a good entry"


# ----------------------------------------------------------------------------- bad input


def test_unwritable_cache_dir(text_dir, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("a regular file, so nothing can be created below it (even as root)")
    with pytest.raises(CacheDirError, match="paths.cache_dir"):
        text_datamodule(text_dir, afile / "sub", tokenizer="byte")
    assert afile.read_text().startswith("a regular file")


# ----------------------------------------------------------------------------- the real default


@pytest.mark.slow
def test_default_stdlib_cache_builds_then_is_reused_and_feeds_the_loader(tmp_path):
    """The real default (stdlib corpus, BPE 4096): built once, reopened without a rebuild, batches flow. Its
    speed (build < 60 s, load < 1 s, > 200 batches/s) is measured by experiments/benchmarks/timing_targets.py
    (default_cache), not asserted here: wall-clock limits fail on a loaded machine."""
    dm = LMDataModule(
        data="stdlib",
        tokenizer={"kind": "bpe", "vocab_size": 4096},
        seq_len=256,
        batch_size=16,
        cache_dir=str(tmp_path),
    )
    dm.prepare_data()  # builds it (a fresh folder)
    again = LMDataModule(
        data="stdlib",
        tokenizer={"kind": "bpe", "vocab_size": 4096},
        seq_len=256,
        batch_size=16,
        cache_dir=str(tmp_path),
    )
    again.setup()
    assert not again.cache.built
    it = iter(again.train_dataloader())
    assert sum(1 for _ in zip(range(500), it)) == 500
    print(f"\n{ {s: again.fingerprint['splits'][s] for s in SPLITS} }")
    assert again.vocab_size == 4096 + 128 and 2.5 < again.bytes_per_token < 5


# ============================================================================= issue 17: checksums
# (cache.verify_entry)


def test_corruption_in_the_middle_of_the_cache_is_detected_rebuilt_and_the_run_trains(tmp_path):
    from pelab.runs.build import build_datamodule
    from pelab.tasks.train import train

    folder = words_dir(tmp_path / "texts", 12, 40_000)
    cfg = text_dir_config(folder, tmp_path / "cache", tmp_path / "run")
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
    folder = words_dir(tmp_path / "texts", 6, 200_000)
    corpus = build_corpus(text_source(folder))
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
