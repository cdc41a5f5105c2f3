"""`python train.py [overrides]`: compose -> validate -> data -> model -> fit -> evaluate -> summary.

Every outcome ends the same way: `summary.json` written (status ok / failed / preempted) and the W&B run
finished, so the jobs of a multirun never share or merge a run, and a failed job is visible.

Exit codes of `python train.py`: 0 finished; 1 failed (a deliberate error is printed as one line
`Error: <cause and the setting to change>`, anything else with its traceback); 75 preempted (SIGTERM /
SIGUSR1: `checkpoints/last.ckpt` saved; relaunch the same command with `ckpt_path=auto` to continue).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from pelab.errors import ConfigError
from pelab.summary import command_line, versions, write_summary
from pelab.tasks import CONF_DIR

log = logging.getLogger("pelab.tasks.train")

# sysexits.h EX_TEMPFAIL: "temporary failure, retry" (same value as pelab.harness.reliability).
PREEMPTED_EXIT_CODE = 75


# -- configuration ---------------------------------------------------------------------------------
def validate_config(cfg: DictConfig) -> None:
    """Every setting typed and range-checked before any data is built or any step is taken: the groups by
    pelab.schema, `pe` by its encoding's own schema. A bad one is a ConfigError naming the key."""
    from pelab.encodings import resolve_pe_config
    from pelab.schema import validate

    typed = validate(cfg)
    m = typed["model"]
    resolve_pe_config(cfg.pe, d_model=m.d_model, n_heads=m.n_heads, train_length=typed["data"].seq_len)


def resolve_trainer_cfg(tcfg: DictConfig) -> dict:
    """`precision: auto` -> bf16-mixed on GPU, fp32 on CPU (bf16 matmul is ~200x slower on CPU)."""
    t = OmegaConf.to_container(tcfg, resolve=True)
    if t.get("precision") == "auto":
        gpu = torch.cuda.is_available() and t.get("accelerator") in ("auto", "gpu", "cuda")
        t["precision"] = "bf16-mixed" if gpu else "32-true"
    return t


def world_size_of(tcfg: dict) -> int:
    devices = tcfg.get("devices", 1)
    if devices in (-1, "auto", "-1"):
        devices = max(1, torch.cuda.device_count()) if tcfg.get("accelerator") != "cpu" else 1
    n = len(devices) if isinstance(devices, (list, tuple)) else int(devices)
    return n * int(tcfg.get("num_nodes", 1))


def sweep_group() -> str | None:
    """All jobs of one multirun share a W&B group: the sweep folder (date/time)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep_dir = Path(hc.sweep.dir)
    return f"sweep-{sweep_dir.parent.name}-{sweep_dir.name}"


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> str | None:
    """null: fresh run; "auto": this run folder's newest checkpoint (last.ckpt, or a SLURM requeue
    checkpoint) if there is one, else a fresh run; or a path."""
    from pelab.harness.reliability import newest_checkpoint

    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "auto":
        newest = newest_checkpoint(output_dir)
        return str(newest) if newest else None
    if not Path(ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={ckpt_path} does not exist; pass a .ckpt file, 'auto' or null.")
    return ckpt_path


# -- components ------------------------------------------------------------------------------------
def build_datamodule(cfg: DictConfig, per_rank_batch: int):
    from pelab.data.datamodule import LMDataModule

    emulate = int((cfg.get("debug") or {}).get("emulate_world_size") or 1)
    if emulate > 1:  # one process, the rows of `emulate` ranks per step (see pelab.harness.reliability)
        from pelab.harness.reliability import EmulatedWorldDataModule

        datamodule = EmulatedWorldDataModule.from_config(cfg, batch_size=per_rank_batch // emulate)
        datamodule.world = emulate
        return datamodule
    return LMDataModule.from_config(cfg, batch_size=per_rank_batch)


def launcher_rank() -> int:
    """This process's global rank when a launcher started one process per device (torchrun: RANK; srun
    with several tasks: SLURM_PROCID); 0 for `python train.py` (ddp_spawn starts its ranks inside fit).
    Only rank 0 creates the W&B run and writes summary.json."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return int(os.environ.get("SLURM_PROCID", "0"))
    return 0


