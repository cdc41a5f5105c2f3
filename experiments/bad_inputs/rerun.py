"""Rerun docs/bad_inputs.md's table through the real command line and time each case: the exit code, whether the
last line names the setting, no traceback and no Hydra hint line, and what the case touched before its refusal: W&B
(a `wandb/` folder: a run started, offline or online), the token cache (built in the case's own empty cache
folder), a checkpoint. A case marked "before any cost" must touch none of them. Writes a markdown table.

    python experiments/bad_inputs/rerun.py [--out experiments/bad_inputs/results.md] [--only NAME...]

Each case is a fresh `python train.py` (or `eval.py`) with the small settings, in its own folder and its own empty
token cache, W&B offline (WANDB_MODE=offline), except the rows with a W&B key and no server (a made-up key, the
server at a closed local port, WANDB_MODE unset: what a user with credentials and no network has). The rows that
need a run (another seed's run, eval.py into a training folder) copy one trained once at the start. The full-disk
and read-only rows mount a small tmpfs (root only; otherwise they are reported as not run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model=micro", "data.seq_len=32", "data.recall_mix=0", "data.batch_size=8", "trainer=cpu",
         "trainer.max_steps=4", "trainer.val_check_interval=4", "callbacks.progress_bar=false"]
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"


@dataclass
class Case:
    what: str
    args: list[str]
    expect: str  # text the last line must hold
    before_cost: bool  # refused before any cost: no W&B, no token cache, no checkpoint
    script: str = "train.py"
    env: dict[str, str] = field(default_factory=dict)
    small: bool = True  # the small settings (False: the defaults: the default model and batch)
    then: tuple[list[str], str] | None = None  # a relaunch (overrides, text its output must hold)


def wandb_key_no_server() -> dict[str, str]:
    """Credentials and no network: a made-up key, the server at a local port nobody listens on, WANDB_MODE unset."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"WANDB_API_KEY": "0123456789abcdef" * 2 + "01234567", "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
            "WANDB_MODE": ""}


