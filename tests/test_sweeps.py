"""Sweeps: a real Hydra multirun writes one summary per job, Optuna, the SLURM launcher config, the W&B
sweep file and the experiment presets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.runs import CONF_DIR, FAST, ROOT, STUDY_PRESETS, compose, run_cli, study_preset, summaries

# The frozen studies' own list, as they ran it (a scheme added later changes nothing they run).
ELEVEN = ["sinusoidal", "learned", "rope", "xpos", "t5_bias", "alibi", "kerple", "sandwich", "fire", "cope", "nope"]
ENCODINGS = {p.stem for p in (ROOT / "conf" / "pe").glob("*.yaml") if not p.stem.startswith("_")}  # not _base


def _compose_hydra(overrides: list[str]):
    """Composition with the `hydra` node (launcher, sweeper), which helpers.runs.compose leaves out."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import pelab.training.config  # noqa: F401 - imports the schemas, which store their nodes (pe/_RoPEConfig, ...)

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides, return_hydra_config=True)


# ---- the basic sweeper (the shared multirun of conftest.py) --------------------------------------------


@pytest.mark.slow
def test_multirun_writes_one_summary_per_job(sweep):
    jobs = summaries(sweep)
    assert len(jobs) == 4
    assert {s["status"] for s in jobs} == {"ok"}
    assert sorted(s["name"] for s in jobs) == sorted(
        f"{pe}-micro-L32-s{seed}" for pe in ("rope", "alibi") for seed in (0, 1)
    )
    for s in jobs:
        assert {f"extrap/ppl@{L}" for L in (32, 64, 128)} <= set(s["metrics"])


@pytest.mark.slow
def test_a_worker_on_a_shared_sweep_folder_leaves_a_held_job_to_its_holder_and_exits_0(tmp_path):
    """Two workers launched on one sweep folder (docs/corpora.md, the studies' pinned_sweeps) share its jobs: a job
    whose folder a live process holds is left to it -- one line naming the holder, its folder untouched, not a
    failed job -- and the worker runs the rest and exits 0. Outside a multirun a held folder is still refused
    (tests/test_run_folder.py)."""
    from pelab.runs.folder import LOCK

    sweep_dir = tmp_path / "multirun"
    held = sweep_dir / "0"  # job 0 (seed 0), as the other worker would hold it
    held.mkdir(parents=True)
    theirs = {"status": "running", "global_step": 1}
    (held / "summary.json").write_text(json.dumps(theirs))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        (held / LOCK).write_text(f"{holder.pid}\n")
        out = run_cli(["-m", *FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=2",
                       "trainer.val_check_interval=2", "seed=0,1", f"hydra.sweep.dir={sweep_dir}",
                       "hydra.sweep.subdir=${hydra.job.num}"], cwd=tmp_path)
        assert (held / LOCK).read_text().split() == [str(holder.pid)]  # still the holder's
    finally:
        holder.kill()
        holder.wait()
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert f"{held} is held by a running job (pid {holder.pid}), another worker of this sweep: left to it" in log
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    assert json.loads((held / "summary.json").read_text()) == theirs
    ran = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert (ran["status"], ran["config"]["seed"], ran["global_step"]) == ("ok", 1, 2)


