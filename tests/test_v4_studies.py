"""The v4 studies' run scripts (issue 59): what each launches, read from a dry run (DRY_RUN=1 prints each train.py /
eval.py command instead of running it) and composed and validated as Hydra will, with each scheme's learning rate
from the grid's choice, on each corpus; a missing rate stops a launch with one line before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.runs import ROOT, compose
from pelab.tasks.config import validate

# a choice as experiments/lr_grid/choose.py writes it, distinct rates so that a swapped lookup shows
SCHEMES = ["nope", "sinusoidal", "rope", "t5_bias", "alibi", "fire", "fox", "irope", "rnope_swa"]
CHOICE = {s: {"stdlib": 1e-3 * (i + 1), "django_docs": 1e-4 * (i + 1)} for i, s in enumerate(SCHEMES)}


def dry_run(tmp_path, script: str, *args: str, choice: dict | None = CHOICE, **env: str):
    path = tmp_path / ("choice.json" if choice is not None else "absent.json")
    if choice is not None:
        path.write_text(json.dumps(choice))
    root = tmp_path / "root"
    proc = subprocess.run(["bash", str(ROOT / script), *args, str(root)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1", "CHOICE": str(path), "VENV_PY": sys.executable, **env},
                          stdin=subprocess.DEVNULL, check=False)  # VENV_PY: the scripts' python (CI's venv: .venv-ci)
    assert not root.exists(), "a dry run writes nothing under the study's root"
    commands = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["train.py"], ["eval.py"])]
    return proc, commands


def one_job(command: list[str]) -> list[str]:
    """A sweep's first job, as the overrides compose() takes: no -m, no hydra.* or folder keys, the first value of
    each swept key (a bracketed list is one value)."""
    out = []
    for a in command[1:]:
        if a == "-m" or a.startswith(("hydra.", "extend.from=", "ckpt_path=")):
            continue
        key, value = a.split("=", 1)
        out.append(f"{key}={value.split(',')[0]}" if not value.startswith("[") else a)
    return out


def scheme_of(cfg) -> str:
    return cfg.model.name.removeprefix("tiny-") if cfg.model.name.startswith("tiny-") else cfg.pe.name


@pytest.mark.parametrize("study, phase, schemes, seeds", [
    ("length_extrapolation", "questions", {"rope", "alibi", "nope", "rnope_swa"}, "0,1,2,3"),
    ("length_extrapolation", "descriptive", {"sinusoidal", "t5_bias", "fire", "fox", "irope"}, "0,1,2"),
    ("lost_in_the_middle", "questions", {"rope", "alibi", "fire", "nope"}, "0,1,2,3"),
    ("lost_in_the_middle", "descriptive", {"sinusoidal", "t5_bias", "fox"}, "0,1,2"),
])
def test_each_scheme_runs_on_both_corpora_at_its_chosen_rate(tmp_path, study, phase, schemes, seeds):
    proc, commands = dry_run(tmp_path, f"experiments/{study}/v4/run.sh", phase)
    assert proc.returncode == 0, proc.stderr
    assert len(commands) == 2 * len(schemes)  # one sweep per scheme and corpus
    seen = set()
    for c in commands:
        assert c[:3] == ["train.py", "-m", f"experiment={study}"] and f"seed={seeds}" in c
        args = dict(a.split("=", 1) for a in one_job(c))
        scheme = args["model.name"].removeprefix("tiny-") if "model.name" in args else args["pe"]
        corpus = args["data"]
        assert float(args["optim.lr"]) == pytest.approx(CHOICE[scheme][corpus])
        assert any(a == f"hydra.sweep.dir={tmp_path}/root/sweep-{scheme}.{corpus}" for a in c)
        seen.add((scheme, corpus))
        if corpus == "django_docs":  # each scheme's arguments composed and validated once (about 0.2 s each)
            cfg = compose(one_job(c))
            validate(cfg)
            assert (scheme_of(cfg), cfg.data.source, cfg.optim.lr) == (scheme, corpus, float(args["optim.lr"]))
    assert seen == {(s, c) for s in schemes for c in ("stdlib", "django_docs")}
    if study == "length_extrapolation":
        assert cfg.trainer.max_steps == 1500 and list(cfg.eval.lengths) == [1, 2, 4, 8]
    else:  # text and mqar rows (the default run's mix), so that the corpus enters the training
        assert cfg.trainer.max_steps == 1000 and not cfg.callbacks.retrieval_criterion.stop
        assert cfg.data.recall_mix == 0.25 and cfg.data.recall_loss == "two_means"
        assert [list(c) for c in cfg.data.recall_curriculum] == [[0, 32, 0.5], [200, 64, 0.5], [400, 128, 0.25]]


def test_a_top_up_on_one_corpus_runs_the_question_schemes_there_only(tmp_path):
    """CORPORA: the seeds the re-estimated plan asks of one corpus (length extrapolation v4: prose), nowhere else; a
    corpus the studies do not have stops the launch in one line."""
    proc, commands = dry_run(tmp_path, "experiments/length_extrapolation/v4/run.sh", "questions",
                             SEEDS="8 9 10 11", CORPORA="django_docs")
    assert proc.returncode == 0, proc.stderr
    assert sorted(a for c in commands for a in c if a.startswith("hydra.sweep.dir=")) == sorted(
        f"hydra.sweep.dir={tmp_path}/root/sweep-{s}.django_docs" for s in ("rope", "alibi", "nope", "rnope_swa"))
    assert all("seed=8,9,10,11" in c and "data=django_docs" in c for c in commands)
    proc, commands = dry_run(tmp_path, "experiments/length_extrapolation/v4/run.sh", "questions", CORPORA="wikitext")
    assert proc.returncode == 2 and not commands and proc.stderr.strip() == (
        "CORPORA: stdlib and/or django_docs, not 'wikitext'")


@pytest.mark.parametrize("phase, schemes, seeds", [
    ("lr1e-3", ("rope", "alibi", "fire", "nope"), "0,1,2,3,4,5,6,7"),
    ("lr1e-3-descriptive", ("sinusoidal", "t5_bias", "fox"), "0,1,2"),
])
def test_the_retrieval_studys_second_arm_runs_its_schemes_at_the_shared_rate_whatever_the_grid_chose(
        tmp_path, phase, schemes, seeds):
    """The second arm (lr1e-3): the four question schemes (or the descriptive rows) on both corpora at 1e-3 from its
    own rates file, not CHOICE's (distinct rates here, so a lookup in the grid's choice shows), in sweeps under
    <root>/lr1e-3."""
    proc, commands = dry_run(tmp_path, "experiments/lost_in_the_middle/v4/run.sh", phase)
    assert proc.returncode == 0, proc.stderr
    dirs = {a.removeprefix("hydra.sweep.dir=") for c in commands for a in c if a.startswith("hydra.sweep.dir=")}
    assert dirs == {f"{tmp_path}/root/lr1e-3/sweep-{s}.{c}" for s in schemes for c in ("stdlib", "django_docs")}
    assert len(commands) == len(dirs) and all("optim.lr=0.001" in c and f"seed={seeds}" in c for c in commands)
    cfg = compose(one_job(commands[-1]))
    validate(cfg)
    assert cfg.optim.lr == 1e-3 and "lr1e-3" in cfg.tags and cfg.data.recall_mix == 0.25


def test_the_retrieval_studys_along_training_arm_probes_r1s_schemes_during_training_at_the_shared_rate(tmp_path):
    """The along arm: RoPE and ALiBi on both corpora at 1e-3 (not CHOICE's rates), seeds 0-2, with the probes at
    a half and three quarters of training, in sweeps under <root>/along; composed and validated as Hydra will."""
    proc, commands = dry_run(tmp_path, "experiments/lost_in_the_middle/v4/run.sh", "along")
    assert proc.returncode == 0, proc.stderr
    dirs = {a.removeprefix("hydra.sweep.dir=") for c in commands for a in c if a.startswith("hydra.sweep.dir=")}
    assert dirs == {f"{tmp_path}/root/along/sweep-{s}.{c}" for s in ("rope", "alibi") for c in ("stdlib", "django_docs")}
    cfg = compose(one_job(commands[-1]))
    validate(cfg)
    assert cfg.optim.lr == 1e-3 and cfg.seed == 0 and "along" in cfg.tags and cfg.data.recall_mix == 0.25
    assert list(cfg.eval.at) == [0.5, 0.75] and cfg.eval.at_probes and cfg.probes.enabled
    assert all("seed=0,1,2" in c for c in commands)

def test_the_fox_gate_check_is_the_second_arms_fox_row_with_the_gates_started_at_five(tmp_path):
    """fox-gate: FoX on both corpora at 1e-3, seeds 0-2, under <root>/fox_gate, differing from the second arm's FoX
    jobs in pe.gate_bias_init alone (composed and validated as Hydra will)."""
    proc, commands = dry_run(tmp_path, "experiments/lost_in_the_middle/v4/run.sh", "fox-gate")
    assert proc.returncode == 0, proc.stderr
    dirs = {a.removeprefix("hydra.sweep.dir=") for c in commands for a in c if a.startswith("hydra.sweep.dir=")}
    assert dirs == {f"{tmp_path}/root/fox_gate/sweep-fox.{c}" for c in ("stdlib", "django_docs")}
    _, second = dry_run(tmp_path, "experiments/lost_in_the_middle/v4/run.sh", "lr1e-3-descriptive")
    for corpus in ("stdlib", "django_docs"):
        gate = compose(one_job(next(c for c in commands if f"data={corpus}" in c)))
        plain = compose(one_job(next(c for c in second if "pe=fox" in c and f"data={corpus}" in c)))
        validate(gate)
        assert gate.pe.name == "fox" and gate.pe.gate_bias_init == 5.0 and plain.pe.gate_bias_init == 0.0
        assert gate.optim.lr == plain.optim.lr == 1e-3 and gate.seed == plain.seed == 0
        plain.pe.gate_bias_init, plain.tags = 5.0, gate.tags  # the one change, and the tag that names the check
        assert gate == plain
    assert all("seed=0,1,2" in c for c in commands)


def test_the_retrieval_studys_ruler_phase_runs_every_kind_for_each_question_scheme(tmp_path):
    proc, commands = dry_run(tmp_path, "experiments/lost_in_the_middle/v4/run.sh", "ruler")
    assert proc.returncode == 0, proc.stderr
    runs = {a.split("/")[-1] for c in commands for a in c if a.startswith("hydra.run.dir=")}
    kinds = ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe"]
    assert runs == {f"{pe}-{k}-L128-s0" for pe in ("rope", "alibi", "fire", "nope") for k in kinds}
    cfg = compose(one_job(next(c for c in commands if "pe=fire" in c and "experiment=ruler_vt" in c)))
    validate(cfg)
    assert cfg.pe.name == "fire" and cfg.data.source == "stdlib"


def test_context_extension_runs_on_prose_the_parent_at_the_rope_rate_and_the_arms_at_half(tmp_path):
    proc, commands = dry_run(tmp_path, "experiments/context_extension/v4/run.sh", SEEDS="0 1")
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in commands if c[0] == "train.py"]
    assert len(trains) == 2 * 4 and len(commands) - len(trains) == 2 * 7  # per seed: parent, 3 arms; 7 methods
    for c in trains:
        cfg = compose(one_job(c))
        validate(cfg)
        parent = "-m" not in c
        assert cfg.data.source == "django_docs" and cfg.pe.name == "rope"
        assert cfg.optim.lr == pytest.approx(CHOICE["rope"]["django_docs"] / (1 if parent else 2))
    evals = {a.split("=")[1] for c in commands if c[0] == "eval.py" for a in c if a.startswith("pe.scaling.type=")}
    assert {"rerope", "string", "yarn", "linear"} <= evals


def test_the_context_extension_along_arm_evaluates_every_trained_arm_during_training_and_nothing_training_free(
        tmp_path):
    """`run.sh along` (README.md, "Along training"): seeds 0-2 into <root>/along, the parents trained again as in the
    main runs, every fine-tuned arm and the control also evaluated at a half and three quarters of its steps (probes
    included), no eval.py; the same rates as the main runs."""
    proc, commands = dry_run(tmp_path, "experiments/context_extension/v4/run.sh", "along")
    assert proc.returncode == 0, proc.stderr
    assert commands and all(c[0] == "train.py" for c in commands)  # no training-free evaluation
    parents = [c for c in commands if "-m" not in c]
    arms = [c for c in commands if "-m" in c]
    assert sorted(a for c in parents for a in c if a.startswith("seed=")) == ["seed=0", "seed=1", "seed=2"]
    assert len(arms) == 3 * 3  # per seed: full (PI, YaRN), PoSE (PI, YaRN), the control
    for c in commands:
        folder = next(a for a in c if a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))).split("=", 1)[1]
        assert folder.startswith(f"{tmp_path}/root/along/")
        cfg = compose(one_job(c))
        validate(cfg)
        parent = c in parents
        assert cfg.data.source == "django_docs"
        assert cfg.optim.lr == pytest.approx(CHOICE["rope"]["django_docs"] / (1 if parent else 2))
        assert (list(cfg.eval.at), cfg.eval.at_probes) == (([], False) if parent else ([0.5, 0.75], True))


def test_context_extension_by_default_trains_the_parent_at_its_own_rates_file_not_the_grids(tmp_path):
    """No CHOICE: the study's rates.json (1e-3 for RoPE on prose, decided before any run), the arms at half."""
    env = {k: v for k, v in os.environ.items() if k != "CHOICE"}
    proc = subprocess.run(["bash", str(ROOT / "experiments/context_extension/v4/run.sh"), str(tmp_path / "root")],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
                          env={**env, "DRY_RUN": "1", "SEEDS": "0", "VENV_PY": sys.executable})
    assert proc.returncode == 0, proc.stderr
    rates = sorted(a for line in proc.stdout.splitlines() if line.startswith("train.py") for a in line.split()
                   if a.startswith("optim.lr="))
    assert rates == ["optim.lr=0.0005"] * 3 + ["optim.lr=0.001"]  # the fine-tuned arms and the control; the parent


@pytest.mark.parametrize("script, args, missing", [
    ("experiments/length_extrapolation/v4/run.sh", ["questions"], "rnope_swa on corpus django_docs"),
    ("experiments/lost_in_the_middle/v4/run.sh", ["descriptive"], "fox on corpus django_docs"),
    ("experiments/context_extension/v4/run.sh", [], "rope on corpus django_docs"),
])
def test_a_missing_rate_stops_the_launch_in_one_line_before_anything_is_written(tmp_path, script, args, missing):
    scheme, corpus = missing.split(" on corpus ")
    choice = {s: dict(c) for s, c in CHOICE.items()}
    del choice[scheme][corpus]
    env = {k: v for k, v in os.environ.items() if k != "DRY_RUN"}  # a real launch, not a dry run
    (tmp_path / "choice.json").write_text(json.dumps(choice))
    root = tmp_path / "root"
    proc = subprocess.run(["bash", str(ROOT / script), *args, str(root)], capture_output=True, text=True, timeout=60,
                          env={**env, "CHOICE": str(tmp_path / "choice.json"), "VENV_PY": sys.executable},
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"{tmp_path}/choice.json has no rate for scheme {missing}: run that cell of the grid and choose.py"]
    assert not root.exists()
    proc, _ = dry_run(tmp_path, script, *args, choice=None)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"no {tmp_path}/absent.json: run the learning-rate grid and its choose.py first (experiments/lr_grid/README.md)"]


