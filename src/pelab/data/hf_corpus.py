"""The `hf` source: a Hugging Face `datasets` dataset as a corpus (`data.name`, `data.config`, `data.text_field`,
...), its missing val / test splits carved out of train by the hash rule of `pelab.data.corpora`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pelab.data.corpora import (
    capped,
    check_split,
    split_of,
    to_plain,
    utf8_sized,
)
from pelab.errors import CorpusError, CorpusUnavailable

_VAL_NAMES = ("validation", "valid", "val", "dev")
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = *\n?$")  # top-level " = Title = " lines only


def _wikitext_articles(lines: Iterator[str]) -> Iterator[str]:
    """WikiText rows are lines; an article starts at each top-level ' = Title = ' heading."""
    buf: list[str] = []
    for line in lines:
        if _WIKITEXT_TITLE.match(line) and any(s.strip() for s in buf):
            yield "".join(buf).strip("\n")
            buf = []
        buf.append(line or "\n")  # empty rows are the blank lines between paragraphs
    if any(s.strip() for s in buf):
        yield "".join(buf).strip("\n")


class HFCorpus:
    """A Hugging Face `datasets` dataset, loaded lazily (datasets keeps its own cache).

    `doc_split`: "row" (each non-empty row is a document) or "wikitext" (rows are lines;
    articles begin at top-level ' = Title = ' headings). Missing val/test splits are carved
    out of train by the hash rule on the document index.
    """

    kind = "hf"

    def __init__(
        self,
        name: str | None,
        config: str | None = None,
        text_field: str = "text",
        data_files: Any = None,
        revision: str | None = None,
        doc_split: str = "row",
        max_bytes: int | None = None,
        val_fraction: float = 0.02,
        test_fraction: float = 0.02,
    ):
        if not name or name == "???":
            raise CorpusError("data=hf needs a dataset: set data.name=... (and data.config, data.text_field)")
        if doc_split not in ("row", "wikitext"):
            raise CorpusError(f"data.doc_split={doc_split!r}; use 'row' or 'wikitext'")
        self.name, self.config, self.text_field = name, config, text_field
        self.data_files = to_plain(data_files)
        self.revision, self.doc_split, self.max_bytes = revision, doc_split, max_bytes
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self._dd = None

    def _load(self):
        if self._dd is not None:
            return self._dd
        try:
            import datasets
        except ImportError as e:  # pragma: no cover - datasets is a dependency
            raise CorpusUnavailable(
                "data=hf needs the `datasets` package; use data=stdlib or data=text_dir"
            ) from e
        try:
            dd = datasets.load_dataset(
                self.name, self.config, data_files=self.data_files, revision=self.revision
            )
        except Exception as e:  # the hub raises many types (ConnectionError, FileNotFoundError, ...)
            raise CorpusUnavailable(
                f"cannot load Hugging Face dataset data.name={self.name!r} data.config={self.config!r} "
                f"({type(e).__name__}: {e}). Offline or unknown name? Use data=stdlib (no download) or "
                "data=text_dir data.path=/your/texts."
            ) from e
        if not isinstance(dd, Mapping):
            dd = {"train": dd}
        if "train" not in dd:
            raise CorpusError(f"dataset {self.name!r} has no 'train' split (splits: {sorted(dd)})")
        for split_name, ds in dd.items():
            if self.text_field not in ds.column_names:
                raise CorpusError(
                    f"data.text_field={self.text_field!r} is not a column of {self.name!r} split "
                    f"{split_name!r}; available columns: {ds.column_names}. Set data.text_field."
                )
        self._dd = dd
        return dd

    def _native(self, split: str) -> str | None:
        dd = self._load()
        names = {"train": ("train",), "val": _VAL_NAMES, "test": ("test",)}[split]
        return next((n for n in names if n in dd), None)

    def _docs_of(self, hf_split: str) -> Iterator[str]:
        ds = self._load()[hf_split]
        rows = (
            t
            for batch in ds.select_columns([self.text_field]).iter(batch_size=1000)
            for t in batch[self.text_field]
        )
        docs = _wikitext_articles(r or "" for r in rows) if self.doc_split == "wikitext" else rows
        return (d for d in docs if d and d.strip())

    def sized_documents(self, split: str) -> Iterator[tuple[str, int]]:
        """(text, UTF-8 bytes) per document of the split."""
        check_split(split)
        native = self._native(split)
        derived = [s for s in ("val", "test") if self._native(s) is None]
        if native is not None and (split != "train" or not derived):
            return capped(utf8_sized(self._docs_of(native)), self.max_bytes)
        # Carve missing splits out of train by hash of the document index.
        vf = self.val_fraction if "val" in derived else 0.0
        tf = self.test_fraction if "test" in derived else 0.0
        docs = (d for i, d in enumerate(self._docs_of("train")) if split_of(str(i), vf, tf) == split)
        return capped(utf8_sized(docs), self.max_bytes)

    def documents(self, split: str) -> Iterator[str]:
        return (text for text, _ in self.sized_documents(split))

    def sample_documents(self, split: str, n_bytes: int) -> Iterator[str]:
        """The first ~`n_bytes` of the split (a dataset's row order is usually already mixed)."""
        return (text for text, _ in capped(self.sized_documents(split), n_bytes))

    def fingerprint(self) -> dict[str, Any]:
        # Settings only (loading the dataset just to hash it would cost seconds on every run);
        # local data files add their size and mtime so an edited fixture rebuilds.
        return {
            "source": "hf",
            "name": self.name,
            "config": self.config,
            "revision": self.revision,
            "text_field": self.text_field,
            "data_files": _files_fingerprint(self.data_files),
            "doc_split": self.doc_split,
            "max_bytes": self.max_bytes,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
        }


def _files_fingerprint(data_files: Any) -> Any:
    if data_files is None:
        return None
    if isinstance(data_files, (str, os.PathLike)):
        p = Path(data_files).expanduser()
        if p.is_file():
            st = p.stat()
            return [str(p.resolve()), st.st_size, st.st_mtime_ns]
        return str(data_files)
    if isinstance(data_files, Mapping):
        return {k: _files_fingerprint(v) for k, v in sorted(data_files.items())}
    return [_files_fingerprint(v) for v in data_files]
