"""Corpora: each yields documents (str) per split, lazily, in a fixed order. `pelab.data.sources` picks one by
`data.source`; this module holds what every corpus shares and the two file corpora (`stdlib`, `text_dir`).

Splits are "train", "val", "test". Folder sources (and hub datasets that ship only a train
split) are split by a stable hash of each document's key (relative path / row index), so a
document's split never depends on which other documents exist or on the machine.

Every corpus has a `fingerprint()`: a JSON-able dict computed WITHOUT reading document text
(paths, sizes, versions, settings); it keys the token cache and is recorded with results.

`sized_documents(split)` yields (text, bytes): a file's size on disk (a hub row's UTF-8 bytes), so that bits
per byte count the source's own bytes, not those of a re-encoded or U+FFFD-patched text.
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pelab.errors import CorpusError, CorpusWarning

SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------- splitting


def split_of(key: str, val_fraction: float = 0.02, test_fraction: float = 0.02) -> str:
    """Stable split assignment: sha256 of the key -> uniform number in [0, 1).

    hashlib, not hash(): Python salts str hashes per process.
    """
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    if h < val_fraction:
        return "val"
    if h < val_fraction + test_fraction:
        return "test"
    return "train"


def _key_rank(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def assign_splits(
    keys: list[str], val_fraction: float, test_fraction: float, what: str
) -> dict[str, list[int]]:
    """Indices of `keys` per split by the hash rule.

    A small corpus may leave a split empty; then the lowest-hash document of the largest
    split moves there (still deterministic, still no document in two splits).
    """
    if len(keys) < 3:
        raise CorpusError(
            f"{what} has {len(keys)} document(s); at least 3 are needed so that train, val and test "
            "each get one. Add files (or widen data.glob)."
        )
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    for i, k in enumerate(keys):
        out[split_of(k, val_fraction, test_fraction)].append(i)
    for s in SPLITS:
        if not out[s]:
            donor = max(SPLITS, key=lambda d: (len(out[d]), d == "train"))
            moved = min(out[donor], key=lambda i: _key_rank(keys[i]))
            out[donor].remove(moved)
            out[s].append(moved)
    return out


def capped(docs: Iterator[tuple[str, int]], max_bytes: int | None) -> Iterator[tuple[str, int]]:
    """(text, bytes) documents until the split holds max_bytes; at least one document."""
    total = 0
    for doc, size in docs:
        if max_bytes is not None and total > 0 and total + size > max_bytes:
            return
        total += size
        yield doc, size


def utf8_sized(docs: Iterator[str]) -> Iterator[tuple[str, int]]:
    return ((d, len(d.encode("utf-8"))) for d in docs)


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")


def to_plain(cfg: Any) -> Any:
    """Config values as plain Python: an OmegaConf DictConfig / ListConfig -> dict / list (interpolations
    resolved), another Mapping -> a dict, anything else as it is (so settings pickle into workers, hash
    stably, and reach `datasets` as str / list / dict)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg) if isinstance(cfg, Mapping) else cfg


# ----------------------------------------------------------------------------- file corpora


