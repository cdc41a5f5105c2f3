"""Tokenizers (pelab.data.tokenizer): lossless round trips, saved and reloaded BPE, the reserved recall ids,
pretrained tokenizers from a local folder or the local hub cache, fast failures offline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.texts import BPE_SMALL, text_datamodule, text_source
from pelab.data import build_corpus, make_tokenizer
from pelab.data.corpora import SPLITS
from pelab.data.tokenizer import load_pretrained
from pelab.errors import TokenizerError

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


# ----------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_tokenizer_round_trip(kind, text_dir):
    corpus = build_corpus(text_source(text_dir))
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
    dm = text_datamodule(text_dir, tmp_path)
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
    train_bpe(build_corpus(text_source(text_dir)).documents("train"), vocab_size=300).tk.save(str(folder / "tokenizer.json"))
    return {"kind": "pretrained", "name": str(folder), "reserved_keys": 5, "reserved_values": 7}


@pytest.mark.parametrize("kind", ["byte", "bpe", "pretrained"])
def test_reserved_ids_come_after_the_vocabulary_and_never_encode_text(kind, text_dir, tmp_path):
    tok_cfg = {"byte": {"kind": "byte", "reserved_keys": 5, "reserved_values": 7},
               "bpe": {**BPE_SMALL, "reserved_keys": 5, "reserved_values": 7},
               "pretrained": _local_pretrained(text_dir, tmp_path / "hub")}[kind]
    dm = text_datamodule(text_dir, tmp_path / "cache", tokenizer=tok_cfg)
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
    other = text_datamodule(text_dir, tmp_path / "cache", tokenizer={**tok_cfg, "reserved_keys": 6})
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


# ----------------------------------------------------------------------------- Hugging Face hub


def test_pretrained_tokenizer_offline_error(hf_offline):
    with pytest.raises(TokenizerError, match=r"tokenizer.name='gpt2'.*tokenizer=bpe"):
        load_pretrained("gpt2")
    with pytest.raises(TokenizerError, match="tokenizer.name"):
        load_pretrained("???")


# ============================================================================= issue 17: fast hub failures
# (tokenizer.hub_tokenizer_file)


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

    bpe = make_tokenizer(BPE_SMALL, build_corpus(text_source(text_dir)).documents("train"))
    bpe.save(tmp_path / "tokenizer.json")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(_hub_cache_with(tmp_path / "hub", "org/tiny",
                                                                           tmp_path / "tokenizer.json")))
    tok = load_pretrained("org/tiny")  # (its speed, < 2 s: experiments/benchmarks/timing_targets.py hub_cache_load)
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
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert ("TokenizerError(\"tokenizer.name='org/does-not-exist' is not in the local Hugging Face cache and the "
            "hub is unreachable") in out.stdout, out.stdout + out.stderr
    # Fast = no retries (they were ~25 s); the time itself, < 10 s, is measured by
    # experiments/benchmarks/timing_targets.py (unreachable_hub), not asserted on a machine of unknown load.
    assert "Retrying" not in out.stderr, out.stderr
