"""What `python train.py` checks before Hydra starts the job, each a one-line error naming the setting:

- the environment: `WANDB_MODE` set but empty or unknown; `PELAB_OUTPUT_DIR` / `PELAB_CACHE_DIR` not writable;
- the command line's config group choices: every value of every group of a multirun (`-m pe=rope,bogus,alibi`
  names all the unknown ones, where Hydra names the first);
- the run (or sweep) folder and the token cache folder writable (`Preflight`, Hydra's callback, on the config
  Hydra composes: Hydra's own logging would otherwise fail with a traceback ending in "Unable to configure
  handler 'file'");
- a study run (composed with `experiment=...`) from a git tree with uncommitted changes to tracked files, unless
  `provenance.allow_dirty=true` (`Preflight` too: once per launch, before any job of a multirun).

And, for errors during a run, `os_error_line`: a full disk, a read-only folder or a missing permission anywhere in
an exception's chain, as one line naming the path and the setting that moves it.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pelab.disk import disk_error
from pelab.errors import ConfigError, DirtyTreeError
from pelab.runs.folder import LOCK

WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run")
WHERE = {"cache": "PELAB_CACHE_DIR or paths.cache_dir", "output": "hydra.run.dir / hydra.sweep.dir, "
         "paths.output_root or PELAB_OUTPUT_DIR"}


def check_environment() -> None:
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE={mode!r} (environment) is not a W&B mode; set it to one of "
                          f"{', '.join(WANDB_MODES[:3])}, or unset it (unset WANDB_MODE).")
    for var, what in (("PELAB_OUTPUT_DIR", "output"), ("PELAB_CACHE_DIR", "cache")):
        if os.environ.get(var):
            check_writable(Path(os.environ[var]), f"{var}={os.environ[var]} (environment)", what)


def check_writable(path: Path, setting: str, what: str) -> None:
    """`path` (or, where it does not exist yet, its nearest existing parent) can take new files."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        reason = "is not a folder" if probe.exists() and not probe.is_dir() else "is not writable"
        raise ConfigError(f"{setting}: {probe} {reason}; point {WHERE[what]} to a writable folder.")