class FileCorpus:
    """One document per file; `files` sorted by relative path; split by hash of that path."""

    kind = "files"
    encoding = "utf-8"

    def __init__(
        self,
        root: Path,
        files: list[Path],
        max_bytes: int | None = None,
        val_fraction: float = 0.02,
        test_fraction: float = 0.02,
        what: str = "the corpus",
    ):
        self.root = root
        self.rel = sorted(f.relative_to(root).as_posix() for f in files)
        self.max_bytes = max_bytes
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.split_index = assign_splits(self.rel, val_fraction, test_fraction, what)

    def files(self, split: str) -> list[str]:
        """Relative paths of the split's documents, in corpus order."""
        check_split(split)
        return [self.rel[i] for i in self.split_index[split]]

    def _read(self, rel: str) -> tuple[str, int]:
        # errors="replace": a few stdlib test files are deliberately not UTF-8 (text_dir counts and reports them).
        data = (self.root / rel).read_bytes()
        return data.decode(self.encoding, errors="replace"), len(data)

    def sized_documents(self, split: str) -> Iterator[tuple[str, int]]:
        """(text, bytes of the file) per document of the split."""
        return capped((self._read(r) for r in self.files(split)), self.max_bytes)

    def documents(self, split: str) -> Iterator[str]:
        return (text for text, _ in self.sized_documents(split))

    def sample_documents(self, split: str, n_bytes: int) -> Iterator[str]:
        """About `n_bytes` of the split, as every k-th document (spread over the whole split,
        not its alphabetical head); sizes come from the file system, nothing extra is read."""
        files = self.files(split)
        sizes = [(self.root / r).stat().st_size for r in files]
        if self.max_bytes is not None:  # the same prefix `documents` would yield
            cum = np.cumsum(sizes)
            keep = max(1, int(np.searchsorted(cum, self.max_bytes, side="right")))
            files, sizes = files[:keep], sizes[:keep]
        stride = max(1, math.ceil(sum(sizes) / max(n_bytes, 1)))
        return (self._read(r)[0] for r in files[::stride])

    def _file_list_fingerprint(self, with_mtime: bool) -> dict[str, Any]:
        h = hashlib.sha256()
        total = 0
        for r in self.rel:
            st = (self.root / r).stat()
            total += st.st_size
            h.update(f"{r}\0{st.st_size}".encode())
            if with_mtime:
                h.update(f"\0{st.st_mtime_ns}".encode())
            h.update(b"\n")
        return {"n_files": len(self.rel), "total_bytes": total, "files_sha256": h.hexdigest()[:16]}

    def _split_fingerprint(self) -> dict[str, Any]:
        return {
            "max_bytes": self.max_bytes,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
        }


class StdlibCorpus(FileCorpus):
    """The running interpreter's standard library `.py` files (site-packages excluded)."""

    kind = "stdlib"
    EXCLUDE_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})

    def __init__(self, max_bytes: int | None = None, val_fraction: float = 0.02, test_fraction: float = 0.02):
        root = Path(sysconfig.get_paths()["stdlib"])
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in self.EXCLUDE_DIRS]
            files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
        if not files:
            raise CorpusError(f"no .py files under the stdlib path {root}; use data=text_dir data.path=...")
        super().__init__(root, files, max_bytes, val_fraction, test_fraction, what=f"stdlib at {root}")

    def fingerprint(self) -> dict[str, Any]:
        # File list + sizes + Python version (no mtimes: the same Python gives the same key anywhere).
        return {
            "source": "stdlib",
            "python": sys.version.split()[0],
            "implementation": sys.implementation.name,
            **self._file_list_fingerprint(with_mtime=False),
            **self._split_fingerprint(),
        }


def check_text_dir(path: str | os.PathLike | None, glob: str, encoding: str) -> Path:
    """The settings of `data=text_dir`, checked on the file system alone (no file is read), so that the command
    line refuses them before anything is built: a folder given and existing, an encoding Python knows, at least
    one file matching `data.glob`. Returns the folder."""
    if path is None or str(path) in ("", "???"):
        raise CorpusError("data=text_dir needs a folder: set data.path=/path/to/texts")
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise CorpusError(
            f"data.path={path} is not an existing folder; set data.path to a folder of text files"
        )
    try:
        b"x".decode(encoding, "replace")  # a LookupError for unknown names and non-text codecs (rot13, base64)
    except (LookupError, TypeError):
        raise CorpusError(
            f"data.encoding={encoding!r} is not a text encoding Python knows; use e.g. utf-8, latin-1, "
            "cp1252 or utf-16"
        ) from None
    if not any(p.is_file() for p in root.glob(glob)):
        raise CorpusError(
            f"no files match data.glob={glob!r} under data.path={root}; change data.glob or data.path"
        )
    return root


