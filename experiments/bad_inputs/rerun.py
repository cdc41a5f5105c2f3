"""Rerun README's bad-input table through the real command line and time each case: the exit code, whether the
last line names the setting, no traceback, and, for the cases refused before any cost, that no token cache was
built and no checkpoint written. Writes a markdown table (the closing notes quote it).

    python experiments/bad_inputs/rerun.py [--out experiments/bad_inputs/results.md]

Each case is a fresh `python train.py` (Python, torch and Hydra start: a few seconds of every time) with the
small test settings, in its own folder and token cache.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model=micro", "data.seq_len=32", "data.recall_mix=0", "data.batch_size=8", "trainer=cpu", "logger=csv",
         "trainer.max_steps=4", "trainer.val_check_interval=4", "callbacks.progress_bar=false"]
# (what, overrides, the text the last line must hold, refused before any cost?)
CASES = [
    ("unknown option", ["pe=bogus"], "pe=bogus", True),
    ("unknown values of a multirun, all at once", ["-m", "pe=rope,bogus,alibi,bogus2"], "bogus2", True),
    ("a value of the wrong type", ["trainer.max_steps=abc"], "trainer.max_steps", True),
    ("an unknown + key", ["+data.seq_length=256"], "data.seq_len", True),
    ("model.n_heads=0", ["model.n_heads=0"], "model.n_heads", True),
    ("model.n_heads not dividing d_model", ["model.n_heads=3"], "model.n_heads", True),
    ("optim.lr=-1", ["optim.lr=-1"], "optim.lr", True),
    ("data.recall_mix=2", ["data.recall_mix=2"], "data.recall_mix", True),
    ("batch not divisible by the devices", ["trainer=ddp_sim", "data.batch_size=7"], "data.batch_size", True),
    ("probes.depths=[1.5]", ["probes.depths=[1.5]"], "probes.depths", True),
    ("eval.protocols=[bogus]", ["eval.protocols=[bogus]"], "eval.protocols", True),
    ("pe.* out of range", ["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction", True),
    ("threads=0", ["threads=0"], "threads", True),
    ("data=text_dir without data.path", ["data=text_dir"], "data.path", True),
    ("eval.lengths longer than the split", ["eval.lengths=[4000000]"], "eval.lengths", False),
    # the default model and batch (the small settings' micro model at batch 8 fits a 100k-token step)
    ("a step that cannot fit in memory", ["DEFAULTS", "data.seq_len=100000"], "data.seq_len", False),
    ("ckpt_path to a missing file", ["ckpt_path=/nonexistent/last.ckpt"], "ckpt_path", True),
    ("a truncated checkpoint", ["ckpt_path={broken}"], "not a readable checkpoint", True),
    ("WANDB_MODE empty", ["logger=wandb"], "WANDB_MODE", True),
    ("the run folder not writable", ["hydra.run.dir={file}/run"], "hydra.run.dir", True),
    # issue 58: the run folder, Hydra's own errors, a Trainer pass-through, the probes' memory
    ("hydra.run.dir empty", ["hydra.run.dir="], "is empty", True),
    ("a folder of other files", ["hydra.run.dir={docs}"], "already holds files but no PELab run", True),
    ("an unreadable summary.json", ["hydra.run.dir={cut}"], "cannot be read", True),
    ("a key typo without +", ["trainer.max_step=5"], "did you mean trainer.max_steps?", True),
    ("a value split at a space", ["hydra.run.dir={folder}/my", "run"], "quote values with spaces", True),
    ("a Trainer keyword out of range", ["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches",
     True),
    ("probes.samples too many", ["probes.samples=1000000000"], "probes.samples", False),
]


def run_case(what: str, args: list[str], expect: str, before_cost: bool, tmp: Path) -> dict:
    folder = Path(tempfile.mkdtemp(dir=tmp))
    (folder / "a_file").write_text("not a folder")
    (folder / "broken.ckpt").write_bytes(b"PK\x03\x04 truncated")
    (folder / "docs").mkdir()
    (folder / "docs" / "doc1.txt").write_text("a user's file")
    (folder / "cut").mkdir()
    (folder / "cut" / "summary.json").write_text('{"status": "ok", "global_st')  # a write cut short
    args = [a.format(broken=folder / "broken.ckpt", file=folder / "a_file", docs=folder / "docs", cut=folder / "cut",
                     folder=folder) for a in args]
    cache, out = folder / "cache", folder / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PELAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline"}
    if what == "WANDB_MODE empty":
        env["WANDB_MODE"] = ""
    multirun = args[:1] == ["-m"]
    place = [f"hydra.sweep.dir={out}"] if multirun else ([] if any(a.startswith("hydra.run.dir") for a in args)
                                                         else [f"hydra.run.dir={out}"])
    small = [] if "DEFAULTS" in args else SMALL
    args = [a for a in args if a != "DEFAULTS"]
    cmd = [sys.executable, str(ROOT / "train.py"), *(args[:1] if multirun else []), *small,
           *(args[1:] if multirun else args), *place]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                         check=False)  # a non-zero exit is the expected outcome
    seconds = time.perf_counter() - t0
    text = (res.stdout + res.stderr).strip()
    errors = [x for x in text.splitlines() if x.startswith("Error:") or "Error:" in x[:40]]
    last = errors[-1] if errors else (text.splitlines() or [""])[-1]
    built = cache.exists() and any(p.is_file() for p in cache.rglob("*"))
    ckpts = list(out.rglob("*.ckpt")) if out.exists() else []
    ok = (res.returncode != 0 and expect in last and "Traceback" not in text
          and (not before_cost or (not built and not ckpts)))
    return {"what": what, "args": " ".join(args), "rc": res.returncode, "seconds": seconds, "line": last,
            "cost": "none" if not built and not ckpts else ("token cache" if built else "") + (" checkpoint" if ckpts else ""),
            "verdict": "ok" if ok else "FAILED"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "experiments" / "bad_inputs" / "results.md"))
    p.add_argument("--only", nargs="*", default=None, help="run only the cases whose name contains one of these")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            if args.only and not any(o in case[0] for o in args.only):
                continue
            r = run_case(*case, Path(tmp))
            rows.append(r)
            print(f"{r['verdict']:6} {r['seconds']:5.1f}s rc={r['rc']} {r['what']}: {r['line'][:150]}", flush=True)
    lines = ["| case | overrides | verdict | exit | time to the error | built | the last line |", "|---|---|---|---:|---:|---|---|"]
    for r in rows:
        line = r["line"].replace("|", "\\|")[:200]
        lines.append(f"| {r['what']} | `{r['args']}` | {r['verdict']} | {r['rc']} | {r['seconds']:.1f} s | {r['cost']} | {line} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{sum(r['verdict'] == 'ok' for r in rows)} of {len(rows)} ok; table: {args.out}")


if __name__ == "__main__":
    main()
