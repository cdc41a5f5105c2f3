"""Loggers: W&B (online with credentials, offline otherwise, never a prompt) and a CSV log alongside.

The W&B run is created here with `wandb.init` (not by Lightning) so that the mode is passed to this run
only (no process-wide WANDB_MODE), an online run that cannot reach its server falls back to offline in
bounded time, a resumed job reuses its run id, and `finish_wandb` can close it in every outcome.
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id.txt"


def has_wandb_credentials() -> bool:
    """An API key in the environment or in ~/.netrc (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_wandb_mode(requested: str | None) -> str:
    """Explicit config wins, then WANDB_MODE, then online only if credentials exist."""
    if requested:
        return requested
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if has_wandb_credentials() else "offline"


def init_wandb(
    wcfg: dict,
    *,
    name: str,
    output_dir: Path,
    config: dict,
    group: str | None,
    tags: list[str] | None = None,
    notes: str | None = None,
) -> Any | None:
    """Start (or resume, same id) this job's W&B run. Returns the run, or None when disabled."""
    import wandb

    mode = resolve_wandb_mode(wcfg.get("mode"))
    if mode == "disabled":
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    id_file = output_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else _new_run_id()
    kwargs = dict(
        project=wcfg.get("project") or "pelab",
        entity=wcfg.get("entity"),
        name=name,
        id=run_id,
        resume="allow",
        dir=str(output_dir),
        group=group,
        job_type=wcfg.get("job_type", "train"),
        tags=list(tags or []),
        notes=notes,
        config=config,
        reinit="finish_previous",  # a multirun job never continues the previous job's run
    )
    timeout = float(wcfg.get("init_timeout") or 30)
    settings = dict(init_timeout=timeout, console="off", silent=True, x_disable_stats=True)
    try:
        run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    except Exception as err:  # noqa: BLE001 - any server/network failure -> offline, never kill training
        if mode != "online":
            raise
        log.warning("W&B online init failed (%s); continuing offline.", str(err).splitlines()[0][:200])
        mode = "offline"
        run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    id_file.write_text(run.id)
    if mode == "offline":
        run_dir = Path(run.dir).parent  # .../wandb/offline-run-<date>-<id>
        log.info("W&B offline run in %s — view: `wandb leet %s`, upload: `wandb sync %s`", run_dir, run_dir, run_dir)
        print(f"W&B is offline. View: wandb leet {run_dir}  |  Upload: wandb sync {run_dir}")
    return run


def finish_wandb(run: Any | None, exit_code: int) -> None:
    """Close the run whatever happened; a W&B failure here must not mask the job's own outcome."""
    if run is None:
        return
    try:
        run.finish(exit_code=exit_code)
    except Exception as err:  # noqa: BLE001
        log.warning("W&B finish failed: %s", err)


def build_loggers(lcfg: dict, run: Any | None, output_dir: Path) -> list:
    """Lightning loggers: W&B wrapping the run we created, and the CSV log in `<output_dir>/csv/`."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    loggers: list = []
    if run is not None:
        loggers.append(WandbLogger(experiment=run, log_model=bool((lcfg.get("wandb") or {}).get("log_model"))))
    if lcfg.get("csv", True):
        loggers.append(CSVLogger(save_dir=str(output_dir), name="csv", version=""))
    return loggers


def wandb_log(run: Any | None, data: dict, step: int | None = None) -> None:
    """Log media/tables/scalars to W&B directly (rank 0 only callers); a failure only warns."""
    if run is None:
        return
    try:
        run.log(data, step=step)
    except Exception as err:  # noqa: BLE001 - W&B trouble must not kill a run
        log.warning("W&B log failed: %s", err)


def _new_run_id() -> str:
    """8 lowercase alphanumerics, like W&B's own ids (chosen here so a resumed job can reuse it)."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