def resolved_config(cfg: DictConfig) -> dict:
    """The config as plain data; a required value left unset (`???`) is a one-line error naming it."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except MissingMandatoryValue as err:
        key = getattr(err, "full_key", None) or str(err).splitlines()[0]
        raise ConfigError(f"{key} has no value and this config needs one; set it on the command line "
                          f"({key}=...).") from err


def train(cfg: DictConfig) -> dict:
    """One training job. Returns its summary (also written to `<output_dir>/summary.json`)."""
    import lightning.pytorch as L

    from pelab.harness.callbacks import build_callbacks
    from pelab.harness.loggers import build_loggers, finish_wandb, guarded, init_info, init_wandb
    from pelab.harness.module import LMModule
    from pelab.harness.reliability import (
        AtomicCheckpointIO,
        CheckpointError,
        JobSignals,
        Preempted,
        PreemptionCheckpoint,
        check_resume_checkpoint,
        preemption_signals,
    )

    single_lightning_log_handler()
    t_start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rank = launcher_rank()
    summary: dict[str, Any] = {
        "status": "running",
        "name": cfg.name,
        "output_dir": str(output_dir),
        "command": command_line(),
        "versions": versions(),
    }
    run = None
    signals = preemption_signals()
    try:
        with JobSignals(signals):
            summary["config"] = resolved_config(cfg)
            lcfg = OmegaConf.to_container(cfg.logger, resolve=True) or {}
            if lcfg.get("wandb") and rank == 0:
                run = init_wandb(
                    lcfg["wandb"],
                    name=cfg.name,
                    output_dir=output_dir,
                    config=summary["config"],
                    group=lcfg["wandb"].get("group") or sweep_group(),
                    tags=list(cfg.get("tags") or []),
                    notes=cfg.get("notes"),
                )
                summary["wandb"] = init_info(run) if run else None

            # Validation after the W&B run exists, so that a bad job of a sweep shows up there as failed.
            validate_config(cfg)
            tcfg = resolve_trainer_cfg(cfg.trainer)
            world = world_size_of(tcfg)
            if int(cfg.data.batch_size) % world:
                raise ConfigError(
                    f"data.batch_size={cfg.data.batch_size} (global) is not divisible by the {world} devices; "
                    "change data.batch_size or trainer.devices."
                )
            if world > 1 and (cfg.get("debug") or {}).get("emulate_world_size"):
                raise ConfigError("debug.emulate_world_size emulates several ranks in one process; "
                                  "use it with one device (trainer=cpu) or drop it.")
            ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), output_dir)
            ckpt_vocab = None
            if ckpt_path:  # refuse another model's / tokenizer's checkpoint before any data is built
                step, ckpt_vocab = check_resume_checkpoint(ckpt_path, summary["config"])
                summary["resumed_from"] = {"ckpt_path": ckpt_path, "step": step}
                log.info("resuming from %s (step %d)", ckpt_path, step)
            L.seed_everything(int(cfg.seed), workers=True, verbose=False)

            datamodule = build_datamodule(cfg, int(cfg.data.batch_size) // world)
            datamodule.prepare_data()
            datamodule.setup("fit")
            summary["data"] = {
                "fingerprint": datamodule.fingerprint,
                "vocab_size": datamodule.vocab_size,
                "bytes_per_token": datamodule.bytes_per_token,
            }
            if ckpt_vocab is not None and int(ckpt_vocab) != datamodule.vocab_size:
                raise CheckpointError(
                    f"ckpt_path={ckpt_path} has a vocabulary of {ckpt_vocab} ids but this run's tokenizer gives "
                    f"{datamodule.vocab_size}; resume with the checkpoint's tokenizer.* and data.* settings."
                )
            module = LMModule(summary["config"], vocab_size=datamodule.vocab_size)
            summary["model"] = {
                "params": module.model.num_params(exclude_embedding=False),
                "params_non_embedding": module.model.num_params(exclude_embedding=True),
                "pe_params": module.model.pe.num_learnable_params(),
                "flops_per_token": module.flops_per_token,
            }
            if run is not None:
                guarded("config update", run.config.update,
                        {"data_fingerprint": datamodule.fingerprint, "model_info": summary["model"]},
                        allow_val_change=True)
                guarded("PE diagnostics", log_pe_diagnostics, run, module.model, int(cfg.data.seq_len), output_dir)

            callbacks = build_callbacks(OmegaConf.to_container(cfg.callbacks, resolve=True), output_dir,
                                        cfg.optimized_metric)
            preemption = PreemptionCheckpoint(output_dir / "checkpoints" / "last.ckpt", signals)
            callbacks.append(preemption)
            trainer = L.Trainer(
                **{k: v for k, v in tcfg.items() if k != "_target_"},
                logger=build_loggers(lcfg, run, output_dir) or False,
                callbacks=callbacks,
                plugins=[AtomicCheckpointIO()],
                default_root_dir=str(output_dir),
                enable_progress_bar=bool(cfg.callbacks.get("progress_bar", True)),
            )
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
            if preemption.received is not None:  # signalled during the final validation: last.ckpt is final
                raise Preempted(preemption.received, step=trainer.global_step, ckpt=preemption.ckpt_path)
            summary["start_step"] = module.start_step
            summary["global_step"] = final_step(trainer, output_dir)
            summary["nonfinite_skips"] = module.nonfinite_skips
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "train/"))}

            if cfg.get("evaluate_after_fit", True) and trainer.is_global_zero:
                from pelab.evaluation.suite import run_evaluation

                metrics.update(run_evaluation(module.model, datamodule, cfg, output_dir, run, summary))
            summary["metrics"] = metrics
            summary["status"] = "ok"
            return summary
    except Preempted as err:
        # A clean stop: the checkpoint holds everything trained; the caller exits with PREEMPTED_EXIT_CODE.
        summary["status"] = "preempted"
        summary["preempted"] = {"signal": err.signum, "step": err.step, "ckpt_path": err.ckpt}
        log.warning("Preempted: %s", err)
        return summary
    except BaseException as err:
        summary["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        summary["error"] = f"{type(err).__name__}: {err}"
        summary["traceback"] = traceback.format_exc()
        raise
    finally:
        summary["wall_seconds"] = round(time.time() - t_start, 2)
        if rank == 0:
            write_summary(output_dir, summary)
        status = summary["status"]
        finish_wandb(run, exit_code={"ok": 0, "preempted": PREEMPTED_EXIT_CODE}.get(status, 1),
                     preempted=status == "preempted")


def single_lightning_log_handler() -> None:
    """`import lightning` adds its own console handler; under Hydra the root logger already prints (and
    writes the job's log file), so every Lightning message would appear twice."""
    lightning_logger = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)


