"""The package's import layering: every import between pelab modules (top-level, lazy inside a function, or
under TYPE_CHECKING) points down the layer order, and no modules import each other in a circle.

Layers, low to high: errors -> encodings -> model -> data -> evaluation -> training -> runs -> tasks -> report.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "pelab"
ORDER = ["errors", "encodings", "model", "data", "evaluation", "training", "runs", "tasks", "report"]
# Top-level modules outside the layer packages, and where they sit.
PLACED = {"pelab": "errors", "pelab.checks": "errors", "pelab.conf_values": "errors", "pelab.summary": "errors", "pelab.disk": "errors", "pelab.metric_keys": "errors", "pelab.result_table": "errors", "pelab.provenance": "errors", "pelab.score_bias": "errors", "pelab.signals": "errors", "pelab.dashboard": "report", "pelab.lm_eval": "tasks", "pelab.export": "tasks", "pelab.remote_code": "tasks"}


def modules(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        if not (path.parent / "__init__.py").is_file():  # package data, not a module (pelab/remote/: an export's code)
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The pelab modules `name` imports anywhere in its file (ast.walk: lazy and TYPE_CHECKING ones too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from pelab.x import func` -> pelab.x
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer(name: str) -> int:
    if name in PLACED:
        return ORDER.index(PLACED[name])
    top = name.split(".")[1]
    if top not in ORDER:
        raise AssertionError(f"{name} is in no layer: add it to ORDER or PLACED in tests/test_layers.py")
    return ORDER.index(top)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer(b) > layer(a))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), except a package importing its own
    submodules in its __init__ (pkg <-> pkg.x, the usual re-export)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            strong(v)
    return [c for c in out if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]


def test_no_upward_import_and_no_cycle():
    edges = graph()
    for name in edges:
        layer(name)  # every module sits in a layer
    assert upward(edges) == []
    assert cycles(edges) == []


def test_the_scan_sees_lazy_type_checking_and_relative_imports(tmp_path):
    """The checker itself: an upward import hidden in a function, under TYPE_CHECKING or written relative is
    found, and a circle between two layers is one."""
    pkg = tmp_path / "pelab"
    for sub in ("encodings", "model", "data"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "encodings" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pelab.model.gpt import GPT\n"
        "def f():\n    from ..data import loader\n")
    (pkg / "model" / "gpt.py").write_text("from pelab.encodings.base import f\n")
    (pkg / "data" / "loader.py").write_text("import pelab.encodings.base\n")
    known = modules(pkg)
    edges = {name: imports(name, path, known) for name, path in known.items()}
    assert edges["pelab.encodings.base"] == {"pelab.model.gpt", "pelab.data", "pelab.data.loader"}
    assert upward(edges) == ["pelab.encodings.base -> pelab.data", "pelab.encodings.base -> pelab.data.loader",
                             "pelab.encodings.base -> pelab.model.gpt"]
    assert ["pelab.data.loader", "pelab.encodings.base", "pelab.model.gpt"] in cycles(edges)


def test_no_experiment_script_edits_sys_path():
    """The experiments import the installed package (an editable install in a checkout), never `src/` by path."""
    root = SRC.parents[1] / "experiments"
    edits = [str(p.relative_to(root)) for p in root.rglob("*.py") if "sys.path.insert" in p.read_text()
             or "sys.path.append" in p.read_text()]
    assert edits == []
