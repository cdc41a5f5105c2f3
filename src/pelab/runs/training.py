"""A training job once its settings are valid: data, model, fit, evaluation. The task layer composes, validates,
holds the run folder and keeps the record; it hands the config here once, with the job's record (`JobRecord`),
which every step writes into."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pelab.training.config import TrainSettings, wandb_entry
from pelab.training.job import JobRecord


def run_training(cfg: DictConfig, settings: TrainSettings, job: JobRecord, signals: tuple[int, ...]) -> None:
    """The job once its settings are valid (`settings`, the typed tree; `cfg` for what Hydra instantiates and
    the record): data, model, fit, evaluation, each result into the job's record."""
    import lightning.pytorch as L

    from pelab.runs.build import (
        build_datamodule,
        build_module,
        build_trainer,
        on_cuda,
        prepare_data,
        resume_point,
        trainer_settings,
    )
    from pelab.runs.loggers import log_run_start, single_lightning_log_handler
    from pelab.runs.memory import check_memory_before_data
    from pelab.runs.threads import set_threads
    from pelab.training.extension import extension_parent, load_parent_weights

    single_lightning_log_handler()
    summary, output_dir = job.summary, job.output_dir
    parent = extension_parent(cfg)
    precision, world = trainer_settings(settings)
    if parent:  # first: a resumed child's checkpoint holds the pe.train_length filled from the parent
        record_parent(job, cfg, parent)
    ckpt_path, ckpt_vocab = resume_point(settings.run.ckpt_path, output_dir, summary)
    recorded_threads = summary.get("threads") if ckpt_path else None  # a resumed run keeps its count
    summary["threads"] = set_threads(settings.run.threads, recorded_threads, world)
    if parent and not ckpt_path:  # a resumed child already holds its own weights
        ckpt_vocab = parent["vocab_size"]
    L.seed_everything(settings.run.seed, workers=True, verbose=False)
    check_memory_before_data(settings, cfg.model, cfg.pe, settings.data.batch_size // world, precision,
                             on_cuda(settings.trainer))  # what it refuses needs no token cache built first
    datamodule = prepare_data(build_datamodule(cfg, settings.data.batch_size // world,
                                               settings.run.debug.emulate_world_size),
                              summary, ckpt_path or (parent or {}).get("path"), ckpt_vocab)
    module = build_module(summary, datamodule.vocab_size)
    # The checks that need the data (split sizes, vocabulary), before the first step and before W&B starts: a
    # setting they refuse never waits for a W&B server (up to logger.wandb.init_timeout without a network)
    check_before_training(settings, module, datamodule, world, precision, summary)
    job.start_wandb(wandb_entry(summary["config"]), name=settings.run.name,
                     config=summary["config"], tags=list(settings.run.tags), notes=settings.run.notes)
    if parent and job.run is not None:
        from pelab.runs.loggers import guarded, use_parent_checkpoint

        guarded("parent checkpoint artifact", use_parent_checkpoint, job.run, parent)
    if parent and not ckpt_path:
        load_parent_weights(module, parent["path"])
    job.save()
    log_run_start(job.run, summary, module.model, datamodule, settings.data.seq_len, output_dir)
    before = {}
    if parent and not ckpt_path and cfg.extend.eval_before and job.rank == 0:
        from pelab.evaluation.suite import run_evaluation

        # the parent's weights under the child's settings, before any step: the "step 0" of PI's tables
        before = run_evaluation(module.model, datamodule, cfg, output_dir, job.run, summary, prefix="step0",
                                typed=(settings.eval, settings.probes))
        summary["metrics"] = dict(before)
        job.save()
    trainer, preemption = build_trainer(cfg, settings, precision, job, signals)
    summary["metrics"] = {**fit(trainer, module, datamodule, ckpt_path, preemption, summary), **before}
    job.save()  # the training metrics stay whatever happens in evaluation
    if settings.run.evaluate_after_fit and trainer.is_global_zero:
        from pelab.evaluation.suite import run_evaluation

        final = run_evaluation(module.model, datamodule, cfg, output_dir, job.run, summary,
                               typed=(settings.eval, settings.probes),
                               progress_bar=bool(OmegaConf.select(cfg, "callbacks.progress_bar")))
        summary["metrics"].update(final)
        if settings.eval.at:  # the end of the schedule closes the curve of eval.at
            ex = summary["evaluation"]["extrapolation"]
            job.add_point({"step": summary["global_step"], "fraction": 1.0, "schedule": "end",
                            "tokens_seen": module.tokens_per_step() * int(summary["global_step"]),
                            "blocks": ex["blocks"], "split": ex["split"],
                            "seconds": summary["evaluation"]["seconds"]["extrapolation"],
                            "metrics": {k: v for k, v in final.items()  # the probes too where the points have them
                                        if k.startswith(("extrap/", "probe/") if settings.eval.at_probes else "extrap/")}})


def check_before_training(settings: TrainSettings, module: Any, datamodule: Any, world: int, precision: str,
                          summary: dict) -> None:
    """What needs the data to be checked, before the first step: the evaluation text against its split (the
    final evaluation and eval.at), the probes' filler, and memory (a training step, the evaluation); and the final
    evaluation's compute against the training's, printed and recorded (summary.json `eval_cost`)."""
    from pelab.evaluation.config import resolve_lengths
    from pelab.evaluation.suite import check_eval_budget
    from pelab.runs.build import on_cuda
    from pelab.runs.memory import check_memory

    ev, length = settings.eval, settings.data.seq_len
    if settings.run.evaluate_after_fit or ev.at:
        longest = max(resolve_lengths(list(ev.lengths), length) + [length])
        available = datamodule.n_tokens(ev.split)
        check_eval_budget(ev.split, ev.tokens, longest, available)
        if ev.at:
            check_eval_budget(ev.split, ev.at_tokens, longest, available, key="eval.at_tokens")
    check_memory(settings, module.model, datamodule.vocab_size, settings.data.batch_size // world, precision,
              on_cuda(settings.trainer))
    if settings.run.evaluate_after_fit:
        from pelab.runs.eval_cost import estimate_eval_cost, report_eval_cost

        cost = estimate_eval_cost(settings, module.model, datamodule.n_tokens(ev.split), module.flops_per_token)
        report_eval_cost(cost)
        summary["eval_cost"] = cost.record()



def record_parent(job: JobRecord, cfg: DictConfig, parent: dict) -> None:
    """The parent of an extended run in `extend.parent` of its config: summary.json, the checkpoints and (started
    after this) the W&B run's config."""
    cfg.extend.parent = parent
    job.summary["config"] = OmegaConf.to_container(cfg, resolve=True)
    job.summary["extended_from"] = parent
    job.save()


def fit(trainer: Any, module: Any, datamodule: Any, ckpt_path: str | None, preemption: Any,
        summary: dict) -> dict[str, float]:
    """Train; returns the final val/ and train/ metrics (those saved in the checkpoint when a relaunch has
    no step left to train, e.g. after a preemption during the evaluation)."""
    from pelab.errors import OutOfMemory
    from pelab.runs.memory import is_out_of_memory
    from pelab.signals import Preempted

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
    from pelab.training.checkpoints import checkpoint_step

    last = output_dir / "checkpoints" / "last.ckpt"
    return checkpoint_step(last) if last.exists() else 0