CASES = [
    Case("unknown option", ["pe=bogus"], "pe=bogus", True),
    Case("unknown values of a multirun, all at once", ["-m", "pe=rope,bogus,alibi,bogus2"], "bogus2", True),
    Case("a value of the wrong type", ["trainer.max_steps=abc"], "trainer.max_steps", True),
    Case("an unknown + key", ["+data.seq_length=256"], "data.seq_len", True),
    Case("model.n_heads=0", ["model.n_heads=0"], "model.n_heads", True),
    Case("model.n_heads not dividing d_model", ["model.n_heads=3"], "model.n_heads", True),
    Case("optim.lr=-1", ["optim.lr=-1"], "optim.lr", True),
    Case("data.recall_mix=2", ["data.recall_mix=2"], "data.recall_mix", True),
    Case("batch not divisible by the devices", ["trainer=ddp_sim", "data.batch_size=7"], "data.batch_size", True),
    Case("probes.depths=[1.5]", ["probes.depths=[1.5]"], "probes.depths", True),
    Case("eval.protocols=[bogus]", ["eval.protocols=[bogus]"], "eval.protocols", True),
    Case("pe.* out of range", ["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction", True),
    Case("threads=0", ["threads=0"], "threads", True),
    Case("data=text_dir without data.path", ["data=text_dir"], "data.path", True),
    # the checks that need the data: the split's size, the memory estimate (before the token cache where the
    # estimate needs no vocabulary), both before W&B
    Case("eval.lengths longer than the split", ["eval.lengths=[4000000]"], "eval.lengths", False),
    Case("eval.lengths longer than the split, W&B key and no server", ["eval.lengths=[4000000]"], "eval.lengths",
         True, env=wandb_key_no_server()),
    Case("the same with tokenizer=bpe from an empty cache, W&B key and no server",
         ["tokenizer=bpe", "eval.lengths=[4000000]"], "eval.lengths", True, env=wandb_key_no_server()),
    # with memory to spare (PELAB_AVAILABLE_MEMORY) the split's check decides: after the data, still before W&B
    Case("eval.lengths longer than the split, memory to spare, W&B key and no server", ["eval.lengths=[4000000]"],
         "fewer than one window", False, env={**wandb_key_no_server(), "PELAB_AVAILABLE_MEMORY": "1e15"}),
    Case("the same with tokenizer=bpe from an empty cache", ["tokenizer=bpe", "eval.lengths=[4000000]"],
         "fewer than one window", False, env={**wandb_key_no_server(), "PELAB_AVAILABLE_MEMORY": "1e15"}),
    Case("a step that cannot fit in memory (default model and batch)", ["data.seq_len=100000"], "data.seq_len", True,
         small=False),
    Case("data.batch_size=100000 (default model), W&B key and no server", ["data.batch_size=100000"],
         "data.batch_size", True, env=wandb_key_no_server(), small=False),
    Case("probes.samples too many", ["probes.samples=1000000000"], "probes.samples", True),
    Case("ckpt_path to a missing file", ["ckpt_path=/nonexistent/last.ckpt"], "ckpt_path", True),
    Case("a truncated checkpoint", ["ckpt_path={broken}"], "not a readable checkpoint", True),
    Case("WANDB_MODE empty", ["logger=wandb"], "WANDB_MODE", True, env={"WANDB_MODE": ""}),
    Case("the run folder under a file (a path that cannot exist)", ["hydra.run.dir={file}/run"], "hydra.run.dir",
         True),
    # issue 58: the run folder
    Case("hydra.run.dir empty", ["hydra.run.dir="], "is empty", True),
    Case("eval.py: hydra.run.dir empty", ["ckpt_path={seed0}/checkpoints/last.ckpt", "hydra.run.dir="], "is empty",
         True, script="eval.py"),
    Case("a folder of other files", ["hydra.run.dir={docs}"], "already holds files but no PELab run", True),
    Case("an unreadable summary.json", ["hydra.run.dir={cut}"], "cannot be read", True),
    Case("an unreadable summary.json, seed=1 ckpt_path=auto", ["hydra.run.dir={cut}", "seed=1", "ckpt_path=auto"],
         "cannot be read", True),
    Case("a fresh launch over another seed's run", ["hydra.run.dir={seed0}", "seed=1"], "seed", True),
    Case("ckpt_path=auto over another seed's run", ["hydra.run.dir={seed0}", "seed=1", "ckpt_path=auto"],
         "seed=0 before but 1 now", True),
    Case("eval.py into a training run's folder", ["ckpt_path={seed0}/checkpoints/last.ckpt", "hydra.run.dir={seed0}"],
         "holds a training run", True, script="eval.py"),
    Case("eval.py ckpt_path=<a folder without checkpoints>", ["ckpt_path={docs}"], "without checkpoints", True,
         script="eval.py"),
    # issue 58: Hydra's own errors, a Trainer keyword
    Case("a key typo without +", ["trainer.max_step=5"], "did you mean trainer.max_steps?", True),
    Case("a Lightning keyword without +", ["trainer.accumulate_grad_batches=0"], "+trainer.accumulate_grad_batches",
         True),
    Case("a value split at a space", ["hydra.run.dir={folder}/my", "run"], "quote values with spaces", True),
    Case("a broken list", ["eval.lengths=[1,2"], "eval.lengths", True),
    Case("a Trainer keyword out of range", ["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches",
         True),
    # issue 58: the disk (a tmpfs: root only)
    Case("a full disk when Hydra makes the run folder", ["hydra.run.dir={full}/run"], "No space left on device", True),
    Case("a read-only folder", ["hydra.run.dir={readonly}/run"], "not writable", True),
    Case("the disk fills at the first last.ckpt; then a relaunch with space",
         ["logger=csv", "hydra.run.dir={tight}/run", "ckpt_path=auto"], "last.ckpt", False,
         then=(["logger=csv", "hydra.run.dir={tight}/run", "ckpt_path=auto"], "continuing from best.ckpt")),
]


def train_seed0(tmp: Path) -> Path:
    """A finished seed-0 run of the small settings (the rows that need a run copy it)."""
    out = tmp / "seed0"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PELAB_CACHE_DIR": str(tmp / "seed0-cache"), "WANDB_MODE": "offline"}
    subprocess.run([sys.executable, str(ROOT / "train.py"), *SMALL, "logger=csv", "evaluate_after_fit=false",
                    f"hydra.run.dir={out}"], env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return out


def mount_tmpfs(path: Path, size: int, options: str = "") -> bool:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (f",{options}" if options else "")
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True,
                          check=False).returncode == 0


def fill(path: Path) -> None:
    """Fill a file system to its last byte."""
    try:
        with open(path / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:  # full (the close's flush fails too)
        pass


def prepare(case: Case, folder: Path, seed0: Path, mounts: list[Path]) -> dict[str, str] | None:
    """The case's files; None when it cannot run here (no tmpfs)."""
    (folder / "a_file").write_text("not a folder")
    (folder / "broken.ckpt").write_bytes(b"PK\x03\x04 truncated")
    (folder / "docs").mkdir()
    (folder / "docs" / "doc1.txt").write_text("a user's file")
    (folder / "cut").mkdir()
    (folder / "cut" / "summary.json").write_text('{"status": "ok", "global_st')  # a write cut short
    places = {"broken": folder / "broken.ckpt", "file": folder / "a_file", "docs": folder / "docs",
              "cut": folder / "cut", "folder": folder, "seed0": folder / "seed0"}
    shutil.copytree(seed0, folder / "seed0")
    text = " ".join(case.args)
    if "{full}" in text:
        if not mount_tmpfs(folder / "full", 1 << 20):
            return None
        mounts.append(folder / "full")
        fill(folder / "full")
    if "{readonly}" in text:
        if not mount_tmpfs(folder / "readonly", 1 << 20, "ro"):
            return None
        mounts.append(folder / "readonly")
    if "{tight}" in text:
        # room for the run folder and one checkpoint (best.ckpt), not two: the disk fills at the first last.ckpt
        ckpt = (seed0 / "checkpoints" / "last.ckpt").stat().st_size
        if not mount_tmpfs(folder / "tight", 256 * 1024 + int(1.5 * ckpt)):
            return None
        mounts.append(folder / "tight")
        places["tight"] = folder / "tight"
    places.update(full=folder / "full", readonly=folder / "readonly", tight=folder / "tight")
    return {k: str(v) for k, v in places.items()}


def launch(case: Case, args: list[str], folder: Path, cache: Path, out: Path) -> tuple[subprocess.CompletedProcess,
                                                                                       float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PELAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline", **case.env}
    if env.get("WANDB_MODE") == "" and case.env.get("WANDB_API_KEY"):
        del env["WANDB_MODE"]  # the key-and-no-server rows: WANDB_MODE unset
    multirun = args[:1] == ["-m"]
    place = [f"hydra.sweep.dir={out}"] if multirun else ([] if any(a.startswith("hydra.run.dir") for a in args)
                                                         else [f"hydra.run.dir={out}"])
    small = SMALL if case.small and case.script == "train.py" else []
    logger = ["logger=wandb"] if case.script == "train.py" and not any(a.startswith("logger") for a in args) else []
    cmd = [sys.executable, str(ROOT / case.script), *(args[:1] if multirun else []), *small, *logger,
           *(args[1:] if multirun else args), *place]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=900,
                         stdin=subprocess.DEVNULL, check=False)  # a non-zero exit is the expected outcome
    return res, time.perf_counter() - t0


def run_case(case: Case, tmp: Path, seed0: Path) -> dict:
    folder = Path(tempfile.mkdtemp(dir=tmp))
    mounts: list[Path] = []
    try:
        places = prepare(case, folder, seed0, mounts)
        if places is None:
            return {"what": case.what, "args": " ".join(case.args), "rc": "", "seconds": float("nan"),
                    "line": "not run: mounting a tmpfs needs root", "wandb": "", "cache": "", "ckpt": "",
                    "verdict": "not run"}
        args = [a.format(**places) for a in case.args]
        cache, out = folder / "cache", folder / "out"
        res, seconds = launch(case, args, folder, cache, out)
        text = (res.stdout + res.stderr).strip()
        errors = [x for x in text.splitlines() if x.startswith("Error:") or "Error:" in x[:40]]
        last = errors[-1] if errors else (text.splitlines() or [""])[-1]
        # what the case touched (the copied seed-0 run's own files excluded)
        wandb = any(p.is_dir() for p in folder.rglob("wandb") if "seed0" not in p.parts)
        built = cache.exists() and any(p.is_file() for p in cache.rglob("*"))
        ckpts = [p for p in folder.rglob("*.ckpt") if "seed0" not in p.parts and p.name != "broken.ckpt"]
        ok = (res.returncode != 0 and case.expect in last and "Traceback" not in text
              and HYDRA_HINT not in text.splitlines()[-1] and (not case.before_cost or not (wandb or built or ckpts)))
        if case.then is not None:  # free the space, relaunch
            for m in mounts:
                subprocess.run(["mount", "-o", "remount,size=64m", str(m)], check=False, capture_output=True)
            again, _ = launch(case, [a.format(**places) for a in case.then[0]], folder, cache, out)
            said = case.then[1] in again.stdout + again.stderr
            ok = ok and again.returncode == 0 and said
            last = (f"{last[:150]}… / relaunch: exit {again.returncode}, {'says' if said else 'does NOT say'} "
                    f"'{case.then[1]}'")
        return {"what": case.what, "args": " ".join(case.args), "rc": res.returncode, "seconds": seconds,
                "line": last, "wandb": "yes" if wandb else "no", "cache": "built" if built else "no",
                "ckpt": "yes" if ckpts else "no", "verdict": "ok" if ok else "FAILED"}
    finally:
        for m in mounts:
            subprocess.run(["umount", str(m)], check=False, capture_output=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "experiments" / "bad_inputs" / "results.md"))
    p.add_argument("--only", nargs="*", default=None, help="run only the cases whose name contains one of these")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        seed0 = train_seed0(Path(tmp))
        for case in CASES:
            if args.only and not any(o in case.what for o in args.only):
                continue
            r = run_case(case, Path(tmp), seed0)
            rows.append(r)
            print(f"{r['verdict']:7} {r['seconds']:5.1f}s rc={r['rc']} W&B={r['wandb']} cache={r['cache']} "
                  f"{r['what']}: {r['line'][:150]}", flush=True)
    header = ("| case | overrides | verdict | exit | time to the error | W&B started | token cache built | "
              "checkpoint written | the last line |")
    lines = [header, "|---|---|---|---:|---:|---|---|---|---|"]
    for r in rows:
        line = r["line"].replace("|", "\\|")[:240]
        lines.append(f"| {r['what']} | `{r['args']}` | {r['verdict']} | {r['rc']} | {r['seconds']:.1f} s | "
                     f"{r['wandb']} | {r['cache']} | {r['ckpt']} | {line} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{sum(r['verdict'] == 'ok' for r in rows)} of {len(rows)} ok; table: {args.out}")


if __name__ == "__main__":
    main()
