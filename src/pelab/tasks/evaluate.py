"""`python eval.py ckpt_path=...`: rebuild a checkpoint's model and data from its own training config,
apply the command line's pe.* / eval.* / probes.* overrides, and run the evaluation suite.

RoPE context extension at evaluation: `pe.scaling.type=yarn pe.scaling.factor=4` on a model trained
without scaling (rotary frequencies are not part of the state dict), or `scaling_sweep=[...]` for the
"no scaling vs PI vs NTK vs YaRN" comparison as one table.
"""

from __future__ import annotations

import copy
import logging
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from pelab.errors import ConfigError
from pelab.model import build_model
from pelab.summary import command_line, versions, write_summary
from pelab.tasks import CONF_DIR
from pelab.tasks.train import build_datamodule, report_user_error, sweep_group

log = logging.getLogger("pelab.tasks.evaluate")

# Keys of the eval command line that replace the checkpoint's own settings.
OVERRIDABLE = ("pe.", "eval.", "probes.")
# Keys of eval.yaml itself; any other key (model.*, data.*, tokenizer.*, ...) comes from the checkpoint.
OWN_KEYS = ("ckpt_path", "scaling_sweep", "device", "tags", "notes", "name", "task", "logger", "paths", "hydra",
            "eval", "probes")
SCALING_TYPES = ("none", "linear", "ntk", "dynamic_ntk", "yarn")


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint's training config and model weights, with a clear error for a bad file."""
    from pelab.harness.reliability import read_checkpoint

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ckpt_path={path} does not exist; pass a .ckpt from a run's checkpoints/ folder.")
    ckpt = read_checkpoint(path)  # a truncated / corrupted file -> CheckpointError naming ckpt_path
    hp = ckpt.get("hyper_parameters") or {}
    if "cfg" not in hp or "state_dict" not in ckpt:
        raise ConfigError(f"ckpt_path={path} was not written by pelab's train.py (no training config inside).")
    return ckpt


