"""Token cache: a corpus tokenized once, stored as flat memmaps, reused by every run.

Layout under `paths.cache_dir` (default ~/.cache/pelab, or $PELAB_CACHE_DIR):

    tokens/<source>-<tokenizer>-<key>/
        meta.json          fingerprint, dtype, per-split counts, size + sha256 of every file (written last)
        verified.json      (size, mtime, inode) of each file when its sha256 last matched (a sidecar)
        tokenizer.json     the trained / fetched tokenizer (reloaded offline)
        {split}.bin        token ids, documents each followed by EOT; uint16 if the vocab fits
        {split}.idx.npy    int64 document start offsets, plus the total at the end (n_docs + 1,)
    tokens/<key>.lock      fcntl lock: concurrent builders wait for the first one

`key` hashes the corpus fingerprint + tokenizer settings (the reserved key / value counts included; meta.json
records the reserved id ranges as `reserved`). A build writes into a temp folder
and renames it into place, so a crash never leaves a half cache and never touches a good one.
Loading checks every file's size and whole-file sha256; a bad cache warns, naming the file, and is rebuilt.
A file is hashed again only when its (size, mtime, inode) differs from `verified.json` (any write changes its
mtime), so a reused cache costs a few stat calls, not a pass over every byte (timings:
experiments/benchmarks/README.md, "Data pipeline").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pelab.data.corpora import SPLITS
from pelab.data.disk import ensure_writable, locked, resolve_cache_root, sha256_file
from pelab.data.sources import Corpus
from pelab.data.tokenizer import EOT, Tokenizer, load_tokenizer, make_tokenizer, tokenizer_fingerprint
from pelab.errors import CacheRebuildWarning, CorpusError

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: whole-file checksums (`files`), n_bytes = the documents' bytes on disk
_VERIFIED = "verified.json"
_CHUNK_BYTES = 4 << 20  # text per encode_batch call


def cache_key(corpus_fp: Mapping[str, Any], tok_fp: Mapping[str, Any]) -> str:
    blob = json.dumps(
        {"v": CACHE_VERSION, "corpus": corpus_fp, "tokenizer": tok_fp}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TokenCache:
    """A verified cache entry: memmapped token ids per split + the tokenizer."""

    def __init__(self, path: Path, meta: dict[str, Any], tokenizer: Tokenizer, built: bool):
        self.path, self.meta, self.tokenizer = path, meta, tokenizer
        self.built = built  # True when this call had to build (False = reused)
        self.dtype = np.dtype(meta["dtype"])

    def n_tokens(self, split: str) -> int:
        return int(self.meta["splits"][split]["n_tokens"])

    def tokens(self, split: str) -> np.memmap:
        """(N,) read-only token ids of the split; documents joined by EOT."""
        return np.memmap(
            self.path / f"{split}.bin", dtype=self.dtype, mode="r", shape=(self.n_tokens(split),)
        )

    def offsets(self, split: str) -> np.ndarray:
        """(n_docs + 1,) start of each document in `tokens(split)`, then the total."""
        return np.load(self.path / f"{split}.idx.npy", mmap_mode="r")

    def bytes_per_token(self, split: str = "val") -> float:
        return float(self.meta["splits"][split]["bytes_per_token"])


# ----------------------------------------------------------------------------- open / build


def open_cache(
    corpus: Corpus, tok_cfg: Mapping[str, Any] | str, cache_dir: str | os.PathLike | None = None
) -> TokenCache:
    """Load the cache entry for (corpus, tokenizer), building it first if missing or broken."""
    root = resolve_cache_root(cache_dir)
    corpus_fp, tok_fp = corpus.fingerprint(), tokenizer_fingerprint(tok_cfg)
    key = cache_key(corpus_fp, tok_fp)
    entry = root / "tokens" / f"{corpus_fp['source']}-{tok_fp['kind']}{tok_fp.get('vocab_size', '')}-{key}"

    # Fast path, no lock and no write access needed: a valid entry is simply loaded.
    if verify_entry(entry) is None:
        return load_entry(entry, built=False)

    ensure_writable(root)
    with locked(root / "tokens" / f"{key}.lock"):
        problem = verify_entry(entry)  # another process may have built it while we waited
        if problem is None:
            return load_entry(entry, built=False)
        if entry.exists():
            warnings.warn(
                f"token cache {entry}: {problem}; rebuilding it",
                CacheRebuildWarning,
                stacklevel=2,
            )
        _build_entry(corpus, tok_cfg, entry, {"corpus": corpus_fp, "tokenizer": tok_fp, "key": key})
    return load_entry(entry, built=True)


def load_entry(entry: Path, built: bool = False) -> TokenCache:
    meta = json.loads((entry / "meta.json").read_text())
    fp = meta["fingerprint"]["tokenizer"]
    tok = load_tokenizer(entry / "tokenizer.json", meta["tokenizer_kind"], meta["eot_token"],
                         fp["reserved_keys"], fp["reserved_values"])
    return TokenCache(entry, meta, tok, built)


def verify_entry(entry: Path) -> str | None:
    """None if the entry is complete and every file matches its checksum, else a short reason naming the file."""
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return "missing" if not entry.exists() else "no meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable meta.json: {e}"
    if meta.get("version") != CACHE_VERSION:
        return f"cache format {meta.get('version')} != {CACHE_VERSION}"
    try:
        problem = _check_files(entry, meta["files"])
        if problem is not None:
            return problem
        splits = {split: meta["splits"][split] for split in SPLITS}
    except (KeyError, TypeError) as e:
        return f"meta.json incomplete ({type(e).__name__}: {e})"
    for split, s in splits.items():
        try:
            idx = np.load(entry / f"{split}.idx.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            return f"{split}.idx.npy unreadable: {e}"
        if idx.shape != (s["n_docs"] + 1,) or int(idx[-1]) != s["n_tokens"]:
            return f"{split}.idx.npy inconsistent"
    return None


# Caches up to this size are hashed whole on every open (measured: the default stdlib caches, 19 MB and 63 MB,
# take 33-120 ms on the 2-core dev CPU); larger ones trust a file whose stat stamp (size, mtime, inode) is the
# one recorded when it was last hashed, unless PELAB_CACHE_VERIFY=always.
FULL_VERIFY_BYTES = 2 << 30


def _check_files(entry: Path, files: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Size, then sha256, of each file. Caches of at most FULL_VERIFY_BYTES are hashed whole every time (any byte
    changed is caught); for larger ones the hash is skipped when the file's stat stamp is the one recorded in
    verified.json for that same checksum (a change that keeps size, mtime and inode is then missed). The stamps
    are saved back (best effort: a read-only cache is simply hashed on every start)."""
    try:
        known = json.loads((entry / _VERIFIED).read_text())
    except (OSError, ValueError):
        known = {}
    total = sum(int(want["size"]) for want in files.values())
    full = total <= FULL_VERIFY_BYTES or os.environ.get("PELAB_CACHE_VERIFY") == "always"
    trusted = {} if full else known  # stamps that spare a hash
    stamps = {}
    for name, want in files.items():
        path = entry / name
        try:
            st = path.stat()  # before hashing: a write during the hash changes the mtime, so it is hashed again
            if st.st_size != want["size"]:
                return f"{name} is {st.st_size} bytes, expected {want['size']}"
            stamps[name] = _stamp(st, want["sha256"])
            if trusted.get(name) != stamps[name] and sha256_file(path) != want["sha256"]:
                return f"{name} does not match its checksum (corrupted)"
        except OSError as e:
            return f"{name} unreadable ({type(e).__name__}: {e})"
    if stamps != known:
        _write_stamps(entry, stamps)
    return None


