"""Text sources: `data.source` picks the corpus, each yields documents (str) per split, lazily, in a fixed order.

Three kinds:
- `stdlib`   the running interpreter's standard library `.py` files (no download; the default).
- `text_dir` any local folder (`data.path`, `data.glob`), one document per file.
- `hf`       a Hugging Face `datasets` dataset (`data.name`, `data.config`, `data.text_field`, ...).

What every corpus shares (splits, fingerprint, sized documents) is in `pelab.data.corpora`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pelab.data.corpora import StdlibCorpus, TextDirCorpus, check_text_dir
from pelab.data.hf_corpus import HFCorpus
from pelab.errors import CorpusError

Corpus = StdlibCorpus | TextDirCorpus | HFCorpus
SOURCES = ("stdlib", "text_dir", "hf")


def source_kind(cfg: Mapping[str, Any] | str) -> str:
    return cfg if isinstance(cfg, str) else str(cfg.get("source", "stdlib"))


def build_corpus(cfg: Mapping[str, Any] | str) -> Corpus:
    """`cfg` is the data config (`source` = kind, plus that kind's knobs) or just the kind."""
    kind = source_kind(cfg)
    c: Mapping[str, Any] = {} if isinstance(cfg, str) else cfg
    split_knobs = {
        "max_bytes": c.get("max_bytes"),
        "val_fraction": float(c.get("val_fraction", 0.02)),
        "test_fraction": float(c.get("test_fraction", 0.02)),
    }
    if kind == "stdlib":
        return StdlibCorpus(**split_knobs)
    if kind == "text_dir":
        return TextDirCorpus(
            c.get("path"), c.get("glob", "**/*.txt"), encoding=c.get("encoding", "utf-8"), **split_knobs
        )
    if kind == "hf":
        return HFCorpus(
            c.get("name"),
            c.get("config"),
            text_field=c.get("text_field", "text"),
            data_files=c.get("data_files"),
            revision=c.get("revision"),
            doc_split=c.get("doc_split", "row"),
            **split_knobs,
        )
    raise CorpusError(f"unknown data.source={kind!r}; known: {list(SOURCES)}")


def check_source(cfg: Mapping[str, Any]) -> None:
    """What the data config can be checked for before anything is built or imported (the command line's
    validation): a text folder's path, encoding and glob. A hub corpus is checked when it is fetched."""
    if source_kind(cfg) == "text_dir":
        check_text_dir(cfg.get("path"), cfg.get("glob", "**/*.txt"), cfg.get("encoding", "utf-8"))
