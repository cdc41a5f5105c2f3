"""Corpora (pelab.data.corpora, pelab.data.sources): stable splits, the file corpora (stdlib, text_dir),
honest text (encodings, binary files)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from helpers.texts import text_dir_config, text_source, words_dir
from pelab.data import build_corpus, make_tokenizer, open_cache, split_of
from pelab.data.corpora import SPLITS, StdlibCorpus
from pelab.errors import CorpusError, TokenizerError

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
    before = build_corpus(text_source(tmp_path))
    for i in range(300, 400):
        (tmp_path / f"f{i:03d}.txt").write_text(f"doc {i}")
    after = build_corpus(text_source(tmp_path))
    for s in SPLITS:
        old = set(before.files(s))
        assert old <= set(after.files(s)), "adding files moved an existing document to another split"
    assert split_of("a/b.py") == split_of("a/b.py") in SPLITS


def test_text_dir_reads_documents_in_order(text_dir):
    c = build_corpus(text_source(text_dir))
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


# ----------------------------------------------------------------------------- bad input


def test_bad_folders(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match=r"data.glob='\*\*/\*.txt'.*data.path"):
        build_corpus(text_source(empty))
    (empty / "a.md").write_text("markdown only")
    with pytest.raises(CorpusError, match="data.glob"):
        build_corpus(text_source(empty))
    with pytest.raises(CorpusError, match="data.path"):
        build_corpus(text_source(tmp_path / "missing"))
    with pytest.raises(CorpusError, match="data.path"):
        build_corpus({"source": "text_dir", "path": "???"})
    with pytest.raises(CorpusError, match="at least 3"):
        build_corpus({**text_source(empty), "glob": "*.md"})
    with pytest.raises(CorpusError, match="data.source='nope'"):
        build_corpus({"source": "nope"})
    with pytest.raises(TokenizerError, match="tokenizer.kind='nope'"):
        make_tokenizer({"kind": "nope"})


# ============================================================================= issue 17: honest text
# (corpora.TextDirCorpus)


def _latin1_dir(root: Path) -> tuple[Path, list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    texts = [f"Café n°{i}: naïve façade, Ångström, señor, déjà vu, 50 µm, ±3 °C. " * 40 for i in range(5)]
    for i, t in enumerate(texts):
        (root / f"latin{i}.txt").write_bytes(t.encode("latin-1"))
    return root, texts


def test_latin1_files_decode_with_data_encoding_and_bits_per_byte_count_the_files_bytes(tmp_path):
    import warnings as _w

    from pelab.errors import CorpusWarning

    folder, texts = _latin1_dir(tmp_path / "latin")
    with _w.catch_warnings():
        _w.simplefilter("error")  # correct decoding: nothing to report
        corpus = build_corpus(text_source(folder, encoding="latin-1"))
        docs = {s: list(corpus.documents(s)) for s in SPLITS}
    assert sorted(itertools.chain(*docs.values())) == sorted(texts), "decoded exactly"
    cache = open_cache(corpus, "byte", tmp_path / "cache")
    for s in SPLITS:
        on_disk = sum((folder / r).stat().st_size for r in corpus.files(s))
        assert cache.meta["splits"][s]["n_bytes"] == on_disk  # not the UTF-8 re-encoding (2 bytes per é)
        assert cache.n_tokens(s) > on_disk  # the byte tokenizer sees UTF-8: more tokens than file bytes
    # Read as UTF-8 (the default) the same files are kept, with a warning counting the replaced bytes.
    wrong = build_corpus(text_source(folder))
    with pytest.warns(CorpusWarning, match=r"data.encoding='utf-8'.*kept 5 files with \d+ undecodable .*latin0\.txt"):
        wrong.files("train")
    utf8 = open_cache(wrong, "byte", tmp_path / "cache")
    assert utf8.path != cache.path, "the encoding is part of the cache key"
    assert utf8.meta["splits"]["train"]["n_bytes"] == cache.meta["splits"]["train"]["n_bytes"], (
        "bits per byte count the file's bytes, not 3 per U+FFFD"
    )
    with pytest.raises(CorpusError, match=r"data.encoding='klingon'"):
        build_corpus(text_source(folder, encoding="klingon"))
    with pytest.raises(CorpusError, match=r"data.encoding='rot13'"):
        build_corpus(text_source(folder, encoding="rot13"))


def test_mixed_folder_skips_binaries_keeps_the_text_splits_and_trains(tmp_path):
    from pelab.errors import CorpusWarning
    from pelab.tasks.train import train

    text = words_dir(tmp_path / "mixed", 20, 3_000)
    before = build_corpus(text_source(text, glob="*"))
    split_of_text = {s: before.files(s) for s in SPLITS}
    rng = random.Random(3)
    for i in range(4):
        (text / f"blob{i}.bin").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    (text / "zz-latin.txt").write_bytes("déjà vu, señor".encode("latin-1") * 50)
    corpus = build_corpus(text_source(text, glob="*"))
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
        summary = train(text_dir_config(text, tmp_path / "cache", tmp_path / "run", "data.glob=*"))
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
        train(text_dir_config(folder, tmp_path / "cache", out, "data.glob=*"))
    message = str(err.value)
    assert is_user_error(err.value) and "\n" not in message
    for key in (f"data.path={folder}", "data.glob='*'", "data.encoding='utf-8'", "all 6 files are binary"):
        assert key in message
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "model" not in summary
    assert [p.suffix for p in (tmp_path / "cache" / "tokens").iterdir()] == [".lock"], "no cache entry left behind"