# ---- Optuna --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_optuna_runs_two_trials_and_returns_the_best(tmp_path):
    sweep_dir = tmp_path / "optuna"
    out = run_cli(
        [
            "-m",
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=2",
            *[o for o in FAST if not o.startswith("optim.lr=")],  # the search's own parameter
            "logger=csv",
            "trainer.max_steps=10",
            "trainer.val_check_interval=10",
            "evaluate_after_fit=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    trials = summaries(sweep_dir)
    assert len(trials) == 2 and {s["status"] for s in trials} == {"ok"}
    lrs = [s["config"]["optim"]["lr"] for s in trials]
    assert lrs[0] != lrs[1]  # the sampler proposed two learning rates
    from pelab.report.generated import sweep_jobs

    assert sweep_jobs(sweep_dir) == 2  # `python -m pelab.report progress` counts Optuna's trials
    assert len({s["name"] for s in trials}) == 2  # trial names carry the searched values
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = min(trials, key=lambda s: s["metrics"]["val/ppl"])
    assert result["best_value"] == pytest.approx(best["metrics"]["val/ppl"])
    assert result["best_params"]["optim.lr"] == pytest.approx(best["config"]["optim"]["lr"])


# ---- SLURM launcher ------------------------------------------------------------------------------


def _slurm_cfg(*extra: str):
    return _compose_hydra(
        [
            "hydra/launcher=slurm",
            "trainer=slurm",
            "trainer.devices=8",
            "trainer.num_nodes=2",
            "hydra.launcher.partition=gpu",
            *extra,
        ]
    )


def test_slurm_launcher_config_composes_with_one_task_per_gpu():
    cfg = _slurm_cfg()
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.partition == "gpu" and launcher.timeout_min == 240
    # GPU and node counts follow the trainer: one SLURM task per GPU for Lightning DDP.
    assert launcher.gpus_per_node == 8 and launcher.tasks_per_node == 8 and launcher.nodes == 2
    assert cfg.trainer.strategy == "ddp" and cfg.trainer.devices == 8 and cfg.trainer.num_nodes == 2
    # The plugin's schema still applies (the file extends it): a misspelt key fails at composition.
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="gpus_per_nod"):
        _slurm_cfg("hydra.launcher.gpus_per_nod=4")


def test_slurm_launcher_settings_render_a_valid_sbatch_header(tmp_path, monkeypatch):
    """The composed settings through submitit's own parameter check and sbatch writer (as
    hydra-submitit-launcher's launch() does). submitit only wants to see an `srun` on the PATH."""
    submitit = pytest.importorskip("submitit")
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")

    cfg = _slurm_cfg(f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.setup=[module load cuda]")
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    params.pop("_target_")
    executor = submitit.AutoExecutor(
        cluster="slurm",
        folder=params.pop("submitit_folder"),
        slurm_max_num_timeout=params.pop("max_num_timeout"),
    )
    generic = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in generic else f"slurm_{k}": v for k, v in params.items()})
    sbatch = executor._executor._make_submission_file_text("python -u job.py", "uid")
    for line in (
        "--gpus-per-node=8",
        "--ntasks-per-node=8",
        "--nodes=2",
        "--partition=gpu",
        "--time=240",
        "--cpus-per-task=8",
        "--mem=64GB",
    ):
        assert f"#SBATCH {line}" in sbatch, line
    assert "module load cuda" in sbatch


# ---- W&B sweep file and experiment presets -------------------------------------------------------


def test_wandb_sweep_grid_passes_hydra_overrides():
    spec = yaml.safe_load((ROOT / "experiments" / "sweeps" / "pe_grid.yaml").read_text())
    assert spec["method"] == "grid" and spec["program"] == "train.py" and (ROOT / spec["program"]).exists()
    assert spec["command"] == ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]
    assert set(spec["parameters"]["pe"]["values"]) <= ENCODINGS  # known names (a new scheme need not join the grid)
    assert spec["parameters"]["data.seq_len"]["values"] == [128, 256]
    # What the agent passes (`key=value`, no hyphens) composes as Hydra overrides.
    for pe in spec["parameters"]["pe"]["values"]:
        args = [
            f"{k}={p.get('value', (p.get('values') or [None])[0]) if k != 'pe' else pe}"
            for k, p in spec["parameters"].items()
        ]
        cfg = compose(args)
        assert cfg.pe.name == pe and cfg.data.seq_len == 128


def test_length_extrapolation_experiment_sweeps_all_encodings_and_seeds():
    cfg = _compose_hydra(["experiment=length_extrapolation"])  # v3: six schemes, two budgets, test split
    assert cfg.model.name == "tiny" and cfg.tokenizer.kind == "byte" and cfg.data.seq_len == 128
    assert cfg.data.recall_mix == 0 and not cfg.probes.enabled  # pure text: its perplexity is what is reported
    assert list(cfg.eval.lengths) == [1, 2, 4, 8] and cfg.eval.split == "test" and list(cfg.eval.at) == [0.25, 0.5]
    params = cfg.hydra.sweeper.params
    assert list(params) == ["trainer.max_steps", "seed", "pe"]  # the short budget first: all its jobs run first
    assert params["trainer.max_steps"] == "1500,6000" and params["seed"] == "0,1,2"
    assert params["pe"].split(",") == ["nope", "sinusoidal", "rope", "t5_bias", "alibi", "fire"]
    v2 = _compose_hydra(study_preset("length_extrapolation_v2"))  # the second study, kept reproducible
    assert v2.hydra.sweeper.params["pe"].split(",") == ELEVEN and v2.eval.split == "val"
    v1 = _compose_hydra(study_preset("length_extrapolation_v1"))  # the first study, kept reproducible
    assert v1.model.d_model == 256 and v1.data.recall_mix == 0.1 and list(v1.eval.lengths) == [1, 2, 4, 8, 16]
    assert v1.hydra.sweeper.params["pe"].split(",") == ELEVEN


