"""The Hugging Face corpus (pelab.data.hf_corpus), offline: local JSON / parquet files, derived and native
splits, WikiText articles, the offline error."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from helpers.texts import BPE_SMALL, random_doc
from pelab.data import LMDataModule, build_corpus
from pelab.data.corpora import SPLITS
from pelab.data.hf_corpus import _wikitext_articles
from pelab.errors import CorpusError, CorpusUnavailable


def _rows(n: int, rng: random.Random) -> list[dict]:
    return [{"id": i, "text": random_doc(rng)} for i in range(n)]


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
    dm = LMDataModule(data=src, tokenizer="byte", seq_len=32, batch_size=2, cache_dir=str(tmp_path / "c"))
    dm.setup()
    assert dm.train_dataset().batch(0).tokens.shape == (2, 33)
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
        data=src, tokenizer=BPE_SMALL, seq_len=32, batch_size=2, cache_dir=str(tmp_path / "c")
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