class TextDirCorpus(FileCorpus):
    """Any local folder: `path` + `glob` (recursive patterns like '**/*.txt' work), decoded as `encoding`.

    At the cache build (never on a cached start) every file is read once first: a binary file (a NUL
    character, or over a quarter of its characters undecodable) is skipped; a text file with undecodable
    bytes is kept with U+FFFD in their place. One warning gives the counts and examples; a folder with no
    text left is an error. The splits are then drawn over the text files (same hash rule).
    """

    kind = "text_dir"

    def __init__(
        self,
        path: str | os.PathLike | None,
        glob: str = "**/*.txt",
        max_bytes: int | None = None,
        val_fraction: float = 0.02,
        test_fraction: float = 0.02,
        encoding: str = "utf-8",
    ):
        root = check_text_dir(path, glob, encoding)
        files = sorted(p for p in root.glob(glob) if p.is_file())
        self.glob, self.encoding = glob, codecs.lookup(encoding).name  # latin-1 == iso8859-1: one cache key
        self._scanned = False
        super().__init__(
            root, files, max_bytes, val_fraction, test_fraction, what=f"data.path={root} (data.glob={glob!r})"
        )

    def files(self, split: str) -> list[str]:
        self._scan()
        return super().files(split)

    def _scan(self) -> None:
        if self._scanned:
            return
        where = f"data.path={self.root} (data.glob={self.glob!r}, data.encoding={self.encoding!r})"
        binary, garbled = [], {}  # garbled: kept file -> number of U+FFFD put in
        for r in self.rel:
            data = (self.root / r).read_bytes()
            try:
                text, bad = data.decode(self.encoding), 0
            except UnicodeDecodeError:
                text = data.decode(self.encoding, errors="replace")
                bad = text.count("\ufffd")
            if "\0" in text or bad > len(text) / 4:
                binary.append(r)
            elif bad:
                garbled[r] = bad
        skipped = set(binary)
        text_files = [r for r in self.rel if r not in skipped]
        if not text_files:
            raise CorpusError(
                f"no text in {where}: all {len(binary)} files are binary (NUL characters or mostly undecodable), "
                f"e.g. {_examples(binary)}; point data.path / data.glob at text files, or set data.encoding "
                "if they are text in another encoding (e.g. utf-16)"
            )
        if binary or garbled:
            parts = []
            if binary:
                parts.append(
                    f"skipped {len(binary)} of {len(self.rel)} files as binary (NUL characters or mostly "
                    f"undecodable), e.g. {_examples(binary)}"
                )
            if garbled:
                parts.append(
                    f"kept {len(garbled)} files with {sum(garbled.values())} undecodable byte sequences replaced "
                    f"by U+FFFD, e.g. {_examples([f'{r} ({n})' for r, n in garbled.items()])}"
                )
            warnings.warn(
                f"{where}: {'; '.join(parts)}. Narrow data.glob, or set data.encoding (e.g. latin-1) if the "
                "files are text in another encoding",
                CorpusWarning,
                stacklevel=2,
            )
        # Splits over the text files only (the hash rule puts every file where it was; only a split left
        # empty by the skipped files borrows one).
        pos = {r: i for i, r in enumerate(self.rel)}
        what = f"{where} after skipping {len(binary)} binary file(s)" if binary else where
        split = assign_splits(text_files, self.val_fraction, self.test_fraction, what)
        self.split_index = {s: [pos[text_files[j]] for j in idx] for s, idx in split.items()}
        self._scanned = True

    def fingerprint(self) -> dict[str, Any]:
        # Local files change in place, so mtimes are part of the key here.
        return {
            "source": "text_dir",
            "path": str(self.root),
            "glob": self.glob,
            "encoding": self.encoding,
            **self._file_list_fingerprint(with_mtime=True),
            **self._split_fingerprint(),
        }


def _examples(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")