def test_lost_in_the_middle_v3_trains_every_scheme_the_same_steps():
    cfg = _compose_hydra(["experiment=lost_in_the_middle"])
    assert cfg.trainer.max_steps == 1000 and cfg.callbacks.retrieval_criterion.stop is False  # no early stop
    assert cfg.eval.split == "test" and list(cfg.probes.kinds) == ["mqar", "mqar_offset"] and cfg.probes.samples == 200
    params = cfg.hydra.sweeper.params
    assert params["seed"] == "0,1" and len(params["pe"].split(",")) == 9 and set(params["pe"].split(",")) <= ENCODINGS
    v2 = _compose_hydra(study_preset("lost_in_the_middle_v2"))  # the criterion-stopped study, kept reproducible
    assert v2.callbacks.retrieval_criterion.get("stop", True) is True  # the callback's default: stop at 0.95


def test_context_extension_v3_children_keep_the_parents_tokens_per_step():
    parent = _compose_hydra(["experiment=context_extension"])
    default = _compose_hydra([])
    for key in ("model", "data", "optim", "pe", "tokenizer"):  # the parent is the default run
        assert parent[key] == default[key], key
    assert list(parent.eval.lengths) == [128, 256, 512, 1024, 2048] and list(parent.probes.lengths) == [128, 512,
                                                                                                         1024, 2048]
    child = _compose_hydra(["experiment=context_extension_child"])
    assert child.data.seq_len == 4 * parent.data.seq_len and child.pe.scaling.factor == 4
    assert child.data.seq_len * child.data.batch_size == parent.data.seq_len * parent.data.batch_size
    assert child.data.recall_mix == parent.data.recall_mix and child.data.recall_curriculum is None
    assert child.extend.eval_before and child.hydra.sweeper.params["pe.scaling.type"] == "none,linear,ntk,yarn"
    assert child.eval.lengths == parent.eval.lengths and child.probes == parent.probes


def test_the_frozen_study_presets_sit_beside_their_studies():
    """The versions pinned for committed studies are in the study's own folder (`-cd <folder>` adds it), not
    among the presets of conf/experiment/."""
    assert {name: str(folder.relative_to(ROOT)) for name, folder in STUDY_PRESETS.items()} == {
        "length_extrapolation_v1": "experiments/length_extrapolation/v1/conf",
        "length_extrapolation_v2": "experiments/length_extrapolation/v2/conf",
        "lost_in_the_middle_v2": "experiments/lost_in_the_middle/v2/conf",
        "context_extension_v2": "experiments/context_extension/v2/conf"}
    assert not set(STUDY_PRESETS) & {p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")}
    v2 = _compose_hydra(study_preset("context_extension_v2"))  # the parent of the second study, kept reproducible
    assert v2.model.name == "micro" and v2.tokenizer.kind == "byte" and v2.data.recall_mix == 0


@pytest.mark.parametrize("pe", ["t5_bias", "cope"])
def test_length_extrapolation_preset_is_the_setting_of_the_committed_study(pe):
    """experiment=length_extrapolation_v2 composes to the settings the committed runs of
    experiments/length_extrapolation were made with (they were launched with explicit overrides; summary.json
    keeps each run's resolved config). Keys added to the config after those runs are not in their summaries."""
    from omegaconf import OmegaConf

    from pelab.report.aggregation import flatten

    ran = json.loads((ROOT / f"experiments/peer/results/seeds/pelab_{pe}_s1/summary.json").read_text())["config"]
    cfg = compose([*study_preset("length_extrapolation_v2"), f"pe={pe}", "seed=1"], Path("/tmp/unused"))
    for section in ("model", "data", "tokenizer", "optim", "pe", "eval", "probes"):
        preset, committed = flatten(OmegaConf.to_container(cfg[section], resolve=True)), flatten(ran[section])
        assert {k: preset.get(k) for k in committed} == committed, section
    assert cfg.seed == ran["seed"] and cfg.trainer.max_steps == ran["trainer"]["max_steps"]
