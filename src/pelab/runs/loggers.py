"""W&B for `conf/logger/` (online with credentials, offline otherwise, never a prompt); the CSV log beside it
is Lightning's CSVLogger, made to keep its history across resumes (`ResumableCSVLogger`).

The W&B run is created here with `wandb.init` (not by Lightning) so that the mode is passed to this run
only (no process-wide WANDB_MODE), an online run that cannot reach its server falls back to offline in
bounded time, a resumed job reuses its run id, and `finish_wandb` can close it in every outcome.

W&B is never allowed to end a run: if its service process dies mid-run, every later W&B call fails fast
(ConnectionResetError); `SafeWandbLogger` and the guarded helpers here then warn once and carry on, and the
CSV log and summary.json still get everything.
"""

from __future__ import annotations

import csv
import logging
import netrc
import os
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

log = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id.txt"
_INIT_INFO: dict[str, dict] = {}  # run id -> seconds wandb.init took, why it fell back to offline


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


def wandb_values(wcfg: Any) -> dict:
    """A `logger.wandb` config (plain data) with every key conf/logger/wandb.yaml has: the keys it lacks (a run
    recorded before the key existed, whose settings the report uploads under) take that file's values."""
    from omegaconf import OmegaConf

    from pelab.conf_values import group_yaml

    given = OmegaConf.to_container(wcfg, resolve=True) if OmegaConf.is_config(wcfg) else dict(wcfg)
    return {**OmegaConf.to_container(group_yaml("logger", "wandb").wandb), **given}


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
    """Start (or resume, same id) this job's W&B run (`wcfg`: a `logger.wandb` config). Returns the run, or None
    when disabled."""
    import wandb

    wcfg = wandb_values(wcfg)
    mode = resolve_wandb_mode(wcfg["mode"])
    if mode == "disabled":
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    id_file = output_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else _new_run_id()
    kwargs = {
        "project": wcfg["project"],
        "entity": wcfg["entity"],
        "name": name,
        "id": run_id,
        "resume": "allow",
        "dir": str(output_dir),
        "group": group,
        "job_type": wcfg["job_type"],
        "tags": list(tags or []),
        "notes": notes,
        "config": config,
        "reinit": "finish_previous",  # a multirun job never continues the previous job's run
    }
    timeout = float(wcfg["init_timeout"])
    settings = {"init_timeout": timeout, "console": "off", "silent": True, "x_disable_stats": True}
    t0 = time.monotonic()
    fallback = None
    try:
        run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    except Exception as err:  # any server/network failure -> offline, never kill training
        if mode != "online":
            raise
        fallback = str(err).splitlines()[0][:200]
        msg = f"W&B online init failed after {time.monotonic() - t0:.0f} s ({fallback}); continuing offline."
        log.warning(msg)
        print(msg)
        # The failed attempt leaves the run id registered in the W&B service ("run ID ... is in use"):
        # a fresh service is needed for the offline run of the same id.
        wandb.teardown()
        mode = "offline"
        run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    _INIT_INFO[run.id] = {"seconds": round(time.monotonic() - t0, 2), "fallback": fallback}
    id_file.write_text(run.id)
    if mode == "offline":
        run_dir = Path(run.dir).parent  # .../wandb/offline-run-<date>-<id>
        log.info("W&B offline run in %s — view: `wandb leet %s`, upload: `wandb sync %s`", run_dir, run_dir, run_dir)
        print(f"W&B is offline. View: wandb leet {run_dir}  |  Upload: wandb sync {run_dir}")
    return run


def init_info(run: Any) -> dict:
    """What summary.json records about the W&B run (mode, init time, why it fell back to offline)."""
    info = {"id": run.id, "dir": str(Path(run.dir).parent), "mode": run.settings.mode}
    if run.settings.mode == "online":
        info["url"] = run.url
    return {**info, **{f"init_{k}": v for k, v in _INIT_INFO.get(run.id, {}).items()}}


def finish_wandb(run: Any | None, exit_code: int, preempted: bool = False) -> None:
    """Close the run whatever happened; a W&B failure here must not mask the job's own outcome.
    A preempted run is marked preempting (W&B shows it as such until the relaunch resumes it)."""
    if run is None:
        return
    try:
        if preempted:
            run.mark_preempting()
        run.finish(exit_code=exit_code)
    except Exception as err:  # noqa: BLE001
        log.warning("W&B finish failed (%s: %s); the CSV log and summary.json are complete.",
                    type(err).__name__, err)
        try:  # a dead service: drop it now, so that its exit hook does not fail again at interpreter exit
            import wandb

            wandb.teardown()
        except Exception as again:  # noqa: BLE001 - best effort
            log.debug("W&B teardown failed too: %s", again)


