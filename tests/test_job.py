"""pelab.training.job: the harness receives the job through the narrow protocol it defines (`JobRecord`), never
the task layer's object: the task layer's `Task` satisfies it, and no function below the task layer takes a
parameter standing for the task."""

from __future__ import annotations

import ast
from pathlib import Path

from pelab.tasks.task import Task
from pelab.training.job import JobRecord

SRC = Path(__file__).resolve().parents[1] / "src" / "pelab"
BELOW_TASKS = ("errors.py", "checks.py", "ops", "encodings", "model", "data", "evaluation", "harness")


def test_the_task_object_satisfies_the_harness_protocol(tmp_path):
    task = Task(tmp_path, {"status": "running"})
    assert isinstance(task, JobRecord)
    for name in ("save", "add_point", "quit_now", "start_wandb"):
        assert callable(getattr(task, name))


def test_no_function_below_the_task_layer_takes_the_task():
    found = []
    for part in BELOW_TASKS:
        for path in ([SRC / part] if part.endswith(".py") else sorted((SRC / part).rglob("*.py"))):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                    found += [f"{path.relative_to(SRC)}:{node.lineno} {node.name}({a.arg})" for a in args
                              if a.arg == "task" or (a.annotation is not None and "Task" in ast.unparse(a.annotation))]
    assert not found, found
