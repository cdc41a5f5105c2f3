"""`python eval.py ckpt_path=...`: rebuild a checkpoint's model and data from its own training config,
apply the command line's pe.* / eval.* / probes.* overrides, and run the evaluation suite.

Context extension at evaluation, for encodings whose schema `supports_scaling`: their knobs as `pe.*`
overrides (e.g. RoPE's scaling type and factor) on a model trained without them, or `scaling_sweep=[...]`
for one table over the encoding's variants (`PEConfig.variant`: for RoPE no scaling vs PI vs NTK vs YaRN).
Runs inside `pelab.tasks.task.run_task` like training.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR
from pelab.encodings import pe_schema, pe_variant, resolve_pe_config
from pelab.errors import ConfigError
from pelab.model import GPTConfig, build_model
from pelab.tasks.task import Task, cli_main, resolved_config, run_task

log = logging.getLogger(__name__)

# Keys of the eval command line that replace the checkpoint's own settings: the encoding's knobs (checked by
# its schema), the evaluation's, and the model keys that do not change the weights.
OVERRIDABLE = ("pe.", "eval.", "probes.", *(f"model.{k}" for k in GPTConfig.RUNTIME_KEYS if k != "name"))
# Keys of eval.yaml itself; any other key (model.*, data.*, tokenizer.*, ...) comes from the checkpoint.
OWN_KEYS = ("ckpt_path", "scaling_sweep", "device", "tags", "notes", "name", "task", "logger", "paths", "hydra",
            "eval", "probes")


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint's training config and model weights, with a clear error for a bad file."""
    from pelab.harness.checkpoints import load_run_checkpoint

    return load_run_checkpoint(path, key="ckpt_path")


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
                f"(only {', '.join(k + '*' if k.endswith('.') else k for k in OVERRIDABLE)} can be "
                "overridden); evaluate a checkpoint trained with that setting."
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
        OmegaConf.update(merged, key, OmegaConf.to_container(value, resolve=True)
                         if OmegaConf.is_config(value) else value, force_add=True)
    merged.paths = cfg.paths  # this job's folders
    merged.datamodule = cfg.datamodule  # its interpolations now read the checkpoint's data and tokenizer
    try:  # the encoding's own schema checks the pe.* overrides (a knob this encoding lacks is named)
        resolve_pe_config(merged.pe, d_model=merged.model.d_model, n_heads=merged.model.n_heads,
                          train_length=int(merged.data.seq_len))
    except ConfigError as err:
        raise ConfigError(f"{err} (this checkpoint's encoding is pe={merged.pe.name}: eval.py sets only its own "
                          "knobs; drop the override)") from None
    return merged


def scaling_variants(merged: DictConfig, sweep: list[str] | None) -> list[str | None]:
    """[None] = evaluate the (possibly overridden) config as is; else one variant per name
    (`PEConfig.variant`: the encoding's own checks name a bad one)."""
    if not sweep:
        return [None]
    if not pe_schema(merged.pe).supports_scaling:
        raise ConfigError(f"scaling_sweep: this checkpoint's encoding (pe={merged.pe.name}) has no "
                          "context-extension variants; drop scaling_sweep.")
    for variant in sweep:
        try:
            resolve_pe_config(pe_variant(merged.pe, variant), d_model=merged.model.d_model,
                              n_heads=merged.model.n_heads, train_length=int(merged.data.seq_len))
        except ConfigError as err:
            raise ConfigError(f"scaling_sweep={list(sweep)}: {err}") from None
    return list(sweep)


def evaluate(cfg: DictConfig) -> dict:
    """One evaluation job; returns its summary (also written to `<output_dir>/summary.json`)."""
    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.ckpt_path in (None, ""):
        raise ConfigError("ckpt_path is required: python eval.py ckpt_path=outputs/runs/<...>/checkpoints/last.ckpt")
    from pelab.harness.signals import preemption_signals

    # SIGTERM / Ctrl-C stop at once (status preempted / interrupted): an evaluation is simply rerun.
    with run_task(Path(cfg.paths.output_dir), task="eval", signals=preemption_signals(),
                  hint="Rerun the same command to evaluate again.", ckpt_path=str(cfg.ckpt_path)) as task:
        task.record_diff()
        task.record_machine()
        ckpt = load_checkpoint(cfg.ckpt_path)
        merged = merged_config(ckpt["hyper_parameters"]["cfg"], cfg, overridden_keys(cfg))
        variants = scaling_variants(merged, list(cfg.scaling_sweep) if cfg.get("scaling_sweep") else None)
        task.summary.update(name=f"{merged.name}-{cfg.name}", config=resolved_config(merged),
                            global_step=ckpt.get("global_step"))
        task.save()
        wcfg = (resolved_config(cfg.logger) if cfg.get("logger") else {}).get("wandb")
        task.start_wandb(wcfg and {**wcfg, "job_type": "eval"}, name=task.summary["name"],
                         config=task.summary["config"], group=merged.name, tags=list(cfg.get("tags") or []),
                         notes=cfg.get("notes"))
        task.summary["metrics"] = evaluate_variants(cfg, merged, ckpt, variants, task)
    return task.summary


def evaluate_variants(cfg: DictConfig, merged: DictConfig, ckpt: dict, variants: list[str | None],
                      task: Task) -> dict[str, float]:
    """Build the data once, then run the evaluation suite on the checkpoint's model under each variant."""
    from pelab.evaluation.suite import run_evaluation
    from pelab.harness.build import build_datamodule

    vocab_size = int(ckpt["hyper_parameters"]["vocab_size"])
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if cfg.device == "auto" else cfg.device))
    datamodule = build_datamodule(merged, int(merged.data.batch_size))
    datamodule.setup("validate")
    if datamodule.vocab_size != vocab_size:
        raise ConfigError(
            f"the checkpoint's vocabulary has {vocab_size} ids but its tokenizer now gives "
            f"{datamodule.vocab_size}; the token cache or tokenizer settings changed since training."
        )
    metrics: dict[str, float] = {}
    rows = []
    for variant in variants:
        vcfg = merged.copy()
        if variant is not None:
            vcfg.pe = pe_variant(merged.pe, variant)
        model = load_model(vcfg, ckpt, vocab_size).to(device)
        metrics.update(run_evaluation(model, datamodule, vcfg, task.output_dir, task.run, task.summary,
                                      prefix=variant or ""))
        task.summary["metrics"] = metrics  # each variant's numbers on disk as soon as they exist
        task.save()
        if variant is not None:
            res = task.summary[f"evaluation/{variant}"]["extrapolation"]
            rows += [{"scaling": variant, **r} for r in res["rows"]]
    if rows:
        task.summary["scaling_table"] = rows
        log_scaling_table(task.run, rows)
    return metrics


def load_model(cfg: DictConfig, ckpt: dict, vocab_size: int) -> torch.nn.Module:
    """Build the model of `cfg` (its pe settings may differ from training) and load the trained weights."""
    from pelab.harness.checkpoints import model_state

    model = build_model(cfg.model, cfg.pe, vocab_size, int(cfg.data.seq_len))
    try:
        model.load_state_dict(model_state(ckpt))
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
    cli_main(evaluate, cfg)


if __name__ == "__main__":
    main()
