"""Launching runs as the tests do: the fast settings, real Hydra composition, `python train.py` / `eval.py` in a
subprocess (in the foreground or in the background, to be signalled), and reading what a run left behind."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = str(ROOT / "conf")  # the configs of this checkout (pelab.CONF_DIR in an editable install)
TESTS = ROOT / "tests"
# The frozen presets of committed studies live beside them, in a folder the command line adds to the config
# search path: `python train.py -cd experiments/<study>/conf experiment=<study>_v2`. Preset name -> that folder.
STUDY_PRESETS = {p.stem: p.parent.parent for p in sorted((ROOT / "experiments").glob("*/conf/experiment/*.yaml"))
                 + sorted((ROOT / "experiments").glob("*/v*/conf/experiment/*.yaml"))}


def config_dir(folder: Path | str) -> str:
    """The override adding `folder` to the config search path in a composition of our own, as `-cd folder`
    (Hydra's --config-dir) does on the command line."""
    path = (ROOT / folder).resolve()
    assert path.is_dir(), f"no folder {path}"  # Hydra refuses a --config-dir that is not there
    return f"hydra.searchpath=[file://{path}]"


def study_preset(name: str) -> list[str]:
    """The overrides composing the frozen study preset `name` (STUDY_PRESETS): its folder, then the choice."""
    return [config_dir(STUDY_PRESETS[name]), f"experiment={name}"]


# Small, fast settings for end-to-end runs: micro model, byte tokenizer, a capped stdlib corpus.
FAST = [
    "debug=fast",  # the smoke settings users get too (conf/debug/fast.yaml): micro model, 32 tokens, 30 steps
    "callbacks.progress_bar=false",  # no bar in the tests' logs
    # the CSV log only: W&B (the default logger) costs a run about 2 CPU-s and 3 s more; the tests of what reaches
    # W&B ask for it (`logger=wandb`, offline)
    "logger=csv",
]

# The shared multirun (conftest's `sweep`): rope, alibi x seeds 0, 1; evaluated at 32, 64, 128 tokens; probes
# at 32, 64. W&B offline beside the CSV log (the default logger), so the W&B test of a multirun reads this one
# instead of training its own.
SWEEP_ARGS = [
    *FAST,
    "pe=rope,alibi",
    "seed=0,1",
    "logger=wandb",
    "logger.wandb.mode=offline",
    "trainer.max_steps=10",
    "trainer.val_check_interval=10",
    "eval.lengths=[1,2,4]",
    "probes.lengths=[1,2]",
]

ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def isolated_env(cache_dir: Path) -> Iterator[None]:
    """The environment every test runs in (conftest's autouse `_isolated_env`): the session's token cache and no
    WANDB_* settings from outside. For fixtures wider than a test, which are built before that fixture applies."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PELAB_CACHE_DIR", str(cache_dir))
        for key in [k for k in os.environ if k.startswith("WANDB_")]:
            mp.delenv(key)
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_DISABLE_GIT", "true")
        yield


def compose(overrides: list[str], output_dir: Path | None = None, config_name: str = "train"):
    """Real Hydra composition of conf/<config_name>.yaml with overrides (no Hydra job started)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import pelab.training.config  # noqa: F401 - imports the schemas, which store their nodes (pe/_RoPEConfig, ...)

    extra = [f"paths.output_dir={output_dir}"] if output_dir is not None else []
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=[*overrides, *extra])


def run_cli(args: list[str], cwd: Path, timeout: int = 600, env: dict | None = None,
            script: str = "train.py") -> subprocess.CompletedProcess:
    """Run `python train.py ...` (or eval.py) as a user would, in a subprocess, no stdin."""
    # One thread, like this test process: an eval.py rerun then reproduces in-process numbers bit for bit.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False,
    )


# ----------------------------------------------------------------------------- a job in the background
def launch(args: list[str], cwd: Path) -> subprocess.Popen:
    """`python train.py args` in the background (to be signalled), in its own process group like a job in a
    terminal: `ctrl_c` signals the whole group, as the terminal does (the W&B service too). The tests folder
    is importable (for test callbacks such as `helpers.callbacks.SlowSteps`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD,
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def ctrl_c(proc: subprocess.Popen) -> float:
    """Ctrl-C in the job's terminal: SIGINT to its process group. Returns the time it was sent."""
    os.killpg(proc.pid, signal.SIGINT)
    return time.monotonic()


def read_until(proc: subprocess.Popen, text: str, timeout: float = 300.0) -> str:
    """The job's output up to the first line containing `text` (the rest stays in the pipe)."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no {text!r} in the output (rc={proc.poll()}):\n{''.join(seen)[-3000:]}")


def wait_until(condition, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc={proc.returncode}) before the condition held:\n"
                                 f"{proc.stdout.read()[-3000:]}")
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.005)


def finish(proc: subprocess.Popen, timeout: float = 300.0) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of the direct children of `pid`, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[1]) == pid:
            out.append((int(stat.parent.name), name))
    return out


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- what a run left behind
def load_checkpoint(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def summaries(folder: Path) -> list[dict]:
    """The summary.json of every job folder of a multirun, in folder order."""
    from pelab.summary import SUMMARY_FILE, read_summary

    return [read_summary(p) for p in sorted(folder.glob(f"*/{SUMMARY_FILE}"))]


def csv_rows(folder: Path) -> list[dict]:
    with open(folder / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def offline_runs(folder: Path) -> list[Path]:
    return sorted(folder.rglob("offline-run-*"))


def wandb_summary(run_path: Path) -> dict:
    """Read an offline W&B run back with `wandb leet inspect --summary --json`."""
    wandb_bin = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_bin), "leet", "inspect", "--summary", "--json", str(run_path)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wandb_records(run_path: Path) -> list[dict]:
    """Every record of an offline run (`wandb leet inspect --json`), one dict per record."""
    wandb_bin = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_bin), "leet", "inspect", "--json", str(run_path)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip().startswith("{")]
