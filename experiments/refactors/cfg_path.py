"""Follow the run config through the code: from `pelab.tasks.train.train`, every call (in source order) to a
pelab function that is handed the config or a part of it (an argument mentioning `cfg`), recursively, each
function entered once. Prints the stops with their layer, and counts how often the path climbs back to a
layer it had already left: a call that goes up the layer order (a lower layer calling back into a higher
one), or, for the task layer, every handoff of the config to a lower layer after the first (the config came
back up to the task layer and went down again: tasks -> runs, tasks -> runs counts one). Leaf helpers
(`pelab.errors`, `pelab.checks`) are not stops.

    python experiments/refactors/cfg_path.py [--src src] [--start pelab.tasks.train:train] [-v]

Static (ast): calls through attributes of objects (`module.model(...)`) and through Hydra's `instantiate` are
not followed; imports inside functions are.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

# "ops" and "harness": the layers of trees before pelab.score_bias, pelab.training and pelab.runs (--src <old tree>)
LAYERS = ["errors", "checks", "ops", "encodings", "model", "data", "evaluation", "training", "runs", "harness", "tasks",
          "report"]
LEAVES = ("errors", "checks")


def module_files(src: Path) -> dict[str, Path]:
    out = {}
    for path in (src / "pelab").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(module: str) -> str:
    part = module.split(".")[1] if "." in module else "pelab"
    return part if part in LAYERS else "errors"  # top-level modules (conf_values, summary, ...) sit at the bottom (tests/test_layers.py)


class Index:
    def __init__(self, src: Path):
        self.files = module_files(src)
        self.trees = {m: ast.parse(p.read_text()) for m, p in self.files.items()}

    def function(self, module: str, name: str) -> ast.FunctionDef | None:
        tree = self.trees.get(module)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        return None

    def names(self, module: str, fn: ast.FunctionDef) -> dict[str, tuple[str, str]]:
        """name -> (module, function) for the module's own functions and its pelab imports (top and in fn)."""
        out = {n.name: (module, n.name) for n in self.trees[module].body if isinstance(n, ast.FunctionDef)}
        for node in [*self.trees[module].body, *ast.walk(fn)]:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pelab"):
                for a in node.names:
                    target = node.module
                    # a package re-export: find the submodule that defines it
                    if self.function(target, a.name) is None:
                        for m in self.files:
                            if m.startswith(target + ".") and self.function(m, a.name) is not None:
                                target = m
                                break
                    out[a.asname or a.name] = (target, a.name)
        return out


def mentions_cfg(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "cfg" for n in ast.walk(node))


def follow(index: Index, module: str, name: str, seen: set, stops: list, edges: list) -> None:
    fn = index.function(module, name)
    if fn is None or (module, name) in seen:
        return
    seen.add((module, name))
    stops.append((module, name))
    names = index.names(module, fn)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))
    for call in calls:
        if isinstance(call.func, ast.Name) and call.func.id in names:
            args = [*call.args, *(k.value for k in call.keywords)]
            if any(mentions_cfg(a) for a in args):
                target = names[call.func.id]
                if layer_of(target[0]) in LEAVES or target in seen:
                    continue
                edges.append(((module, name), target))
                follow(index, *target, seen, stops, edges)


def returns(edges: list) -> tuple[int, list[str]]:
    """Upward calls, and the task layer's handoffs to lower layers after its first."""
    count, where, handed = 0, [], False
    for (caller, f), (callee, g) in edges:
        a, b = LAYERS.index(layer_of(caller)), LAYERS.index(layer_of(callee))
        if b > a:
            count += 1
            where.append(f"up: {caller}.{f} -> {callee}.{g}")
        elif b < a and layer_of(caller) == "tasks":
            if handed:
                count += 1
                where.append(f"again: {caller}.{f} -> {callee}.{g}")
            handed = True
    return count, where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[2] / "src"))
    ap.add_argument("--start", default="pelab.tasks.train:train")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    module, name = a.start.split(":")
    stops: list = []
    edges: list = []
    follow(Index(Path(a.src)), module, name, set(), stops, edges)
    count, where = returns(edges)
    if a.verbose:
        for m, f in stops:
            print(f"  {layer_of(m):10s} {m}.{f}")
    places = len({m for m, _ in stops})
    print(f"{len(stops)} stops (functions) in {places} modules; {count} returns to a layer already left")
    for line in where:
        print(f"  {line}")


if __name__ == "__main__":
    main()
