"""Files under the cache folder that every cached thing shares (the token cache of `pelab.data.cache`, the corpus
folders of `pelab.data.sdist`): where the folder is, that it can be written, a lock that concurrent builders wait
on, a file's checksum. Imports no other pelab module but the errors."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pelab.errors import CacheDirError


def resolve_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`paths.cache_dir` if given, else $PELAB_CACHE_DIR, else ~/.cache/pelab."""
    raw = cache_dir if cache_dir not in (None, "") else os.environ.get("PELAB_CACHE_DIR") or "~/.cache/pelab"
    return Path(raw).expanduser()


def ensure_writable(root: Path, folder: str = "tokens", what: str = "token cache") -> None:
    """`root / folder` (the `what`) created and writable, else a one-line CacheDirError naming paths.cache_dir."""
    try:
        (root / folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root / folder, prefix=".probe-"):
            pass
    except OSError as e:
        raise CacheDirError(
            f"cannot write the {what} under paths.cache_dir={root} ({type(e).__name__}: {e}); "
            "set paths.cache_dir (or $PELAB_CACHE_DIR) to a writable folder"
        ) from e


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `lock_path` (created): concurrent builders wait for the first one."""
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    # Chunked by hashlib, which uses the CPU's SHA extensions: cheap enough to hash whole files.
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