def _stamp(st: os.stat_result, sha256: str) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ino, sha256]


def _write_stamps(entry: Path, stamps: dict[str, list]) -> None:
    tmp = entry / f".{_VERIFIED}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(stamps))
        os.replace(tmp, entry / _VERIFIED)  # atomic: concurrent readers see the old or the new stamps
    except OSError:
        tmp.unlink(missing_ok=True)


def _build_entry(corpus: Corpus, tok_cfg: Mapping[str, Any] | str, entry: Path, fp: dict[str, Any]) -> None:
    """Build into a temp folder, then swap it in (the old entry, if any, is removed after)."""
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        tok = make_tokenizer(tok_cfg, _bpe_training_docs(corpus, tokenizer_fingerprint(tok_cfg)))
        t_tok = time.perf_counter() - t0
        tok.save(tmp / "tokenizer.json")
        dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)
        splits = {}
        for split in SPLITS:
            splits[split] = _encode_split(
                corpus.sized_documents(split), tok, dtype, tmp / f"{split}.bin", tmp / f"{split}.idx.npy"
            )
            if splits[split]["n_docs"] == 0:
                raise CorpusError(
                    f"the {split} split is empty; add documents or raise data.val_fraction / data.test_fraction"
                )
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        meta = {
            "version": CACHE_VERSION,
            "fingerprint": fp,
            "tokenizer_kind": tok.kind,
            "eot_token": getattr(tok, "eot_token", EOT),
            "eot_id": tok.eot_id,
            "vocab_size": tok.vocab_size,
            "reserved": tok.reserved,
            "dtype": dtype.name,
            "splits": splits,
            "files": files,
            "build_seconds": {"tokenizer": round(t_tok, 3), "total": round(time.perf_counter() - t0, 3)},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        # The fresh files are verified (renaming the folder keeps their stamps): the first reuse hashes nothing.
        _write_stamps(tmp, {n: _stamp((tmp / n).stat(), f["sha256"]) for n, f in files.items()})
        old = None
        if entry.exists():
            old = entry.with_name(f".old-{entry.name}-{os.getpid()}")
            os.replace(entry, old)
        os.replace(tmp, entry)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("built token cache %s in %.1fs", entry, time.perf_counter() - t0)


def _bpe_training_docs(corpus: Corpus, tok_fp: Mapping[str, Any]) -> Iterable[str] | None:
    if tok_fp["kind"] != "bpe":
        return None
    if tok_fp.get("train_bytes") is None:
        return corpus.documents("train")
    return corpus.sample_documents("train", int(tok_fp["train_bytes"]))


def _encode_split(
    docs: Iterable[tuple[str, int]], tok: Tokenizer, dtype: np.dtype, bin_path: Path, idx_path: Path
) -> dict[str, Any]:
    """Stream (text, bytes) documents through encode_batch into `bin_path`; EOT after every document.
    `bytes` is the document's size in its source (a file's bytes on disk), the denominator of bits per byte."""
    eot = np.array([tok.eot_id], dtype=dtype)
    starts: list[int] = []
    n_tokens = n_bytes = 0
    with open(bin_path, "wb") as f:
        for chunk in _chunks(docs, _CHUNK_BYTES):
            parts = []
            for (_, size), ids in zip(chunk, tok.encode_batch([text for text, _ in chunk])):
                starts.append(n_tokens)
                parts += [np.asarray(ids, dtype=dtype), eot]
                n_tokens += len(ids) + 1
                n_bytes += size
            f.write(np.concatenate(parts).tobytes())
    np.save(idx_path, np.asarray(starts + [n_tokens], dtype=np.int64))
    return {
        "n_docs": len(starts),
        "n_tokens": n_tokens,
        "n_bytes": n_bytes,
        # EOT tokens count (they are predicted too); bits/byte = nats/token / ln2 / bytes_per_token.
        "bytes_per_token": n_bytes / max(n_tokens, 1),
    }


def _chunks(docs: Iterable[tuple[str, int]], max_bytes: int) -> Iterator[list[tuple[str, int]]]:
    buf: list[tuple[str, int]] = []
    size = 0
    for d in docs:
        buf.append(d)
        size += d[1]
        if size >= max_bytes:
            yield buf
            buf, size = [], 0
    if buf:
        yield buf
