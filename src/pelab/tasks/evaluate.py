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
from dataclasses import fields
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR
from pelab.checks import need, resolved_value, typed_group
from pelab.conf_values import group_yaml, with_data_target, with_file_values
from pelab.data.config import LoaderConfig
from pelab.encodings import pe_schema, pe_variant, resolve_pe_config
from pelab.errors import ConfigError
from pelab.evaluation.config import EvalConfig, ProbesConfig, typed_evaluation
from pelab.model import GPTConfig, build_model
from pelab.tasks.task import Task, cli_main, resolved_config, run_task
from pelab.training.config import wandb_entry

log = logging.getLogger(__name__)

# Keys of the eval command line that replace the checkpoint's own settings: the encoding's knobs (checked by
# its schema), the evaluation's, and the model keys that do not change the weights.
OVERRIDABLE = ("pe.", "eval.", "probes.", *(f"model.{k}" for k in GPTConfig.RUNTIME_KEYS if k != "name"))
# Keys of eval.yaml itself; any other key (model.*, data.*, tokenizer.*, ...) comes from the checkpoint.
OWN_KEYS = ("ckpt_path", "scaling_sweep", "device", "tags", "notes", "name", "task", "logger", "paths", "hydra",
            "eval", "probes")


# -- the validation pass: the command line before torch, the checkpoint's config before any data ----------------
def check_command(cfg: DictConfig) -> list[str]:
    """The eval command line, checked before torch is imported or the checkpoint is read (a bad input is refused in
    about a second, as train.py's): the checkpoint file there and not cut short, only keys eval.py may change
    (returned: `overridden_keys`), the `eval.*` / `probes.*` values typed, `device` and `scaling_sweep`. The
    ranges that depend on the checkpoint's training length are checked once it is read (`checkpoint_settings`)."""
    from pelab.runs.folder import check_checkpoint_file

    path = Path(str(cfg.ckpt_path))
    need(path.is_file(), "ckpt_path", str(path), "does not exist; pass a .ckpt file (a run's checkpoints/last.ckpt) "
         "or a run folder.")
    check_checkpoint_file(path)
    keys = overridden_keys(cfg)
    typed_group(EvalConfig, resolved_value(cfg, "eval"), "eval")
    # probes.key_len / value_len / pairs follow data.* (the checkpoint's, unknown yet): today's loader values stand in
    view = OmegaConf.create({"data": group_yaml("data", "_loader"),
                             "probes": OmegaConf.to_container(cfg.probes, resolve=False)})
    typed_group(ProbesConfig, resolved_value(view, "probes"), "probes")
    device = str(cfg.device)
    need(device in ("auto", "cpu", "cuda") or device.startswith("cuda:"), "device", device,
         "must be auto (cuda if available, else cpu), cpu, cuda or cuda:<index>.")
    sweep = cfg.scaling_sweep
    need(sweep is None or (OmegaConf.is_list(sweep) and all(isinstance(v, str) for v in sweep)), "scaling_sweep",
         sweep, "must be null or a list of variant names, e.g. [none,linear,ntk,yarn].")
    return keys


def checkpoint_of(ckpt_path: str) -> str:
    """`ckpt_path` as a file: a run folder stands for its newest checkpoint, as for train.py
    (`pelab.runs.folder.newest_checkpoint`); anything else is checked as a file by `check_command`."""
    from pelab.runs.folder import newest_checkpoint

    if not Path(ckpt_path).is_dir():
        return ckpt_path
    newest = newest_checkpoint(Path(ckpt_path))
    need(newest is not None, "ckpt_path", ckpt_path, "is a folder without checkpoints (checkpoints/last.ckpt); pass "
         "a .ckpt file or a run folder that has one.")
    return str(newest)


def checkpoint_settings(train_cfg: dict, cfg: DictConfig, keys: list[str]
                        ) -> tuple[DictConfig, tuple[EvalConfig, ProbesConfig], list[str | None]]:
    """The checkpoint's training config in today's form with the command line's values for `keys` (`merged_config`),
    its `eval` / `probes` typed and range-checked at its training length, and the variants to evaluate: every
    check that needs the checkpoint's config, before any data or model is built."""
    merged = merged_config(todays_form(train_cfg), cfg, keys)
    typed = typed_evaluation(merged)
    return merged, typed, scaling_variants(merged, list(cfg.scaling_sweep) if cfg.scaling_sweep else None)


# A checkpoint's training config is what its run composed then: one written before a key existed lacks it, and a key
# since removed (eval.every_n_val) may still be there. The groups eval.py reads from it -- `eval`, `probes` and the
# data loader keys the probes follow -- are brought to today's form here, in one place: each key of the group's
# schema takes the checkpoint's value or, where it has none, the value of the file the group composes today.
TODAYS_FILES = {"eval": (EvalConfig, "default"), "probes": (ProbesConfig, "default"), "data": (LoaderConfig, "_loader")}
OPEN_GROUPS = ("data",)  # its other keys are the corpus's (and its DataModule's `_target_`): kept