def check_command_line(argv: list[str], conf_dir: str) -> None:
    """Group choices of the command line: every value of a sweep (Hydra names only the first it misses).
    Reads the conf/ folders (and those `--config-dir` / `-cd` adds: a study's frozen presets), composes nothing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    takes_value = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                   "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}
    args, dirs, flag = [], [Path(conf_dir)], None
    for a in argv:
        if flag is not None:  # the value of the flag before it
            dirs += [Path(a)] if flag in ("--config-dir", "-cd") else []
            flag = None
        elif a.startswith("--config-dir="):
            dirs.append(Path(a.partition("=")[2]))
        elif a.startswith("-"):
            flag = a if a in takes_value else None
        else:
            args.append(a)
    if any(a.startswith(("hydra.searchpath", "+hydra.searchpath")) for a in args) or not all(
            d.is_dir() for d in dirs):
        return  # groups outside these folders, or a folder that is not there: Hydra's own lookup and message
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return  # a malformed override: Hydra's own message names it
    missing = []
    for o in parsed:
        key = o.key_or_group
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        groups = [d / Path(*key.lstrip("+~").split("/")) for d in dirs]
        if any(g.is_dir() for g in groups) and not o.is_delete():
            missing += [f"{key}={v}" for v in values
                        if isinstance(v, str) and not any((g / f"{v}.yaml").is_file() for g in groups)]
    if missing:
        def options(group: str) -> str:
            return ", ".join(sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")
                                     if not p.stem.startswith("_")}))

        known = "; ".join(f"{g}: {options(g)}" for g in sorted({m.split("=")[0] for m in missing}))
        raise ConfigError(f"no config for {', '.join(missing)} (known {known}).")


class Preflight(Callback):
    """Hydra's callback (conf/hydra/default.yaml) that checks the folders a launch will write, on the one
    config Hydra composes, before Hydra creates them: the run folder (or the sweep folder of a multirun) and
    the token cache folder. Hydra's own logging would otherwise fail with a traceback ending in "Unable to
    configure handler 'file'"."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unless(lambda: check_folders(config, "hydra.run.dir"))
        refuse_unless(lambda: check_eval_folder(config, "hydra.run.dir"))
        refuse_unless(lambda: check_run_folder_is_ours(config, "hydra.run.dir"))
        refuse_unless(lambda: check_clean_tree(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unless(lambda: check_folders(config, "hydra.sweep.dir"))
        refuse_unless(lambda: check_clean_tree(config))


def check_folders(config: DictConfig, out_key: str) -> None:
    try:
        value = OmegaConf.select(config, out_key)
        cache = Path(config.paths.cache_dir)
    except Exception:  # noqa: BLE001 - an interpolation only Hydra's own run resolves: its error is clear
        return
    check_named_folder(value, out_key)
    check_writable(Path(value), out_key, "output")
    check_writable(cache, "paths.cache_dir", "cache")


def check_named_folder(value: Any, key: str) -> None:
    """An empty `hydra.run.dir=` is Path("") -- the current folder: the whole run (summary.json, .hydra/,
    checkpoints/) would be written among the files of wherever the command was typed, the repository root included."""
    if value is None or not str(value).strip():
        raise ConfigError(f"{key}={value or ''} is empty, which would write the run into the current folder; give "
                          f"it a folder ({key}=outputs/runs/my-run), or drop {key}= for a new dated one.")


# What a PELab launch leaves in its folder from its first moment (Hydra's .hydra/, the lock, the record) or a
# killed one may leave (checkpoints/, a summary set aside by hand): a folder holding one of these is a run's.
RUN_MARKERS = (".hydra", LOCK, "summary.json", "summary.json.unreadable", "checkpoints")


def check_run_folder_is_ours(config: DictConfig, out_key: str) -> None:
    """The run folder (`check_pelab_or_empty`), unless `paths.allow_nonempty`."""
    if OmegaConf.select(config, "paths.allow_nonempty", default=False) is True:
        return
    if (out := _run_folder(config, out_key)) is not None:
        check_pelab_or_empty(out, out_key)


def _run_folder(config: DictConfig, out_key: str) -> Path | None:
    """The folder `out_key` names, or None where it is an interpolation only Hydra's own run resolves (its error
    is clear there)."""
    try:
        return Path(OmegaConf.select(config, out_key))
    except Exception:  # noqa: BLE001
        return None


def check_pelab_or_empty(folder: Path, key: str) -> None:
    """A fresh launch into a folder of other files (a user's documents, another tool's output) would write
    checkpoints/, csv/, summary.json and wandb/ among them: refused, naming the folder; a PELab run's folder
    is left to the relaunch rules (pelab.runs.folder.relaunch_decision)."""
    if not folder.is_dir():
        return
    entries = sorted(p.name for p in folder.iterdir())
    if entries and not any(name in RUN_MARKERS for name in entries):
        shown = ", ".join(entries[:3]) + (f" (+{len(entries) - 3} more)" if len(entries) > 3 else "")
        raise ConfigError(f"{key}={folder} already holds files but no PELab run ({shown}); launch into an empty or "
                          "a new folder, or set paths.allow_nonempty=true to write the run among them.")


def check_eval_folder(config: DictConfig, out_key: str) -> None:
    """eval.py's run folder, before Hydra writes its .hydra/ there (`check_not_a_training_run`)."""
    if config.get("task") != "eval":
        return
    if (out := _run_folder(config, out_key)) is not None:
        check_not_a_training_run(out, out_key)


def check_not_a_training_run(folder: Path, key: str) -> None:
    """eval.py writes a record of its own into its folder (summary.json, .hydra/, the W&B run id): in a training
    run's folder it would replace that run's record and log a second W&B run under its id. Refused rather than
    written beside it in a subfolder: the training folder stays exactly as its run left it, and an evaluation's
    folder is always an evaluation's (pelab-report reads each folder as one job)."""
    from pelab.summary import read_summary

    summary = folder / "summary.json"
    if summary.is_file():
        try:
            task = read_summary(summary).get("task")
        except (OSError, ValueError):
            task = None  # unreadable: whose it is cannot be told, so it is not taken
        trained = task != "eval"
    else:
        trained = (folder / "checkpoints").is_dir()
    if trained:
        raise ConfigError(f"{key}={folder} holds a training run: eval.py writes its own summary.json and W&B run "
                          f"into its folder and would replace that run's record; drop {key}= (a new dated folder) "
                          "or pass an empty or an evaluation's folder (ckpt_path= names the checkpoint to evaluate).")


def check_clean_tree(config: DictConfig) -> None:
    """A study's numbers must be tied to a commit: a run composed with `experiment=...` is refused when tracked
    files of the checkout it runs from differ from their commit, unless `provenance.allow_dirty` (then each
    launch stores its diff: pelab.provenance.store_diff). Outside a git checkout there is nothing to tie."""
    from pelab.provenance import DIFF_FILE, code_state

    study = OmegaConf.select(config, "hydra.runtime.choices.experiment")
    if study is None or OmegaConf.select(config, "provenance.allow_dirty", default=False) is True:
        return
    state = code_state()
    if state.changed:
        raise DirtyTreeError(
            f"this study run (experiment={study}) comes from a git tree with uncommitted changes to tracked files "
            f"({len(state.changed)} changed in {state.top}, e.g. {state.changed[0]}): commit your changes, or set "
            "provenance.allow_dirty=true to run anyway; the diff is then stored in the run folder "
            f"({DIFF_FILE.format(launch='<launch>')}).")


def os_error_line(err: BaseException) -> str | None:
    """One line for a full disk / a read-only or forbidden place anywhere in `err`'s chain, else None."""
    found = disk_error(err)
    if found is None:
        return None
    where = f" writing {found.filename}" if found.filename else ""
    what = "cache" if found.filename and "cache" in str(found.filename) else "output"
    if found.errno in (errno.EROFS, errno.EACCES):  # no space to free: the place itself takes no writes
        return f"{os.strerror(found.errno)}{where}: not writable; point {WHERE[what]} to a writable folder."
    return f"{os.strerror(found.errno)}{where}; free space there, or point {WHERE[what]} elsewhere."


def preflight(conf_dir: str) -> None:
    """The checks above that need no config, for `python train.py` / `pelab-train`."""
    refuse_unless(check_environment)
    refuse_unless(lambda: check_command_line(sys.argv[1:], conf_dir))


def refuse_unless(check: Callable[[], None]) -> None:
    """Run `check`; a ConfigError is one `Error:` line and exit code 1, before anything is written."""
    try:
        check()
    except ConfigError as err:
        print(f"Error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        sys.exit(1)