def test_the_gpu_plan_runs_every_study_with_its_declared_seeds_on_the_gpu(tmp_path):
    """experiments/gpu/studies_v4.sh: each v4 study's own script with EXTRA's GPU arguments on every training job,
    the declared seeds in one go (8 for the questions' schemes, 3 descriptive and along training, 20
    context-extension parents: its re-estimate's), each study into a folder of its own under the root."""
    gpu = ["trainer=gpu", "trainer.precision=bf16-mixed"]
    proc, commands = dry_run(tmp_path, "experiments/gpu/studies_v4.sh")
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in commands if c[0] == "train.py"]
    assert all(set(gpu) <= set(c) for c in trains)
    seeds = {}  # (study, swept seeds) -> sweeps; context extension: one parent per seed
    for c in trains:
        args = dict(a.split("=", 1) for a in c[1:] if "=" in a)
        folder = args.get("hydra.sweep.dir") or args["hydra.run.dir"]
        study = folder.removeprefix(f"{tmp_path}/root/").split("/")[0]
        key = (study, args["seed"] if "-m" in c else "parent")
        seeds[key] = seeds.get(key, 0) + 1
    eight, three = "0,1,2,3,4,5,6,7", "0,1,2"
    assert seeds[("length_extrapolation", eight)] == 8 and seeds[("length_extrapolation", three)] == 10
    assert seeds[("lost_in_the_middle", eight)] == 16  # two arms
    assert seeds[("lost_in_the_middle", three)] == 6 + 4  # the second arm's descriptive rows, the along arm
    second_arm = [c for c in trains if any(a.startswith(f"hydra.sweep.dir={tmp_path}/root/lost_in_the_middle/lr1e-3/")
                                           for a in c)]
    assert len(second_arm) == 8 + 6 and all("optim.lr=0.001" in c for c in second_arm)
    parents = {c[2] for c in trains if "experiment=context_extension" in c}
    assert parents == {f"seed={s}" for s in range(20)}
    for study in ("length_extrapolation", "lost_in_the_middle", "context_extension"):  # one job each, as Hydra will
        c = next(c for c in trains if f"experiment={study}" in c)
        cfg = compose(one_job(c))
        validate(cfg)
        assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"