def todays_form(train_cfg: dict) -> dict:
    """`train_cfg` (a checkpoint's training config, plain data) with its `eval`, `probes` and data loader keys in
    today's form (see TODAYS_FILES) and its DataModule named by `data._target_`, as a config recorded with a
    `datamodule` group of its own gets it (`pelab.conf_values.with_data_target`: eval.py, pelab.lm_eval and
    pelab.export build the checkpoint's own DataModule); a config written now is returned as it is."""
    out = copy.deepcopy(with_data_target(train_cfg))
    for group, (schema, option) in TODAYS_FILES.items():
        filled = with_file_values(out.get(group) or {}, group, option)
        known = {f.name for f in fields(schema)}
        out[group] = {k: v for k, v in filled.items() if k in known or group in OPEN_GROUPS}
    return out


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint's training config and model weights, with a clear error for a bad file."""
    from pelab.training.checkpoints import load_run_checkpoint

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
    from pelab.signals import preemption_signals
    from pelab.tasks.preflight import check_not_a_training_run

    out = Path(cfg.paths.output_dir)
    check_not_a_training_run(out, "paths.output_dir")  # also when Hydra's callback did not run
    cfg.ckpt_path = checkpoint_of(str(cfg.ckpt_path))
    from pelab.runs.folder import claim

    # SIGTERM / Ctrl-C stop at once (status preempted / interrupted): an evaluation is simply rerun. Its folder is
    # held as a training run's is: a second launch into it is refused, and `report progress` sees it running.
    with claim(out), run_task(
            out, task="eval", signals=preemption_signals(),
            hint="Rerun the same command to evaluate again.", ckpt_path=str(cfg.ckpt_path)) as task:
        keys = check_command(cfg)  # before torch, Lightning or W&B is imported
        task.record_diff()
        task.record_machine()
        ckpt = load_checkpoint(cfg.ckpt_path)
        merged, typed, variants = checkpoint_settings(ckpt["hyper_parameters"]["cfg"], cfg, keys)
        task.summary.update(name=f"{merged.name}-{cfg.name}", config=resolved_config(merged),
                            global_step=ckpt.get("global_step"))
        task.save()
        datamodule = checked_data(merged, typed[0], int(ckpt["hyper_parameters"]["vocab_size"]))  # before W&B
        from pelab.runs.build import data_record  # torch is loaded by now (the data)

        # the corpus + tokenizer fingerprint, as a training run records it: a report pairs this evaluation with the
        # checkpoint's own runs (the training-free rows of a context-extension study) only on the same text
        task.summary["data"] = data_record(datamodule)
        wcfg = wandb_entry(cfg)
        task.start_wandb(wcfg and {**wcfg, "job_type": "eval"}, name=task.summary["name"],
                         config=task.summary["config"], group=merged.name, tags=list(cfg.tags), notes=cfg.notes)
        task.summary["metrics"] = evaluate_variants(cfg, merged, typed, ckpt, variants, task, datamodule)
    return task.summary


def checked_data(merged: DictConfig, ev: EvalConfig, vocab_size: int) -> Any:
    """The checkpoint's data, and the checks that need it (its vocabulary, the evaluation lengths against the
    split): before W&B starts, so that a setting they refuse never waits for a W&B server."""
    from pelab.evaluation.config import resolve_lengths
    from pelab.evaluation.suite import check_eval_budget
    from pelab.runs.build import build_datamodule

    datamodule = build_datamodule(merged, int(merged.data.batch_size))
    datamodule.setup("validate")
    if datamodule.vocab_size != vocab_size:
        raise ConfigError(
            f"the checkpoint's vocabulary has {vocab_size} ids but its tokenizer now gives "
            f"{datamodule.vocab_size}; the token cache or tokenizer settings changed since training."
        )
    length = int(merged.data.seq_len)
    check_eval_budget(str(ev.split), ev.tokens, max(resolve_lengths(list(ev.lengths), length) + [length]),
                      datamodule.n_tokens(str(ev.split)))
    return datamodule


def evaluate_variants(cfg: DictConfig, merged: DictConfig, typed: tuple[EvalConfig, ProbesConfig], ckpt: dict,
                      variants: list[str | None], task: Task, datamodule: Any) -> dict[str, float]:
    """Run the evaluation suite on the checkpoint's model under each variant, on the data built once."""
    import torch

    from pelab.evaluation.suite import run_evaluation

    vocab_size = int(ckpt["hyper_parameters"]["vocab_size"])
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if cfg.device == "auto" else cfg.device))
    metrics: dict[str, float] = {}
    rows = []
    for variant in variants:
        vcfg = merged.copy()
        if variant is not None:
            vcfg.pe = pe_variant(merged.pe, variant)
        model = load_model(vcfg, ckpt, vocab_size).to(device)
        metrics.update(run_evaluation(model, datamodule, vcfg, task.output_dir, task.run, task.summary,
                                      prefix=variant or "", typed=typed, progress_bar=True))
        task.summary["metrics"] = metrics  # each variant's numbers on disk as soon as they exist
        task.save()
        if variant is not None:
            res = task.summary[f"evaluation/{variant}"]["extrapolation"]
            rows += [{"scaling": variant, **r} for r in res["rows"]]
    if rows:
        task.summary["scaling_table"] = rows
        log_scaling_table(task.run, rows)
    return metrics


def load_model(cfg: DictConfig, ckpt: dict, vocab_size: int) -> Any:
    """Build the model of `cfg` (its pe settings may differ from training) and load the trained weights."""
    from pelab.training.checkpoints import model_state

    model = build_model(cfg.model, cfg.pe, vocab_size, int(cfg.data.seq_len))
    try:
        model.load_state_dict(model_state(ckpt))
    except RuntimeError as err:
        raise ConfigError(f"the checkpoint's weights do not fit model={OmegaConf.select(cfg, 'model.name')} / "
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
def hydra_main(cfg: DictConfig) -> None:
    cli_main(evaluate, cfg)


def main() -> None:
    """`python eval.py` / `pelab-eval`: Hydra's job, its own failures (an override it cannot apply, a folder it
    cannot write) as one line."""
    from pelab.tasks.hydra_errors import one_line_hydra_errors

    with one_line_hydra_errors():
        hydra_main()


if __name__ == "__main__":
    main()
