"""The built wheel is the package a user gets: every config, every module, the console scripts, and a
declared dependency for every third-party import. (.ci/wheel-check installs it in a clean venv and runs it
from outside the repository; this is the cheap in-process part.)"""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers.shared import build_once

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "pelab"
CONF = ROOT / "conf"  # shipped as the package pelab.conf ([tool.setuptools] package-dir in pyproject.toml)

SCRIPTS = {
    "pelab-train": "pelab.tasks.train:main",
    "pelab-eval": "pelab.tasks.evaluate:main",
    "pelab-report": "pelab.report:main",
    "pelab-export": "pelab.export:main",
}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel built from a copy of the sources (the build must not write build/ into the checkout, and a
    stale build/lib could hide a file the wheel misses). No build isolation: setuptools is a dev dependency,
    so this needs no index. Built once per session, by the first xdist worker that asks."""
    def build(tmp: Path) -> None:
        src = tmp / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, src / name)
        for name in ("src", "conf"):
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp),
            str(src),
        ]
        subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)

    (path,) = build_once(tmp_path_factory, "wheel", build).glob("pelab-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


@pytest.mark.slow
def test_wheel_holds_every_config_and_module(wheel):
    names = set(wheel.namelist())
    configs = {f"pelab/conf/{p.relative_to(CONF).as_posix()}" for p in CONF.rglob("*.yaml")}
    assert "pelab/conf/hydra/launcher/slurm.yaml" in configs  # nested groups too, not just conf/*/*.yaml
    assert "pelab/conf/pe/rope.yaml" in configs
    assert configs - names == set()
    assert "pelab/conf/__init__.py" in names
    # a subpackage whose folder lost its __init__.py would silently drop out of the wheel
    modules = {f"pelab/{p.relative_to(PKG).as_posix()}" for p in PKG.rglob("*.py")}
    assert modules - names == set()


def test_wheel_declares_the_console_scripts_and_they_resolve(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(entry_points["console_scripts"]) == SCRIPTS
    for target in SCRIPTS.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target


def test_every_module_level_third_party_import_is_a_declared_dependency(wheel):
    """What `import pelab.<module>` needs must come with `pip install pelab` (imports inside functions are
    the optional features of the extras: sweeps, dashboard)."""
    meta = Parser().parsestr(_dist_info(wheel, "METADATA"))
    declared = {
        canonicalize_name(req.name)
        for req in map(Requirement, meta.get_all("Requires-Dist") or [])
        if req.marker is None  # extras carry an `extra == ...` marker
    }
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for path in PKG.rglob("*.py"):
        if not (path.parent / "__init__.py").is_file():  # package data, not a module (pelab/remote/: an export's code)
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top in ("pelab", "__future__"):
                    continue
                if not {canonicalize_name(d) for d in dists.get(top, [top])} & declared:
                    missing.setdefault(top, path.relative_to(PKG).as_posix())
    assert not missing, f"imported at module level but not in [project] dependencies: {missing}"


def test_pyproject_lists_every_package():
    """[tool.setuptools] packages is an explicit list (pelab.conf comes from conf/, outside src/, which
    [packages.find] cannot map): every folder of src/pelab with an __init__.py must be in it, or the wheel
    silently lacks that subpackage (test_wheel_holds_every_config_and_module would fail too, more slowly)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in PKG.rglob("__init__.py")}
    assert set(setuptools_cfg["packages"]) == found | {"pelab.conf"}
    assert setuptools_cfg["package-dir"] == {"": "src", "pelab.conf": "conf"}
    assert (CONF / "__init__.py").is_file()


def test_conf_dir_is_the_checkouts_conf(tmp_path):
    """In this checkout (editable install, or src/ on sys.path without installing), pelab.CONF_DIR is the
    top-level conf/, so an edit to conf/pe/rope.yaml applies with no reinstall. Both checked from another
    folder; the second with -S (no site-packages, so no editable finder: the fallback next to src/)."""
    import pelab

    if Path(pelab.__file__).resolve().parent != PKG.resolve():
        pytest.skip(f"pelab is imported from {pelab.__file__}, not from this checkout (no editable install)")
    assert Path(pelab.CONF_DIR) == CONF.resolve()
    code = "import pelab; print(pelab.CONF_DIR)"
    uninstalled = f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); " + code
    for cmd in ([sys.executable, "-c", code], [sys.executable, "-S", "-c", uninstalled]):
        out = subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, text=True, timeout=60)
        assert Path(out.stdout.strip()) == CONF.resolve(), cmd