def test_the_queue_runs_whats_left_of_the_v4_studies_in_order_and_skips_collected_seeds(tmp_path):
    """experiments/v4_queue.sh: the context extension's seeds not collected whole yet (of its twenty), then the
    retrieval study's along-training arm, descriptive rows at 1e-3 and RULER phase, then the length-extrapolation
    descriptive rows, each its study's own script; SKIP leaves a phase out."""
    proc = subprocess.run(["bash", str(ROOT / "experiments/v4_queue.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DRY_RUN": "1", "SKIP": "ruler", "VENV_PY": sys.executable},
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    phases = [line.split("queue: ")[1].split(":")[0].split(" ")[0] for line in proc.stderr.splitlines() if "queue: " in line]
    collected = {int(d.name[1:]) for d in (ROOT / "experiments/context_extension/v4/runs/control").glob("s*")}
    left = [s for s in range(20) if s not in collected]
    assert phases == ["context_extension"] * bool(left) + ["along", "lr1e-3-descriptive", "ruler", "le-descriptive",
                                                           "ce-along", "every"]
    assert "ruler skipped (SKIP)" in proc.stderr
    if left:
        assert f"seeds {' '.join(map(str, left))} " in proc.stdout  # the context extension's launch line
    sweeps = [a for line in proc.stdout.splitlines() for a in line.split() if a.startswith("hydra.sweep.dir=")]
    assert any("/lost_in_the_middle_v4/along/" in a for a in sweeps)
    assert any("/length_extrapolation_v4/sweep-fox." in a for a in sweeps)

def pinned_commit(tmp_path, root, restore) -> subprocess.CompletedProcess:
    script = f'. "{ROOT}/experiments/pinned.sh"; RESTORE="{restore}" pinned_commit "{root}"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "VENV_PY": sys.executable}, stdin=subprocess.DEVNULL)


def test_a_study_relaunched_on_a_new_machine_goes_on_with_the_commit_its_collected_runs_ran(tmp_path):
    """No <root>/COMMIT (the machine that held it is gone): the commit of the runs collected from that root, not HEAD;
    runs of another root do not count; runs of two commits stop the launch with one line."""
    root, runs = tmp_path / "lr_grid", tmp_path / "runs"

    def run(name: str, out, commit: str) -> None:
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(json.dumps(
            {"status": "ok", "output_dir": str(out / name), "provenance": {"code": {"git": commit}}}))

    run("0_a", root / "sweep-plain", "a" * 40)
    run("1_a", root / "sweep-fox", "a" * 40)
    run("0_b", tmp_path / "other" / "sweep-plain", "b" * 40)
    proc = pinned_commit(tmp_path, root, runs)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "a" * 40 == (root / "COMMIT").read_text().strip()
    run("2_c", root / "sweep-plain", "c" * 40)
    (root / "COMMIT").unlink()
    proc = pinned_commit(tmp_path, root, runs)
    assert proc.returncode != 0 and "from more than one commit" in proc.stderr and "COMMIT" in proc.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert pinned_commit(tmp_path, tmp_path / "fresh", runs).stdout.strip() == head  # nothing collected from it


def test_a_study_in_a_session_of_its_own_nices_its_scheduler_group_and_a_dry_run_does_not():
    """With the kernel's autogroups a process's nice holds only inside its session: pinned.sh nices the group of a
    study launched with setsid (as the READMEs launch them), so that a test suite or CI in another session keeps the
    CPU; a dry run, or a script sourced inside another session (a terminal), leaves its group as it was."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("no scheduler autogroups on this kernel")
    script = f'. "{ROOT}/experiments/pinned.sh"; cat /proc/$$/autogroup'

    def group(*launcher: str, **env: str) -> str:  # "/autogroup-<id> nice <n>"
        out = subprocess.run([*launcher, "bash", "-c", script], capture_output=True, text=True, timeout=30, check=True,
                             env={**os.environ, "VENV_PY": sys.executable, **env}, stdin=subprocess.DEVNULL)
        return out.stdout.strip()

    assert group("setsid", "--wait").endswith(" nice 10")
    assert group("setsid", "--wait", DRY_RUN="1").endswith(" nice 0")
    # This session's group, unchanged. The kernel prints nothing for a process in its default group (a session that
    # never called setsid, as CI's pytest under the init process): then the script's line is as empty as this one's.
    assert group() == Path("/proc/self/autogroup").read_text().strip()