def guarded(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a W&B function; on failure warn and return None."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - W&B trouble must not kill a run
        log.warning("W&B %s failed (%s: %s); training goes on, the CSV log and summary.json are complete.",
                    what, type(err).__name__, str(err)[:200])
        return None


class SafeWandbLogger(WandbLogger):
    """Lightning's WandbLogger around the run `init_wandb` created, whose calls cannot raise: after the first
    failure (service gone) it goes quiet.

    Instantiated from `logger.wandb`: `run_settings` are that node's other keys (project, mode, group, ...),
    already used by `init_wandb` to create `experiment`; the logger itself never starts a run."""

    _broken = False

    def __init__(self, experiment: Any, log_model: bool | str = False, **run_settings: Any):
        super().__init__(experiment=experiment, log_model=log_model)

    def _safe(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        if self._broken:
            return
        try:
            fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            self._broken = True
            log.warning("W&B stopped working during %s (%s: %s); continuing without it, the CSV log and "
                        "summary.json keep everything.", what, type(err).__name__, str(err)[:200])

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self._safe("log_metrics", super().log_metrics, metrics, step)

    def log_hyperparams(self, params: Any) -> None:
        self._safe("log_hyperparams", super().log_hyperparams, params)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._safe("after_save_checkpoint", super().after_save_checkpoint, checkpoint_callback)

    def finalize(self, status: str) -> None:
        self._safe("finalize", super().finalize, status)


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSVLogger, one `metrics.csv` per run folder across resumes: with `resume_step=g` (the
    checkpoint's step) the rows logged before step g are kept and later ones (trained again) replaced.

    Lightning's own writer deletes an existing metrics.csv (a resumed run would keep only the steps after
    its checkpoint), and its other answer, a new `version_N` folder per launch, splits one run's history.
    Rows reach the file as they are logged (Lightning saves after each log call), so a killed run loses none
    that its checkpoint covers. A fresh run (`resume_step=None`) starts a new file, as Lightning does."""

    def __init__(self, save_dir: str, name: str = "csv", version: str = "", resume_step: int | None = None,
                 **kwargs: Any):
        super().__init__(save_dir, name=name, version=version, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumedWriter(self.log_dir, self.resume_step)
        return self._experiment


class _ResumedWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_before: int | None):
        self.keep_before = keep_before
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if self.keep_before is None or not self._fs.isfile(self.metrics_file_path):
            return super()._check_log_dir_exists()
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)
            rows = [r for r in reader if r.get("step") and int(float(r["step"])) < self.keep_before]
            header = list(reader.fieldnames or [])
        tmp = f"{self.metrics_file_path}.tmp"  # renamed over: a kill here leaves the old file whole
        with self._fs.open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self._fs.mv(tmp, self.metrics_file_path)
        self.metrics_keys = header  # new columns are added to these; none is dropped


def _new_run_id() -> str:
    """8 lowercase alphanumerics, like W&B's own ids (chosen here so a resumed job can reuse it)."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def single_lightning_log_handler() -> None:
    """`import lightning` adds its own console handler; under Hydra the root logger already prints (and
    writes the job's log file), so every Lightning message would appear twice."""
    lightning_logger = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)


def log_run_start(run: Any | None, summary: dict, model: Any, datamodule: Any, train_length: int,
                  output_dir: Path) -> None:
    """What W&B learns before the first step: the data fingerprint, the model's size, PE diagnostics."""
    if run is None:
        return
    guarded("config update", run.config.update,
            {"data_fingerprint": datamodule.fingerprint, "model_info": summary["model"]}, allow_val_change=True)
    guarded("PE diagnostics", log_pe_diagnostics, run, model, train_length, output_dir)


def log_pe_diagnostics(run: Any, model: Any, train_length: int, output_dir: Path) -> None:
    """Parameter count, neighbour similarity and the position-table heatmap, logged once at start."""
    import wandb

    from pelab.encodings.diagnostics import encoding_report

    report = encoding_report(model.pe, n_positions=train_length, figures=True)
    figs = report.pop("figures", {})
    scalars = {f"pe/{k}": v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    plot_dir = output_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    media = {}
    for key, fig in figs.items():
        path = plot_dir / f"pe_{key}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        media[f"pe/{key}"] = wandb.Image(str(path))
    run.summary.update(scalars)
    run.log({**scalars, **media})


def use_parent_checkpoint(run: Any, parent: dict) -> str:
    """extend.from: the parent's checkpoint as an input artifact of this run, named as Lightning names a run's
    checkpoints (`model-<parent W&B run id>`, logged with logger.wandb.log_model=true), so that W&B draws the
    lineage parent -> child. An online run declares it (`use_artifact`, a reference to the file: nothing is
    uploaded); W&B refuses that offline (wandb 0.31: "Cannot use artifact when in offline mode"), so an offline
    run only names it in its config (`extend.parent_artifact`). Returns the artifact's name."""
    import wandb

    path = Path(parent["path"]).resolve()
    name = f"model-{parent.get('wandb_run_id') or path.parent.parent.name}"
    run.config.update({"extend": {**dict(run.config.get("extend") or {}), "parent_artifact": f"{name}:latest"}},
                      allow_val_change=True)
    if run.settings.mode == "offline":
        return name
    artifact = wandb.Artifact(name, type="model", metadata={"step": parent.get("step"), "path": str(path),
                                                            "train_length": parent.get("train_length")})
    artifact.add_reference(path.as_uri(), checksum=False)
    run.use_artifact(artifact)
    return name
