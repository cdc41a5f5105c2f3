"""`python train.py [overrides]`: compose -> validate -> data -> model -> fit -> evaluate, as one job of
`pelab.tasks.task.run_task` (summary.json, the W&B run and the exit codes: see there).

`train()` is the list of its steps; the parts are built by `pelab.harness.build` (DataModule, module,
Trainer), context extension is `pelab.harness.extension`, and the evaluation `pelab.evaluation.suite`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pelab import CONF_DIR
from pelab.tasks.names import in_multirun
from pelab.tasks.task import Task, cli_main, earlier_summary, launcher_rank, resolved_config, run_task

log = logging.getLogger(__name__)


def validate_config(cfg: DictConfig) -> dict[str, Any]:
    """Every setting typed and range-checked before any data is built or any step is taken (each layer's
    schema, composed by pelab.tasks.config). A bad one is a ConfigError naming the key."""
    from pelab.tasks.config import validate

    return validate(cfg)


def train(cfg: DictConfig) -> dict:
    """One training job. Returns its summary (also written to `<output_dir>/summary.json`, from the start
    and whenever something new is known).

    A launch into a folder that holds a run continues it (ckpt_path=auto), or, in a relaunched multirun, skips
    a job that finished (status ok) and resumes the others from their checkpoints; another run's settings, or a
    fresh start over a run, are refused in one line (`pelab.harness.run_folder`)."""
    from pelab.harness.run_folder import relaunch_decision
    from pelab.harness.signals import preemption_signals

    output_dir = Path(cfg.paths.output_dir)
    signals = preemption_signals()
    with claim_folder(output_dir):
        earlier = earlier_summary(output_dir) if launcher_rank() == 0 else {}
        decision = relaunch_decision(output_dir, resolved_config(cfg), earlier, cfg.get("ckpt_path"), in_multirun())
        if decision == "skip":  # a relaunched multirun: this job finished earlier
            log.info("%s finished earlier (status ok, step %s): skipped", output_dir, earlier.get("global_step"))
            return {**earlier, "skipped": True}
        if decision == "continue" and cfg.get("ckpt_path") in (None, "", "null"):
            cfg.ckpt_path = "auto"  # a relaunched multirun resumes its interrupted jobs
        return train_in(cfg, output_dir, signals)


def claim_folder(output_dir: Path) -> Any:
    """The run folder held by this process (rank 0; the other launcher ranks share it)."""
    from pelab.harness.run_folder import claim

    return claim(output_dir) if launcher_rank() == 0 else contextlib.nullcontext()


def train_in(cfg: DictConfig, output_dir: Path, signals: tuple[int, ...]) -> dict:
    """`train` in its claimed folder."""
    with run_task(output_dir, rank=launcher_rank(), signals=signals, name=cfg.name) as task:
        task.summary["config"] = resolved_config(cfg)
        task.save()
        # Every check that needs no data before torch, Lightning or W&B is imported (a bad input is refused in
        # a second and costs no W&B connection) ...
        validate_config(cfg)
        task.record_machine()
        with kept_threads():
            fit_and_evaluate(cfg, output_dir, signals, task)
    return task.summary


@contextlib.contextmanager
def kept_threads() -> Any:
    """The caller's torch thread count, restored after the job (the run's count, `threads`, is its own)."""
    import torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_and_evaluate(cfg: DictConfig, output_dir: Path, signals: tuple[int, ...], task: Task) -> None:
    """The job once its settings are valid: data, model, fit, evaluation."""
    import lightning.pytorch as L

    from pelab.harness.build import (
        build_module,
        build_trainer,
        prepare_data,
        resume_point,
        set_threads,
        trainer_settings,
    )
    from pelab.harness.extension import extension_parent, load_parent_weights
    from pelab.harness.loggers import log_run_start, single_lightning_log_handler

    single_lightning_log_handler()
    summary = task.summary
    parent = extension_parent(cfg)
    precision, world = trainer_settings(cfg)
    ckpt_path, ckpt_vocab = resume_point(cfg, output_dir, summary)
    summary["threads"] = set_threads(cfg.get("threads", "auto"), summary.get("threads") if ckpt_path else None, world)
    task.start_wandb((summary["config"].get("logger") or {}).get("wandb"), name=cfg.name,
                     config=summary["config"], tags=list(cfg.get("tags") or []), notes=cfg.get("notes"))
    if parent:
        record_parent(task, cfg, parent)
    if parent and not ckpt_path:  # a resumed child already holds its own weights
        ckpt_vocab = parent["vocab_size"]
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = prepare_data(cfg, int(cfg.data.batch_size) // world, summary, ckpt_path or
                              (parent or {}).get("path"), ckpt_vocab)
    module = build_module(summary, datamodule.vocab_size)
    # ... and those that need the data (split sizes, vocabulary) before the first step
    check_before_training(cfg, module, datamodule, world, precision)
    if parent and not ckpt_path:
        load_parent_weights(module, parent["path"])
    task.save()
    log_run_start(task.run, summary, module.model, datamodule, int(cfg.data.seq_len), output_dir)
    before = {}
    if parent and not ckpt_path and cfg.extend.get("eval_before") and launcher_rank() == 0:
        from pelab.evaluation.suite import run_evaluation

        # the parent's weights under the child's settings, before any step: the "step 0" of PI's tables
        before = run_evaluation(module.model, datamodule, cfg, output_dir, task.run, summary, prefix="step0")
        summary["metrics"] = dict(before)
        task.save()
    trainer, preemption = build_trainer(cfg, precision, task, signals)
    summary["metrics"] = {**fit(trainer, module, datamodule, ckpt_path, preemption, summary), **before}
    task.save()  # the training metrics stay whatever happens in evaluation
    if cfg.get("evaluate_after_fit", True) and trainer.is_global_zero:
        from pelab.evaluation.suite import run_evaluation

        final = run_evaluation(module.model, datamodule, cfg, output_dir, task.run, summary)
        summary["metrics"].update(final)
        if cfg.eval.get("at"):  # the end of the schedule closes the curve of eval.at
            ex = summary["evaluation"]["extrapolation"]
            task.add_point({"step": summary["global_step"], "fraction": 1.0, "schedule": "end",
                            "tokens_seen": module.tokens_per_step() * int(summary["global_step"]),
                            "blocks": ex["blocks"], "split": ex["split"],
                            "seconds": summary["evaluation"]["seconds"]["extrapolation"],
                            "metrics": {k: v for k, v in final.items() if k.startswith("extrap/")}})


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    return objective(cli_main(train, cfg), cfg.optimized_metric)


def main() -> None:
    """`python train.py` / `pelab-train`: the checks that need no config job (environment, group choices,
    writable folders), then Hydra's job."""
    from pelab.tasks.preflight import preflight

    preflight(CONF_DIR)
    hydra_main()