def overridden_keys(cfg: DictConfig) -> list[str]:
    """Dotted keys the user set on this eval command line (from Hydra's record of the overrides)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return list(cfg.get("_overrides_", []) or [])
    keys = []
    for ov in HydraConfig.get().overrides.task:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key.startswith(OVERRIDABLE) or key == "pe":
            keys.append(key)
        elif key.split(".")[0].split("@")[0] not in OWN_KEYS:
            raise ConfigError(
                f"{key} cannot be changed by eval.py: the model, data and tokenizer come from the checkpoint "
                "(only pe.*, eval.*, probes.* can be overridden); evaluate a checkpoint trained with that setting."
            )
    return keys


def merged_config(train_cfg: dict, cfg: DictConfig, keys: list[str]) -> DictConfig:
    """The checkpoint's config with the eval command line's values for `keys` (Hydra already parsed them)."""
    merged = OmegaConf.create(copy.deepcopy(train_cfg))
    for key in keys:
        if key == "pe":  # a group choice: only the checkpoint's own encoding can run its weights
            if cfg.pe.name != merged.pe.name:
                raise ConfigError(
                    f"pe={cfg.pe.name} does not fit this checkpoint, trained with pe={merged.pe.name}; eval.py "
                    f"evaluates the checkpoint's encoding (change its knobs with pe.*), or pass a pe={cfg.pe.name} "
                    "checkpoint."
                )
            continue
        value = OmegaConf.select(cfg, key)
        if key.startswith("pe.scaling") and "scaling" not in merged.pe:
            raise ConfigError(
                f"{key} applies to the RoPE family (rope, xpos) only; this checkpoint was trained with "
                f"pe={merged.pe.name}. "
                "Drop the pe.scaling overrides."
            )
        OmegaConf.update(merged, key, OmegaConf.to_container(value, resolve=True)
                         if OmegaConf.is_config(value) else value, force_add=True)
    merged.paths = cfg.paths
    return merged


def scaling_variants(merged: DictConfig, sweep: list[str] | None) -> list[str | None]:
    """[None] = evaluate the (possibly overridden) config as is; else one variant per scaling type."""
    if not sweep:
        return [None]
    if "scaling" not in merged.pe:
        raise ConfigError(
            f"scaling_sweep applies to the RoPE family (rope, xpos) only; this checkpoint uses pe={merged.pe.name}."
        )
    unknown = [s for s in sweep if s not in SCALING_TYPES]
    if unknown:
        raise ConfigError(f"scaling_sweep has unknown types {unknown}; known: {list(SCALING_TYPES)}.")
    if float(merged.pe.scaling.factor) == 1.0:
        log.warning("pe.scaling.factor=1: every scaling type equals no scaling; pass pe.scaling.factor=4, say.")
    return list(sweep)


def evaluate(cfg: DictConfig) -> dict:
    """One evaluation job; returns its summary (also written to `<output_dir>/summary.json`)."""
    from pelab.evaluation.suite import run_evaluation
    from pelab.harness.loggers import finish_wandb, init_wandb

    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.ckpt_path in (None, ""):
        raise ConfigError("ckpt_path is required: python eval.py ckpt_path=outputs/runs/<...>/checkpoints/last.ckpt")
    t0 = time.time()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"status": "running", "task": "eval", "ckpt_path": str(cfg.ckpt_path),
                               "output_dir": str(output_dir), "command": command_line(), "versions": versions()}
    run = None
    try:
        ckpt = load_checkpoint(cfg.ckpt_path)
        hp = ckpt["hyper_parameters"]
        merged = merged_config(hp["cfg"], cfg, overridden_keys(cfg))
        variants = scaling_variants(merged, list(cfg.scaling_sweep) if cfg.get("scaling_sweep") else None)
        summary.update(name=f"{merged.name}-eval", config=OmegaConf.to_container(merged, resolve=True),
                       global_step=ckpt.get("global_step"))

        lcfg = OmegaConf.to_container(cfg.logger, resolve=True) or {}
        if lcfg.get("wandb"):
            wcfg = {**lcfg["wandb"], "job_type": "eval"}
            run = init_wandb(wcfg, name=summary["name"], output_dir=output_dir, config=summary["config"],
                             group=wcfg.get("group") or sweep_group() or merged.name,
                             tags=list(cfg.get("tags") or []), notes=cfg.get("notes"))

        device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available()
                              else ("cpu" if cfg.device == "auto" else cfg.device))
        datamodule = build_datamodule(merged, int(merged.data.batch_size))
        datamodule.setup("validate")
        if datamodule.vocab_size != int(hp["vocab_size"]):
            raise ConfigError(
                f"the checkpoint's vocabulary has {hp['vocab_size']} ids but its tokenizer now gives "
                f"{datamodule.vocab_size}; the token cache or tokenizer settings changed since training."
            )
        metrics: dict[str, float] = {}
        rows = []
        for variant in variants:
            vcfg = merged.copy()
            if variant is not None:
                vcfg.pe.scaling.type = variant
            model = load_model(vcfg, ckpt, hp["vocab_size"]).to(device)
            m = run_evaluation(model, datamodule, vcfg, output_dir, run, summary, prefix=variant or "")
            metrics.update(m)
            if variant is not None:
                res = summary[f"evaluation/{variant}"]["extrapolation"]
                rows += [{"scaling": variant, **r} for r in res["rows"]]
        if rows:
            summary["scaling_table"] = rows
            log_scaling_table(run, rows)
        summary["metrics"] = metrics
        summary["status"] = "ok"
        return summary
    except BaseException as err:
        summary["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        summary["error"] = f"{type(err).__name__}: {err}"
        summary["traceback"] = traceback.format_exc()
        raise
    finally:
        summary["wall_seconds"] = round(time.time() - t0, 2)
        write_summary(output_dir, summary)
        finish_wandb(run, exit_code=0 if summary["status"] == "ok" else 1)


def load_model(cfg: DictConfig, ckpt: dict, vocab_size: int) -> torch.nn.Module:
    """Build the model of `cfg` (its pe settings may differ from training) and load the trained weights."""
    model = build_model(cfg.model, cfg.pe, vocab_size, int(cfg.data.seq_len))
    state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ConfigError(f"the checkpoint's weights do not fit model={cfg.model.get('name')} / "
                          f"pe={cfg.pe.name}: {str(err).splitlines()[0]}") from err
    return model.eval()


def log_scaling_table(run: Any | None, rows: list[dict]) -> None:
    if run is None:
        return
    import wandb

    cols = ["scaling", "length", "protocol", "ppl", "bpb", "note"]
    data = [[r.get(c) if not isinstance(r.get(c), str) or c in ("scaling", "protocol", "note")
             else float(r[c]) for c in cols] for r in rows]
    run.log({"extrap/scaling_table": wandb.Table(columns=cols, data=data)})


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def main(cfg: DictConfig) -> None:
    try:
        evaluate(cfg)
    except Exception as err:  # deliberate errors become one line (pelab.tasks.train.report_user_error)
        report_user_error(err)
        raise


if __name__ == "__main__":
    main()
