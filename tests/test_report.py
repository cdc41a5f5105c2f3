"""Sweeps and reports end to end: a real 2x2 Hydra multirun -> summaries -> `pelab.report` (markdown +
PNGs), failed / unfinished jobs, Optuna, the SLURM launcher config, the W&B sweep file and the
dashboard spec against the metric keys the runs really log."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FAST, ROOT, compose, offline_runs, run_cli, wandb_records
from pelab import dashboard, report
from pelab.summary import as_float

ENCODINGS = {p.stem for p in (ROOT / "src" / "pelab" / "conf" / "pe").glob("*.yaml")}
# The shared multirun: rope, alibi x seeds 0, 1; evaluated at 32, 64, 128 tokens; probes at 32, 64.
SWEEP_ARGS = [
    *FAST,
    "pe=rope,alibi",
    "seed=0,1",
    "logger=csv",
    "trainer.max_steps=10",
    "trainer.val_check_interval=10",
    "eval.lengths=[1,2,4]",
    "probes.lengths=[1,2]",
]
LENGTHS = [32, 64, 128]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir) -> Path:
    """One real 2 x 2 multirun shared by the tests of this file (~1-2 min on 2 busy cores)."""
    root = tmp_path_factory.mktemp("sweep")
    sweep_dir = root / "multirun"
    out = run_cli(
        ["-m", *SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=root, env={"PELAB_CACHE_DIR": str(cache_dir)}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep_dir


def _summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/summary.json"))]


def _table(md: str, title: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first markdown table under the line `**title...` or `## title...`."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith((f"**{title}", f"## {title}")))
    i += next(k for k, line in enumerate(lines[i:]) if line.startswith("|")) - 2
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[0], rows[2:]  # skip the |---| line


# ---- the multirun and the report ---------------------------------------------------------------


@pytest.mark.slow
def test_multirun_writes_one_summary_per_job(sweep):
    summaries = _summaries(sweep)
    assert len(summaries) == 4
    assert {s["status"] for s in summaries} == {"ok"}
    assert sorted(s["name"] for s in summaries) == sorted(
        f"{pe}-micro-L32-s{seed}" for pe in ("rope", "alibi") for seed in (0, 1)
    )
    for s in summaries:
        assert {f"extrap/ppl@{L}" for L in LENGTHS} <= set(s["metrics"])


@pytest.mark.slow
def test_report_has_a_two_row_table_with_mean_and_std_over_seeds(sweep, tmp_path):
    out = tmp_path / "report"
    cli = subprocess.run(
        [sys.executable, "-m", "pelab.report", str(sweep), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "4 finished, 0 failed" in cli.stdout
    md = (out / "report.md").read_text()
    header, rows = _table(md, "Perplexity, non-overlapping")
    assert header == ["encoding", "seeds", *map(str, LENGTHS)]
    assert [r[0] for r in rows] == ["rope", "alibi"]  # display order; seeds aggregated, not rows
    summaries = _summaries(sweep)
    for row in rows:
        assert row[1] == "0,1"
        for L, cell in zip(LENGTHS, row[2:]):
            m = re.fullmatch(r"\**([\d.]+) ± ([\d.]+)\**", cell)
            assert m, cell
            vals = [
                as_float(s["metrics"][f"extrap/ppl@{L}"])
                for s in summaries
                if s["config"]["pe"]["name"] == row[0]
            ]
            assert float(m.group(1)) == pytest.approx(statistics.fmean(vals), abs=0.006)
            assert float(m.group(2)) == pytest.approx(statistics.stdev(vals), abs=0.006)
        assert row[2].startswith("**")  # the training length (32) is marked
    for title in (
        "ppl@L / ppl@training length",
        "Perplexity, sliding windows",
        "kv: accuracy",
        "passkey: lost-in-the-middle gap",
        "kv: mean log-probability of the gold answer",
        "Runs",
    ):
        assert f"**{title}" in md or f"## {title}" in md, title
    # kv needs more tokens than 32: the n/a cell says why.
    assert "kv needs at least" in md
    assert "Failed / unfinished" not in md


@pytest.mark.slow
def test_report_figures_are_real_images(sweep, tmp_path):
    import numpy as np
    from PIL import Image

    rep = report.build_report([sweep], tmp_path)
    assert set(rep.figures) == {"ppl_vs_length", "loss_by_position", "probe_heatmaps"}
    md = rep.path.read_text()
    for name, path in rep.figures.items():
        assert path.parent == tmp_path and path.suffix == ".png"
        assert f"]({path.name})" in md  # linked from the report
        assert path.stat().st_size > 5000, name
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=float)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300
        assert pixels.std() > 5.0, name  # not a blank canvas
    # The heatmap grid: one row per encoding, one column per probe kind.
    w, h = Image.open(rep.figures["probe_heatmaps"]).size
    assert w > h * 0.8


@pytest.mark.slow
def test_report_lists_failed_and_unfinished_jobs_and_leaves_them_out(sweep, tmp_path):
    from pelab.train import ConfigError, train

    extra = tmp_path / "extra"
    failed = extra / "0_failed"
    with pytest.raises(ConfigError):  # model.n_heads=3 cannot divide d_model=32
        train(compose([*FAST, "model.n_heads=3", "logger=csv"], failed))
    unfinished = extra / "1_unfinished"  # a Hydra job folder that never wrote its summary
    shutil.copytree(next(sweep.glob("*/.hydra")), unfinished / ".hydra")

    out = tmp_path / "report"
    assert report.main([str(sweep), str(extra), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    _, rows = _table(md, "Failed / unfinished jobs")
    by_status = {r[1]: r for r in rows}
    assert set(by_status) == {"failed", "unfinished"}
    assert "model.n_heads" in by_status["failed"][2] and "0_failed" in by_status["failed"][0]
    assert "1_unfinished" in by_status["unfinished"][0]
    assert "2 job(s) left out" in md
    _, ppl_rows = _table(md, "Perplexity, non-overlapping")
    assert [r[0] for r in ppl_rows] == ["rope", "alibi"] and all(r[1] == "0,1" for r in ppl_rows)


def test_report_cells_mark_not_applicable_diverged_and_partial():
    assert report.aggregate([]) == "—"
    assert report.aggregate([float("nan"), float("nan")]) == "n/a"
    assert report.aggregate([float("inf"), float("inf")]) == "inf"
    assert report.aggregate([2.0]) == "2.00"
    assert report.aggregate([1.0, 3.0]) == "2.00 ± 1.41"
    assert report.aggregate([1.0, float("inf")]) == "1.00 (1/2 seeds, 1 inf)"


def test_report_rows_split_on_swept_settings_but_not_on_seeds(tmp_path):
    def job(pe, lr, seed):
        cfg = {
            "pe": {"name": pe},
            "model": {"name": "micro"},
            "data": {"seq_len": 32},
            "optim": {"lr": lr},
            "seed": seed,
            "name": f"{pe}-{seed}",
            "paths": {"output_dir": f"/x/{pe}{lr}{seed}"},
        }
        return report.Job(tmp_path, "ok", {"config": cfg, "metrics": {"val/ppl": 10.0}})

    jobs = [job(pe, lr, s) for pe in ("alibi", "rope") for lr in (1e-3, 3e-3) for s in (0, 1)]
    rows, shown = report.group_rows(jobs)
    assert shown == ["pe.name", "optim.lr"]  # seed, name and paths never define a row
    assert [r.label for r in rows] == [
        "rope optim.lr=0.001",
        "rope optim.lr=0.003",
        "alibi optim.lr=0.001",
        "alibi optim.lr=0.003",
    ]
    assert all(r.seeds == [0, 1] for r in rows)


def test_report_labels_variants_and_fills_knobs_older_runs_lack(tmp_path):
    def job(pe: dict, seed: int = 0):
        cfg = {"pe": pe, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": seed}
        return report.Job(tmp_path, "ok", {"config": cfg, "metrics": {"val/ppl": 10.0}})

    old_rope = job({"name": "rope", "base": 10000.0})  # written before frequency_fraction / randomized existed
    new_rope = job({"name": "rope", "base": 10000.0, "frequency_fraction": 1.0, "randomized": {"max_position": None}},
                   seed=1)
    jobs = [
        job({"name": "rope", "base": 10000.0, "frequency_fraction": 0.75, "randomized": {"max_position": None}}),
        job({"name": "rope", "base": 10000.0, "frequency_fraction": 1.0, "randomized": {"max_position": 2048}}),
        new_rope,
        old_rope,
        job({"name": "kerple", "variant": "power"}),
        job({"name": "kerple", "variant": "log"}),
        job({"name": "alibi"}),
    ]
    rows, _ = report.group_rows(jobs)
    assert [r.label for r in rows] == [
        "rope",  # the old and the new plain runs are one row: two seeds
        "rope pe.frequency_fraction=0.75",
        "rope pe.randomized.max_position=2048",
        "alibi",
        "kerple",
        "kerple pe.variant=power",
    ]
    assert rows[0].seeds == [0, 1]
    assert report.pe_defaults("xpos")["pe.frequency_fraction"] == 1.0  # inherited from RoPE
    assert report.pe_defaults("xpos")["pe.scale_base"] == 512.0


def test_report_without_summaries_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


@pytest.mark.slow
def test_report_uploads_to_wandb_as_a_report_run_in_the_sweep_group(sweep, tmp_path):
    out = tmp_path / "report"
    assert report.main([str(sweep), "--out", str(out), "--wandb", "--wandb-mode", "offline"]) == 0
    runs = offline_runs(out)
    assert len(runs) == 1
    records = wandb_records(runs[0])
    run = next(r["run"] for r in records if r.get("type") == "run")
    assert run["job_type"] == "report"
    assert run["run_group"] == f"sweep-{sweep.parent.name}-{sweep.name}"
    logged = json.dumps([r for r in records if r.get("type") == "history"])
    for key in ("report/ppl_vs_length", "report/probe_heatmaps", "report/tables/"):
        assert key in logged, key


# ---- Optuna --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_optuna_runs_two_trials_and_returns_the_best(tmp_path):
    sweep_dir = tmp_path / "optuna"
    out = run_cli(
        [
            "-m",
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=2",
            *FAST,
            "logger=csv",
            "trainer.max_steps=10",
            "trainer.val_check_interval=10",
            "evaluate_after_fit=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = _summaries(sweep_dir)
    assert len(summaries) == 2 and {s["status"] for s in summaries} == {"ok"}
    lrs = [s["config"]["optim"]["lr"] for s in summaries]
    assert lrs[0] != lrs[1]  # the sampler proposed two learning rates
    assert len({s["name"] for s in summaries}) == 2  # trial names carry the searched values
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = min(summaries, key=lambda s: s["metrics"]["val/ppl"])
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


def _compose_hydra(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "src" / "pelab" / "conf"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides, return_hydra_config=True)


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
    assert set(spec["parameters"]["pe"]["values"]) == ENCODINGS
    assert spec["parameters"]["data.seq_len"]["values"] == [128, 256]
    # What the agent passes (`key=value`, no hyphens) composes as Hydra overrides.
    for pe in spec["parameters"]["pe"]["values"]:
        args = [
            f"{k}={p.get('value', (p.get('values') or [None])[0]) if k != 'pe' else pe}"
            for k, p in spec["parameters"].items()
        ]
        cfg = compose(args)
        assert cfg.pe.name == pe and cfg.data.seq_len == 128


def test_length_extrapolation_experiment_sweeps_all_encodings():
    cfg = _compose_hydra(["experiment=length_extrapolation"])
    assert cfg.model.name == "tiny" and cfg.data.seq_len == 128
    assert list(cfg.eval.lengths) == [1, 2, 4, 8, 16] and cfg.probes.enabled
    params = cfg.hydra.sweeper.params
    assert set(params["pe"].split(",")) == ENCODINGS


# ---- dashboard -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_dashboard_spec_names_exactly_the_metrics_the_runs_log(sweep, capsys):
    assert dashboard.main(["--dry-run", "--from", str(sweep), "--group", "g1"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in spec["sections"]] == ["Extrapolation", "Probes", "Training"]
    assert spec["runset"]["filters"] == {"Group": "g1"} and spec["runset"]["groupby"] == ["pe.name"]
    plotted = dashboard.spec_metric_keys(spec)
    for s in _summaries(sweep):
        logged = set(s["metrics"])
        assert plotted <= logged  # no panel names a key that is never logged
        # every evaluation scalar has a panel, except the probes' mean log-prob (in the tables only)
        evaluation = {k for k in logged if k.startswith(("extrap/", "probe/")) and "/logprob@" not in k}
        assert plotted - set(dashboard.TRAINING_METRICS) == evaluation
        assert set(dashboard.TRAINING_METRICS) <= logged
        media = {m for sec in spec["sections"] for p in sec["panels"] for m in p.get("media_keys", [])}
        assert media == {f"plots/{k}" for k in s["evaluation"]["plots"]}
        for col in spec["runset"]["pinned_columns"]:
            assert col.removeprefix("summary:") in logged


def test_dashboard_builds_workspace_objects_offline():
    ws = pytest.importorskip("wandb_workspaces.workspaces")
    layout = dashboard.from_config(["data.seq_len=128"])
    assert layout["lengths"] == [128, 256, 512, 1024, 2048] and layout["kinds"] == ["kv", "passkey"]
    spec = dashboard.dashboard_spec(group="sweep-1", **layout)
    workspace = dashboard.build_workspace(spec, "someone", "pelab")
    assert isinstance(workspace, ws.Workspace)
    assert [len(s.panels) for s in workspace.sections] == [len(s["panels"]) for s in spec["sections"]]
    view = workspace._to_model()  # the structure save() would upload; no server needed
    assert view.project == "pelab" and view.display_name == spec["name"]


def test_dashboard_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "wandb_workspaces.workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", None)
    spec = dashboard.dashboard_spec([32, 64], ["kv"])
    with pytest.raises(dashboard.DashboardError, match="pip install wandb-workspaces"):
        dashboard.build_workspace(spec, "someone", "pelab")
