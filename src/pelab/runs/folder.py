"""One run per folder: a live run holds its folder (a lock file naming its pid), a relaunch continues the same run
or is refused, and what killed writes left behind is cleared.

- `claim(folder)`: take `.pelab.lock` (atomically); a lock whose pid is alive refuses the launch in one line
  naming that pid (`FolderHeld`: a multirun's job leaves it to that process, so that two workers can share one
  sweep folder); a lock left by a dead process is taken over. Temporary files of killed writes
  (`checkpoints/.<name>.tmp-<pid>`, `summary.json.tmp`) are removed once the folder is ours.
- `resolve_ckpt_path(ckpt_path, folder)`: the checkpoint a launch resumes from (`auto`: the folder's newest),
  a missing file or a truncated one refused in one line, without torch (`check_checkpoint_file`).
- `relaunch_decision(...)`: what a launch into a folder that already holds a run does -- continue it, skip it
  (a finished job of a relaunched multirun), or refuse (another run's settings, or a fresh start that would
  overwrite it).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pelab.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

LOCK = ".pelab.lock"


class FolderHeld(ConfigError):
    """A run folder held by another live process (`pid`): a launch is refused, a multirun leaves the job to it."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM  # exists, owned by someone else
    return True


def _holder(lock: Path) -> int | None:
    try:
        return int(lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def claim(folder: Path, what: str = "paths.output_dir") -> Iterator[None]:
    """Hold `folder` for this process while the body runs (see the module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid = _holder(lock)
            if pid is not None and pid != os.getpid() and pid_alive(pid):
                raise FolderHeld(f"{what}={folder} is in use by a running job (pid {pid}); wait for it, stop it, "
                                 f"or launch into another folder.", pid) from None
            lock.unlink(missing_ok=True)  # a dead holder's (or an unreadable) lock
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        break
    else:  # pragma: no cover - another process took it between unlink and create
        raise ConfigError(f"{what}={folder} is being claimed by another job; launch into another folder.")
    try:
        remove_stale_temp_files(folder)
        yield
    finally:
        if _holder(lock) == os.getpid():
            lock.unlink(missing_ok=True)


def remove_stale_temp_files(folder: Path) -> list[Path]:
    """Temporary files of writes a kill interrupted: checkpoint temps of dead processes and a summary temp."""
    gone = []
    for tmp in folder.glob("checkpoints/.*.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            gone.append(tmp)
    summary_tmp = folder / "summary.json.tmp"
    if summary_tmp.exists():
        summary_tmp.unlink()
        gone.append(summary_tmp)
    if gone:
        log.info("removed %d temporary file(s) of interrupted writes: %s", len(gone), ", ".join(p.name for p in gone))
    return gone


# Settings that define what a run trained: a relaunch into its folder must keep them (the others -- trainer.*,
# eval.*, probes.*, logging, paths -- may change). data.* except the keys that only shape validation / loading.
DEFINING = ("model", "pe", "tokenizer", "data", "optim", "seed")
DATA_RUNTIME = ("num_workers", "val_windows", "val_batch_size")


def changed_settings(before: dict, now: dict) -> list[str]:
    """The defining settings (DEFINING) that differ between two resolved configs, as readable differences;
    keys that only one side has are skipped (a key added to the configs since)."""
    from pelab.encodings import pe_schema
    from pelab.model import GPTConfig

    runtime = {"model": set(GPTConfig.RUNTIME_KEYS), "pe": set(pe_schema(now["pe"]).runtime_keys),
               "data": set(DATA_RUNTIME)}
    filled = filled_from_parent(before, now)
    out = []
    for group in DEFINING:
        old, new = before.get(group), now.get(group)
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new and old is not None and new is not None:
                out.append(f"{group}={old!r} before but {new!r} now")
            continue
        skip = runtime.get(group, set())
        if group == "data" and not old.get("recall_mix") and not new.get("recall_mix"):
            skip = skip | {k for k in old if k.startswith("recall_")}  # no recall rows: their settings act on nothing
        skip = skip | {key for g, key in filled if g == group}
        for key in sorted(set(old) & set(new) - skip):
            if old[key] != new[key]:
                out.append(f"{group}.{key}={old[key]!r} before but {new[key]!r} now")
    return out


def filled_from_parent(before: dict, now: dict) -> set[tuple[str, str]]:
    """Settings a context-extension child left null and filled from its parent when it ran (`pe.train_length`:
    pelab.training.extension): the recorded value is what null resolved to, the same launch again, not a change."""
    parent = (before.get("extend") or {}).get("parent") or {}
    recorded, launched = (before.get("pe") or {}), (now.get("pe") or {})
    if parent and launched.get("train_length") is None and recorded.get("train_length") == parent.get("train_length"):
        return {("pe", "train_length")}
    return set()


def relaunch_decision(folder: Path, config: dict, earlier: dict[str, Any], ckpt_path: str | None,
                      multirun: bool) -> str:
    """What a launch into `folder`, which holds the run `earlier` left (its summary.json; {} = none), does:
    "new" (nothing there), "continue" (the same run: resume from its checkpoint, or rerun its evaluation),
    "skip" (a finished job of a relaunched multirun). Refuses, in one line, a launch with other defining
    settings and a fresh start over a run (it would overwrite it)."""
    trained = earlier.get("global_step") or any((folder / "checkpoints").glob("*.ckpt"))
    if not earlier and trained:  # checkpoints without a record (summary.json moved aside): a run, settings unknown
        if multirun or ckpt_path not in (None, "", "null"):
            return "continue"  # the checkpoint's own settings are checked before resuming (check_resume_checkpoint)
        raise ConfigError(f"{folder} holds checkpoints of a run without its summary.json: relaunch with "
                          "ckpt_path=auto to continue it (its settings are checked against the checkpoint's), or "
                          "launch into another folder.")
    if not earlier or (earlier.get("status") != "ok" and not trained):
        return "new"  # nothing was trained there (e.g. a launch that stopped on a bad setting)
    diffs = changed_settings(earlier.get("config") or {}, config)
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise ConfigError(f"{folder} holds a run with other settings: {'; '.join(diffs[:3])}{more}. Relaunch with "
                          "its settings to continue it, or launch into another folder (paths.output_dir / "
                          "hydra.sweep.dir).")
    if multirun:
        return "skip" if earlier.get("status") == "ok" else "continue"
    if ckpt_path in (None, "", "null"):
        raise ConfigError(f"{folder} holds a run ({earlier.get('status')}, step {earlier.get('global_step', 0)}): "
                          "relaunch with ckpt_path=auto to continue it, or launch into another folder.")
    return "continue"


# -- checkpoints in a run folder -----------------------------------------------------------------------
def newest_checkpoint(output_dir: Path) -> Path | None:
    """`ckpt_path=auto`: the newest of checkpoints/last.ckpt and Lightning's SLURM requeue checkpoints
    (hpc_ckpt_*.ckpt in the run folder); without any, the newest readable other checkpoint (`earlier_checkpoint`)."""
    candidates = [output_dir / "checkpoints" / "last.ckpt", *output_dir.glob("hpc_ckpt_*.ckpt")]
    existing = [p for p in candidates if p.is_file()]
    if existing:
        return max(existing, key=lambda p: p.stat().st_mtime)
    return earlier_checkpoint(output_dir)


def earlier_checkpoint(output_dir: Path) -> Path | None:
    """A run that stopped before its first last.ckpt (a full disk at that write, a kill) may have written
    best.ckpt at the same validation: the newest readable checkpoints/*.ckpt, named in a warning -- the run
    continues from there rather than silently from step 0. Each holds the whole training state."""
    others = sorted((p for p in (output_dir / "checkpoints").glob("*.ckpt") if p.is_file()),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for path in others:
        try:
            check_checkpoint_file(path)
        except CheckpointError as err:
            log.warning("%s is not readable, not resumed from: %s", path, err)
            continue
        log.warning("%s has no last.ckpt (the run stopped before writing it): continuing from %s, its newest "
                    "readable checkpoint", output_dir, path.name)
        return path
    return None


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> str | None:
    """null: fresh run; "auto": this run folder's newest checkpoint (last.ckpt, or a SLURM requeue
    checkpoint) if there is one, else a fresh run; or a path."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "auto":
        newest = newest_checkpoint(output_dir)
        return str(newest) if newest else None
    if Path(ckpt_path).is_dir():  # a run folder: its newest checkpoint
        newest = newest_checkpoint(Path(ckpt_path))
        if newest is None:
            raise ConfigError(f"ckpt_path={ckpt_path} is a folder without checkpoints (checkpoints/last.ckpt); pass "
                              "a .ckpt file, a run folder that has one, 'auto' or null.")
        return str(newest)
    if not Path(ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={ckpt_path} does not exist; pass a .ckpt file, a run folder, 'auto' or null.")
    check_checkpoint_file(ckpt_path)
    return ckpt_path


ZIP_MAGIC = b"PK\x03\x04"


def check_checkpoint_file(path: str | Path, key: str = "ckpt_path") -> None:
    """A checkpoint cut short (a killed copy, a full disk) is refused here, without torch: torch.save writes a
    zip archive, whose directory sits at its end. A file that is no zip at all (torch's legacy format) is left
    to torch.load, which reads it or names it (pelab.training.checkpoints.read_checkpoint)."""
    import zipfile

    with open(path, "rb") as f:
        if f.read(4) != ZIP_MAGIC:
            return
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError) as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"{key}={path} is not a readable checkpoint (truncated or corrupted: {type(err).__name__}: "
            f"{first}); delete it or set {key}= to another checkpoint (e.g. checkpoints/best.ckpt).") from err


def check_resume_checkpoint(path: str, cfg: dict, same_run: bool = False) -> tuple[int, int | None]:
    """Refuse a checkpoint of another model, encoding or tokenizer before any work starts; with `same_run`
    (`ckpt_path=auto`: the run folder's own checkpoint, continued as that run) every defining setting, the seed
    included, must match the checkpoint's own record -- summary.json may be gone or wrong, the checkpoint is
    what was trained. Returns its step and vocabulary size (checked against the data once the tokenizer is
    loaded)."""
    from pelab.training.checkpoints import checkpoint_mismatches, load_run_checkpoint

    ckpt = load_run_checkpoint(path)
    if same_run:
        check_same_run(path, ckpt["hyper_parameters"]["cfg"], cfg)
    diffs = checkpoint_mismatches(ckpt["hyper_parameters"]["cfg"], cfg)
    if diffs:
        more = f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""
        raise CheckpointError(
            f"ckpt_path={path} belongs to another run: {'; '.join(diffs[:4])}{more}. Use the checkpoint's "
            "settings or start a fresh run (ckpt_path=null, another paths.output_dir)."
        )
    return int(ckpt.get("global_step", 0)), ckpt["hyper_parameters"]["vocab_size"]


def check_same_run(path: str, ckpt_cfg: dict, cfg: dict) -> None:
    """`ckpt_path=auto` continues the run whose checkpoint it is: a launch with other defining settings (seed,
    data, optim, model, encoding, tokenizer: `DEFINING`) would train on and label another run's weights as its
    own."""
    diffs = changed_settings(ckpt_cfg, cfg)
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise CheckpointError(
            f"ckpt_path=auto: {path} was trained with other settings: {'; '.join(diffs[:3])}{more}. Relaunch "
            "with the checkpoint's settings to continue it, or launch into another folder.")
