"""A bad setting is refused before torch, Lightning or W&B is imported (issue 48: an answer in about a second,
not after seconds of imports), and the command line composes the config once (Hydra's composition; the folder
checks are Hydra's callback `pelab.tasks.preflight.Preflight`).

The check is behavioural: the subprocess runs with stand-in `torch`, `lightning` and `wandb` packages first on
its path that raise on import, so any import of them before the refusal fails the launch with a traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from helpers.runs import FAST, ROOT, run_cli

HEAVY = ("torch", "lightning", "wandb")


def _no_heavy_imports(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with stand-ins of the heavy packages that fail on import."""
    stubs = tmp_path / "stubs"
    for name in HEAVY:
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.py").write_text(f"raise ImportError('{name} was imported before the refusal')\n")
    return {"PYTHONPATH": os.pathsep.join([str(stubs), str(ROOT / "src")])}


@pytest.mark.slow
@pytest.mark.parametrize("args, key", [
    (["model.n_heads=0"], "model.n_heads"),  # the model's schema
    (["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction"),  # an encoding's own check
    (["probes.depths=[1.5]"], "probes.depths"),  # the evaluation's schema
    (["trainer.max_steps=abc"], "trainer.max_steps"),  # a type
    (["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches"),  # a Trainer keyword's own rule
])
def test_a_bad_setting_is_refused_before_torch_lightning_or_wandb_is_imported(args, key, tmp_path):
    run = tmp_path / "run"
    out = run_cli([*FAST, "logger=csv", f"hydra.run.dir={run}", *args], cwd=tmp_path, timeout=120,
                  env=_no_heavy_imports(tmp_path))
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and key in last, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())  # the failure is on record, as before
    assert summary["status"] == "failed" and key in summary["error"]
    assert summary["versions"]["torch"] and summary["versions"]["lightning"]  # read from package metadata


def test_the_stand_ins_do_fail_a_launch_that_imports_torch(tmp_path):
    """The check above can fail: a valid setting goes on to build the model, which imports torch."""
    out = run_cli([*FAST, "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120,
                  env=_no_heavy_imports(tmp_path))
    assert out.returncode != 0 and "was imported before the refusal" in out.stderr


def test_pelab_composes_no_config_of_its_own_before_hydra(tmp_path):
    """Hydra composes (its own `get_mode` and `run`: two loads); the preflight reads the command line and the
    conf/ folders only, and the folder checks run on Hydra's config (it composed a second time before)."""
    probe = tmp_path / "count.py"
    probe.write_text(
        "import runpy, sys\n"
        "import hydra._internal.config_loader_impl as impl\n"
        "calls = []\n"
        "orig = impl.ConfigLoaderImpl.load_configuration\n"
        "def counted(self, *a, **k):\n"
        "    calls.append(1)\n"
        "    return orig(self, *a, **k)\n"
        "impl.ConfigLoaderImpl.load_configuration = counted\n"
        "import atexit\n"
        "atexit.register(lambda: print(f'compositions={len(calls)}', file=sys.stderr))\n"
        f"sys.argv = [{str(ROOT / 'train.py')!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n")
    import subprocess

    out = subprocess.run([sys.executable, str(probe), *FAST, "logger=csv", f"hydra.run.dir={tmp_path / 'run'}",
                          "model.n_heads=0"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert "compositions=2" in out.stderr  # Hydra 1.3: get_mode + run; the old preflight made 3, out.stderr[-2000:]
    assert "Error: model.n_heads" in out.stderr


# -- Hydra's own errors as one line (pelab.tasks.hydra_errors; issue 58) ------------------------------------------
def test_an_override_hydra_cannot_apply_is_one_line_with_the_near_key():
    from hydra.errors import ConfigCompositionException

    from helpers.runs import compose
    from pelab.tasks.hydra_errors import hydra_error_line, one_edit_away

    def line_for(override: str) -> str:
        with pytest.raises(ConfigCompositionException) as err:
            compose([override])
        return hydra_error_line(err.value, ["debug=fast", override])

    assert line_for("trainer.max_step=5") == (
        "trainer.max_step=5: no config has the key trainer.max_step (did you mean trainer.max_steps?); to add a key "
        "the configs do not have, write +trainer.max_step=5 (quote values with spaces: \"key=a value\").")
    assert "(did you mean" not in line_for("trainer.accumulate_grad_batches=0")  # a Lightning keyword: needs +
    assert "did you mean eval.lengths?" in line_for("eval.lenghts=[1]")  # neighbours swapped: one edit
    assert one_edit_away("seeed", ["name", "seed"]) == "seed" and one_edit_away("sd", ["seed"]) is None


def test_an_override_hydra_cannot_parse_is_one_line_with_the_quoting_hint():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from pelab.tasks.hydra_errors import hydra_error_line

    split = ("'run' is not an override (key=value): the shell split a value at a space; quote values with spaces "
             "as one argument: \"hydra.run.dir=/tmp/my run\".")
    broken = ("the override 'x=[1,2' cannot be parsed (no viable alternative at input '[1,2'); quote values with "
              "spaces or special characters")
    for argv, line in ((["hydra.run.dir=/tmp/my", "run"], split), (["x=[1,2"], broken)):
        with pytest.raises(OverrideParseException) as err:
            OverridesParser.create().parse_overrides(argv)
        assert hydra_error_line(err.value, argv).startswith(line)
    assert hydra_error_line(ValueError("a bug"), []) is None  # Hydra's own report (with its traceback)


@pytest.mark.slow
def test_hydras_errors_end_on_one_line_through_both_entry_points(tmp_path):
    """The wiring: Hydra's report replaced for train.py and eval.py (a typo; a value split at a space)."""
    for script, args, text in (("train.py", ["trainer.max_step=5"], "did you mean trainer.max_steps?"),
                               ("eval.py", ["ckpt_path=x.ckpt", f"hydra.run.dir={tmp_path}/my", "run"],
                                "quote values with spaces")):
        out = run_cli([*args], cwd=tmp_path, timeout=120, script=script)
        assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith("Error: "), out.stderr[-2000:]
        assert text in out.stderr and "HYDRA_FULL_ERROR" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("flag", [["-cd", "{dir}"], ["--config-dir", "{dir}"], ["--config-dir={dir}"]])
def test_a_frozen_study_preset_is_found_in_the_folder_the_command_line_adds(flag, monkeypatch):
    """`python train.py -cd experiments/<study>/conf experiment=<study>_v2`: the group choices are looked up in
    conf/ and in the folder Hydra's --config-dir adds; a choice in neither is still named with the options of both."""
    from helpers.runs import STUDY_PRESETS
    from pelab import CONF_DIR
    from pelab.errors import ConfigError
    from pelab.tasks.preflight import check_command_line

    folder = STUDY_PRESETS["length_extrapolation_v1"].relative_to(ROOT)
    added = [f.format(dir=folder) for f in flag]
    monkeypatch.chdir(ROOT)  # a relative folder, as the study READMEs write it, is Hydra's from the current one
    check_command_line([*added, "-m", "experiment=length_extrapolation_v1", "pe=rope,alibi"], CONF_DIR)
    with pytest.raises(ConfigError, match=r"^no config for experiment=length_extrapolation_v1 \(known "):
        check_command_line(["experiment=length_extrapolation_v1"], CONF_DIR)  # without the folder
    with pytest.raises(ConfigError, match=r"no config for experiment=length_extrapolation_v9 \(known experiment: "
                                          r".*length_extrapolation, length_extrapolation_v1, lost_in_the_middle"):
        check_command_line([*added, "experiment=length_extrapolation_v9"], CONF_DIR)
