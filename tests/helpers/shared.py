"""Building something once per test session, whichever pytest-xdist worker asks first (the file-lock pattern of the
pytest-xdist docs): a session fixture is otherwise built once per worker."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def shared_tmp(tmp_path_factory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session sees (their base temps share a parent)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process
        return tmp_path_factory.mktemp(name)
    path = tmp_path_factory.getbasetemp().parent / name
    path.mkdir(exist_ok=True)
    return path


def build_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(folder)` into a folder shared by the session's workers, by the first worker that asks; the others
    wait for it on a file lock and reuse the result. A build that raised is retried by the next one that asks (it
    fails there too, with its own error)."""
    root = shared_tmp(tmp_path_factory, name)
    with FileLock(str(root / ".build.lock")):
        if not (root / ".built").exists():
            build(root)
            (root / ".built").touch()
    return root