def final_step(trainer: Any, output_dir: Path) -> int:
    """The step training ended at. Under ddp_spawn the loop ran in child processes and this process's
    trainer still says 0, so the step comes from the checkpoint the ranks wrote."""
    if trainer.global_step > 0:
        return int(trainer.global_step)
    last = output_dir / "checkpoints" / "last.ckpt"
    if last.exists():
        return int(torch.load(last, map_location="cpu", weights_only=False).get("global_step", 0))
    return 0


def log_pe_diagnostics(run: Any, model: Any, seq_len: int, output_dir: Path) -> None:
    """Parameter count, neighbour similarity and the position-table heatmap, logged once at start."""
    import wandb

    from pelab.encodings.diagnostics import encoding_report

    report = encoding_report(model.pe, n_positions=seq_len, figures=True)
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


def objective(summary: dict, metric: str) -> float:
    """Value returned to sweepers; a failed or missing metric is +inf (never a crash of the sweep)."""
    value = (summary.get("metrics") or {}).get(metric)
    return float(value) if value is not None and math.isfinite(float(value)) else float("inf")


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def report_user_error(err: BaseException) -> None:
    """A deliberate error: print `Error: <message>` (one line) and exit 1; in a multirun re-raise instead,
    so that Hydra marks this job failed and runs the others. Other exceptions keep their traceback."""
    from pelab.harness.reliability import is_user_error

    if not is_user_error(err):
        raise err
    line = " ".join(str(err).split())
    if in_multirun():
        log.error("Error: %s", line)
        raise err
    print(f"Error: {line}", file=sys.stderr, flush=True)
    sys.exit(1)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    try:
        summary = train(cfg)
    except Exception as err:  # sorted into one-line user errors and real crashes
        report_user_error(err)
        raise
    if summary["status"] == "preempted":
        sys.exit(PREEMPTED_EXIT_CODE)
    return objective(summary, cfg.optimized_metric)


if __name__ == "__main__":
    main()