# -- the steps of train() ------------------------------------------------------------------------------
def check_before_training(cfg: DictConfig, module: Any, datamodule: Any, world: int, precision: str) -> None:
    """What needs the data to be checked, before the first step: the evaluation text against its split (the
    final evaluation and eval.at), the probes' filler, and memory (a training step, the evaluation)."""
    from pelab.evaluation.config import resolve_lengths
    from pelab.evaluation.suite import check_eval_budget
    from pelab.harness.build import on_cuda
    from pelab.harness.memory import check_run

    if cfg.get("evaluate_after_fit", True) or (cfg.eval.get("at") or []):
        length = int(cfg.data.seq_len)
        longest = max(resolve_lengths(list(cfg.eval.lengths), length) + [length])
        split, available = str(cfg.eval.split), datamodule.n_tokens(cfg.eval.split)
        check_eval_budget(split, cfg.eval.get("tokens"), longest, available)
        if cfg.eval.get("at"):
            check_eval_budget(split, cfg.eval.get("at_tokens"), longest, available, key="eval.at_tokens")
    check_run(cfg, module.model, datamodule.vocab_size, int(cfg.data.batch_size) // world, precision,
              on_cuda(OmegaConf.to_container(cfg.trainer, resolve=True)))



def record_parent(task: Task, cfg: DictConfig, parent: dict) -> None:
    """The parent of an extended run in `extend.parent` of its config: summary.json, the W&B config and the
    checkpoints."""
    from pelab.harness.loggers import guarded, use_parent_checkpoint

    cfg.extend.parent = parent
    task.summary["config"] = resolved_config(cfg)
    task.summary["extended_from"] = parent
    task.save()
    if task.run is not None:
        guarded("config update", task.run.config.update,
                {"extend": task.summary["config"]["extend"], "pe": task.summary["config"]["pe"]},
                allow_val_change=True)
        guarded("parent checkpoint artifact", use_parent_checkpoint, task.run, parent)


def fit(trainer: Any, module: Any, datamodule: Any, ckpt_path: str | None, preemption: Any,
        summary: dict) -> dict[str, float]:
    """Train; returns the final val/ and train/ metrics (those saved in the checkpoint when a relaunch has
    no step left to train, e.g. after a preemption during the evaluation)."""
    from pelab.errors import OutOfMemory
    from pelab.harness.memory import is_out_of_memory
    from pelab.harness.signals import Preempted

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        last = Path(summary["output_dir"]) / "checkpoints" / "last.ckpt"
        resume = (f"resume from {last} (step {module.last_ckpt_step}) with ckpt_path=auto"
                  if module.last_ckpt_step is not None and last.exists() else "no checkpoint was written yet")
        raise OutOfMemory(f"out of memory at step {trainer.global_step} ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:160]}); lower data.batch_size or data.seq_len, then "
                          f"{resume}.") from err
    if preemption.received is not None:  # signalled during the final validation: last.ckpt is final
        raise Preempted(preemption.received, step=trainer.global_step, ckpt=preemption.ckpt_path)
    summary["start_step"] = module.start_step if module.start_step is not None else module.last_ckpt_step
    summary["global_step"] = final_step(trainer, Path(summary["output_dir"]))
    summary["nonfinite_skips"] = module.nonfinite_skips
    return module.run_metrics(trainer)


def final_step(trainer: Any, output_dir: Path) -> int:
    """The step training ended at. Under ddp_spawn the loop ran in child processes and this process's
    trainer still says 0, so the step comes from the checkpoint the ranks wrote."""
    if trainer.global_step > 0:
        return int(trainer.global_step)
    from pelab.harness.checkpoints import checkpoint_step

    last = output_dir / "checkpoints" / "last.ckpt"
    return checkpoint_step(last) if last.exists() else 0


def objective(summary: dict, metric: str) -> float:
    """Value returned to sweepers; a failed or missing metric is +inf (never a crash of the sweep)."""
    value = (summary.get("metrics") or {}).get(metric)
    return float(value) if value is not None and math.isfinite(float(value)) else float("inf")


if __name__ == "__main__":
    main()
