"""Bad input is one line naming the key, before any data, model or training cost (README "Bad inputs"): the
one table of bad settings (bad checkpoints, signals and faults: tests/test_reliability.py).

Most cases run in-process through `validate_config` on real Hydra compositions (an import of torch per CLI
subprocess costs seconds); a few representative ones run the real `python train.py` and check that nothing
was built: no token cache, no checkpoint, no model in the summary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

from helpers.runs import CONF_DIR, FAST, STUDY_PRESETS, compose, run_cli, study_preset
from pelab.data.config import LOADER_KEYS
from pelab.errors import ConfigError, is_user_error
from pelab.tasks.config import validate
from pelab.tasks.train import train, validate_config

BAD = [
    # (overrides, the key the one-line message must name) -- issue 15 / 16 cases first
    (["trainer.max_steps=abc"], "trainer.max_steps"),
    (["seed=abc"], "seed"),
    (["model.n_heads=0"], "model.n_heads"),  # was a ZeroDivisionError
    (["model.d_model=0"], "model.d_model"),
    (["model.dropout=1.5"], "model.dropout"),
    (["optim.lr=-1"], "optim.lr"),
    (["probes.depths=[1.5]"], "probes.depths"),  # was an error after the whole training
    (["probes.kinds=[bogus]"], "probes.kinds"),
    (["probes.samples=0"], "probes.samples"),
    (["eval.protocols=[bogus]"], "eval.protocols"),
    # types, unknown and missing keys
    (["data.seq_len=abc"], "data.seq_len"),
    (["probes.depths=[a]"], "probes.depths[0]"),
    (["probes.depths=0.5"], "probes.depths"),
    (["compile=maybe"], "compile"),
    (["matmul_precision=tf32"], "matmul_precision"),
    (["threads=0"], "threads"),
    (["threads=many"], "threads"),
    (["provenance.allow_dirty=maybe"], "provenance.allow_dirty"),
    (["model.n_heads=null"], "model.n_heads"),
    (["+model.n_kv_heads=2"], "model.n_kv_heads"),
    (["model.name=???"], "model.name"),
    (["probes.lengths=${eval.nothing}"], "probes.lengths"),
    # ranges
    (["model.d_model=48", "model.n_heads=5"], "model.n_heads"),
    (["data.recall_mix=1.5"], "data.recall_mix"),
    (["data.recall_loss=values"], "data.recall_loss"),
    (["optim.betas=[0.9]"], "optim.betas"),
    (["optim._target_=no_such_module.build"], "optim._target_"),
    (["trainer.val_check_interval=0.5"], "trainer.val_check_interval"),
    (["trainer.precision=bogus"], "trainer.precision"),
    (["trainer.devices=0"], "trainer.devices"),
    # Lightning Trainer keywords passed through (Lightning takes them and fails mid-fit: issue 58)
    (["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches"),  # was a ZeroDivisionError
    (["+trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches"),
    (["+trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch"),
    (["seed=-1"], "seed"),
    (["eval.split=dev"], "eval.split"),
    (["eval.at=[0.5,1.5]"], "eval.at"),
    (["eval.at=[0]"], "eval.at"),
    (["eval.at_probes=true"], "eval.at_probes"),  # no eval.at point to probe at
    (["eval.at=[0.5]", "eval.at_probes=true", "probes.enabled=false"], "eval.at_probes"),  # no probes to run
    (["eval.tokens=0"], "eval.tokens"),
    # pe: each encoding's own schema (pelab.encodings.resolve_pe_config)
    (["pe=kerple", "pe.variant=bogus"], "pe.variant"),
    (["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction"),
    (["pe=rope", "pe.scaling.type=bogus"], "pe.scaling.type"),
    (["pe=rope", "pe.scaling.factor=0"], "pe.scaling.factor"),
]


def _ids(cases):
    return [" ".join(o) for o, _ in cases]


def _fails_naming(overrides: list[str], key: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(compose([*FAST, *overrides]))
    message = str(err.value)
    assert f"{key}=" in message or f"{key} " in message or f"{key}:" in message, message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("overrides, key", BAD, ids=_ids(BAD))
def test_bad_setting_is_one_line_naming_it(overrides, key):
    _fails_naming(overrides, key)


def test_the_message_says_what_the_value_must_be():
    assert "converted to Integer" in _fails_naming(["trainer.max_steps=abc"], "trainer.max_steps")
    assert "[0, 1]" in _fails_naming(["probes.depths=[0.5,1.5]"], "probes.depths")
    assert "[kv, passkey, mqar," in _fails_naming(["probes.kinds=[kv,bogus]"], "probes.kinds")


# -- recall settings, on the default config (the fast settings above turn the recall mix off) ------------


@pytest.mark.parametrize("overrides, key", [
    (["probes.kinds=[mqar,bogus]"], "probes.kinds"),
    (["data.recall_kinds=[mqar_offset]"], "data.recall_kinds"),  # a probe, not a training kind
    (["data.recall_kinds=[mqar]", "data.recall_pairs=40"], "data.recall_pairs"),  # 4 x 40 > seq_len + 1
    (["probes.kinds=[mqar]", "probes.pairs=70", "tokenizer.reserved_keys=100", "tokenizer.reserved_values=100"],
     "probes.pairs"),  # 2 x 70 + 2 > the shortest probe length
    (["probes.kinds=[mqar]", "tokenizer.reserved_keys=4"], "tokenizer.reserved_keys"),  # fewer keys than pairs
    (["probes.kinds=[passkey_single]", "tokenizer.reserved_values=0"], "tokenizer.reserved_values"),
    (["tokenizer.reserved_values=100000"], "tokenizer.reserved_values"),  # larger than allowed
    (["tokenizer.reserved_keys=-1"], "tokenizer.reserved_keys"),
    (["data.recall_curriculum=[0,32]"], "data.recall_curriculum"),  # not a list of [step, span]
    (["data.recall_curriculum=[[10,32],[5,64]]"], "data.recall_curriculum"),  # steps out of order
    (["data.recall_curriculum=[[0,32,1.5]]"], "data.recall_curriculum"),  # a share outside [0, 1]
    (["data.recall_kinds=[mqar]", "data.recall_curriculum=[[0,16]]"], "data.recall_curriculum"),  # < 4 x pairs
    (["data.recall_loss=two_mean"], "data.recall_loss"),
    (["probes.prefix_multiples=[0,-1]"], "probes.prefix_multiples"),
])
def test_bad_recall_settings_fail_in_one_line_naming_them(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate_config(compose(overrides))
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message, message


def test_every_recall_setting_together_is_valid():
    validate_config(compose(["data.recall_loss=two_means", "data.recall_kinds=[mqar,kv_single,passkey_single,kv,passkey]",
                      "data.recall_curriculum=[[0,32],[200,64],[400,128]]",
                      "probes.kinds=[mqar,mqar_offset,kv_single,passkey_single,kv,passkey]"]))


# -- unknown config options, and settings whose check needs the run (files, devices, checkpoints) ------
@pytest.mark.parametrize("group, known", [("pe", ["rope", "alibi", "learned"]), ("model", ["micro", "tiny"]),
                                          ("data", ["stdlib", "text_dir"])])
def test_unknown_option_lists_the_available_ones(group, known, tmp_path):
    with pytest.raises(MissingConfigException) as err:
        compose([*FAST, f"{group}=bogus"], tmp_path)
    assert "bogus" in str(err.value) and all(name in str(err.value) for name in known)


BAD_INPUTS = [
    # (overrides, the setting the message must name)
    (["model.n_heads=3"], "model.n_heads"),
    (["model.attn_backend=fast"], "model.attn_backend"),
    (["pe=rope", "pe.randomized.max_position=16"], "pe.randomized.max_position"),
    (["data.seq_len=0"], "data.seq_len"),
    (["data.seq_len=-8"], "data.seq_len"),
    (["data.batch_size=0"], "data.batch_size"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["eval.lengths=[0,1]"], "eval.lengths"),
    (["probes.lengths=[-1]"], "probes.lengths"),
    (["probes.lengths=[0]"], "probes.lengths=[0]: probes.lengths entries must be positive"),
    (["trainer=ddp_sim", "data.batch_size=7"], "data.batch_size"),
    (["pe=learned", "pe.max_position=16"], "pe.max_position"),
    (["optim.nonfinite=maybe"], "optim.nonfinite"),
    (["callbacks.checkpoint.every_n_steps=0"], "callbacks.checkpoint.every_n_steps"),
    (["callbacks.throughput.available_flops=-1"], "callbacks.throughput.available_flops"),
    (["debug.emulate_world_size=3"], "debug.emulate_world_size"),
    (["ckpt_path={tmp}/nothing.ckpt"], "ckpt_path"),
    (["ckpt_path={tmp}/empty"], "ckpt_path={tmp}/empty is a folder without checkpoints"),
    (["data=text_dir"], "data.path"),
    (["data=text_dir", "data.path={tmp}/missing"], "data.path"),
    (["data=text_dir", "data.path={tmp}/empty"], "data.glob"),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, setting", BAD_INPUTS, ids=[" ".join(o) for o, _ in BAD_INPUTS])
def test_bad_input_is_a_one_line_error_naming_the_setting_before_training(overrides, setting, tmp_path):
    (tmp_path / "empty").mkdir()
    out, setting = tmp_path / "run", setting.format(tmp=tmp_path)
    cfg = compose([*FAST, "logger=csv", *[o.format(tmp=tmp_path) for o in overrides]], out)
    with pytest.raises(Exception) as err:
        train(cfg)
    assert is_user_error(err.value), repr(err.value)  # printed as `Error: ...`, no traceback
    message = str(err.value)
    assert setting in message and "\n" not in message
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and setting in summary["error"]
    assert "model" not in summary and not (out / "checkpoints").exists()  # failed before any training


# -- through the real command line: exit 1, one `Error:` line, nothing built --------------------------
def _fails_before_any_cost(args: list[str], key: str, tmp_path: Path) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    out = run_cli([*FAST, "logger=csv", f"hydra.run.dir={run}", *args], cwd=tmp_path, timeout=180,
                  env={"PELAB_CACHE_DIR": str(cache), "PYTHONPROFILEIMPORTTIME": "1"})  # python -X importtime
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    stderr = "\n".join(line for line in out.stderr.splitlines() if not line.startswith("import time:"))
    assert out.returncode == 1, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and key in errors[0], stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == errors[0]
    assert "Traceback" not in stderr + out.stdout
    # the refusal is the config layer's alone: none of the training stack's imports (about 3 s of CPU) are paid
    assert not {"torch", "lightning", "scipy.stats", "wandb"} & imported, sorted(imported & {"torch", "lightning", "scipy.stats", "wandb"})
    assert not cache.exists() or not any(cache.iterdir()), "a token cache was built"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and key in summary["error"]
    assert "data" not in summary and "model" not in summary and not (run / "checkpoints").exists()


CLI_BAD = [
    (["trainer.max_steps=abc"], "trainer.max_steps"),  # a type
    (["probes.depths=[1.5]"], "probes.depths"),  # a range (was an error after the whole training)
    (["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction"),  # an encoding's own check
]


@pytest.mark.slow
@pytest.mark.parametrize("args, key", CLI_BAD, ids=_ids(CLI_BAD))
def test_cli_bad_input_stops_before_any_cost(args, key, tmp_path):
    _fails_before_any_cost(args, key, tmp_path)


# -- the shipped configs --------------------------------------------------------------------------------
def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml") if not p.stem.startswith("_"))


# the `???` of those configs (a text folder is checked on disk: it must exist and hold a matching file)
REQUIRED = {"text_dir": ["data.path={texts}"], "hf": ["data.name=org/corpus"]}


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in ("model", "data", "trainer", "pe", "experiment")
                                    for o in _options(g)] + [f"experiment={o}" for o in STUDY_PRESETS])
def test_every_shipped_config_passes_validation(choice, tmp_path):
    (tmp_path / "a.txt").write_text("some text")
    option = choice.split("=")[1]
    chosen = study_preset(option) if choice.startswith("experiment=") and option in STUDY_PRESETS else [choice]
    validate_config(compose([*chosen, *(o.format(texts=tmp_path) for o in REQUIRED.get(option, []))]))


@pytest.mark.parametrize("corpus", [o for o in _options("data") if o != "stdlib"])
def test_the_corpus_choice_changes_only_the_corpus(corpus):
    """Every data config composes the same loader settings (conf/data/_loader.yaml): switching corpus
    never changes the training length or the mix."""
    data, default = compose([f"data={corpus}"]).data, compose([]).data
    assert {k: data[k] for k in LOADER_KEYS} == {k: default[k] for k in LOADER_KEYS}


def test_probe_key_lengths_follow_the_training_mix():
    cfg = compose(["data.recall_key_len=5", "data.recall_value_len=2"])
    assert (cfg.probes.key_len, cfg.probes.value_len) == (5, 2)
    assert compose(["data.recall_key_len=5", "probes.key_len=4"]).probes.key_len == 4  # still settable


# -- limits known once the data is built: before the first step ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("overrides, key", [
    (["data.seq_len=8192", "eval.lengths=[1]"], "data.seq_len=8192"),  # a training step: 8 x 8192 tokens
    (["data.batch_size=4096"], "data.batch_size=4096"),
    (["eval.lengths=[2048]", "eval.batch_tokens=4000000"], "eval.batch_tokens=4000000"),
    (["probes.samples=1000000000"], "probes.samples=1000000000"),  # was a numpy allocation traceback after training
])
def test_a_step_that_cannot_fit_in_memory_is_refused_before_training(overrides, key, tmp_path, monkeypatch):
    """The estimate of a training step / the evaluation against the memory available (here 0.5 GB, injected):
    one line naming the setting and the estimate, before the first step."""
    monkeypatch.setenv("PELAB_AVAILABLE_MEMORY", "5e8")
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}.* needs about [\d.]+ GB .* more than the 0.5 GB"):
        train(compose([*FAST, "logger=csv", *overrides], out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "global_step" not in summary and not (out / "checkpoints").exists()


@pytest.mark.slow
def test_an_evaluation_budget_larger_than_the_split_is_refused_before_training(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"eval.tokens=100000000 is more than the test split holds"):
        train(compose([*FAST, "logger=csv", "eval.tokens=100000000"], out))
    monkeypatch.setenv("PELAB_AVAILABLE_MEMORY", str(1e15))  # the split's check, not the memory one before the data
    with pytest.raises(ConfigError, match=r"eval.split=test has \d+ tokens, fewer than one window"):
        train(compose([*FAST, "logger=csv", "eval.lengths=[10000000]"], tmp_path / "run2"))
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("added, message", [
    ("+foo=1", "+foo is not a setting any config reads"),
    ("+logger.foo=1", "+logger.foo is not a setting any config reads (did you mean logger."),
    ("+data.seq_length=256", "+data.seq_length is not a setting any config reads (did you mean data.seq_len?)"),
])
def test_an_added_key_no_config_reads_is_refused_naming_the_nearest(added, message):
    overrides = [*FAST, added]
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), overrides)
    assert str(err.value).startswith(message) and "+extra.*" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("added", ["+extra.note=hi", "+trainer.gradient_clip_val=1", "+hydra.job.env_set.X=1",
                                   "+callbacks.mine._target_=lightning.pytorch.callbacks.Timer"])
def test_the_documented_additions_pass(added):
    overrides = [*FAST, added]
    validate(compose(overrides), overrides)


# -- before Hydra starts the job: the environment, every bad value of a sweep, the folders ---------------
def _one_error_line(out) -> str:
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error: ")]
    assert out.returncode == 1 and len(errors) == 1 and "Traceback" not in out.stderr + out.stdout, out.stderr[-2000:]
    return errors[0]


def test_a_sweep_with_several_unknown_values_names_them_all(tmp_path):
    out = run_cli(["-m", "pe=rope,bogus,alibi,bogus2", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path,
                  timeout=120)
    line = _one_error_line(out)
    assert "pe=bogus, pe=bogus2" in line and "known pe: alibi" in line
    assert not (tmp_path / "sweep").exists()  # no job started


@pytest.mark.parametrize("env, setting", [({"WANDB_MODE": ""}, "WANDB_MODE=''"),
                                          ({"WANDB_MODE": "sometimes"}, "WANDB_MODE='sometimes'"),
                                          ({"PELAB_OUTPUT_DIR": "{file}"}, "PELAB_OUTPUT_DIR="),
                                          ({"PELAB_CACHE_DIR": "{file}/cache"}, "PELAB_CACHE_DIR=")])
def test_environment_variables_are_input_too(env, setting, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    env = {k: v.format(file=tmp_path / "a_file") for k, v in env.items()}
    out = run_cli([*FAST], cwd=tmp_path, timeout=120, env=env)
    assert setting in _one_error_line(out)


@pytest.mark.parametrize("folder, message", [("{file}/run", "is not a folder"),
                                             ("", "is empty, which would write the run into the current folder")])
def test_a_run_folder_that_cannot_be_made_is_one_line_naming_the_setting(folder, message, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    out = run_cli([*FAST, f"hydra.run.dir={folder.format(file=tmp_path / 'a_file')}"], cwd=tmp_path, timeout=120)
    line = _one_error_line(out)
    assert "hydra.run.dir" in line and message in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written, the current folder included


def test_a_full_disk_anywhere_in_the_chain_is_one_line_naming_the_path():
    import errno

    from pelab.tasks.preflight import os_error_line

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints/last.ckpt")
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 123") from inner
    except RuntimeError as err:
        line = os_error_line(err)
    assert line.startswith("No space left on device writing /runs/x/checkpoints/last.ckpt")
    assert "hydra.run.dir" in line and os_error_line(RuntimeError("other")) is None


def test_a_read_only_place_is_not_writable_and_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """A read-only folder has no space to free; a write that fills the disk (an OSError without a file name) names
    the file it was writing: a checkpoint, summary.json."""
    import errno

    import torch

    from pelab.summary import write_summary
    from pelab.tasks.preflight import os_error_line
    from pelab.training.checkpoints import AtomicCheckpointIO

    line = os_error_line(OSError(errno.EROFS, "Read-only file system", "/runs/x/summary.json"))
    assert line.startswith("Read-only file system writing /runs/x/summary.json: not writable; point hydra.run.dir")
    assert "free space" not in line

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write into an open file raises it

    def full_zip(*args, **kwargs):  # torch.save: the zip writer's RuntimeError, the OSError its context
        try:
            full()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 163840 vs 163732") from None

    monkeypatch.setattr(torch, "save", full_zip)
    with pytest.raises(OSError) as err:
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "checkpoints" / "last.ckpt")
    assert os_error_line(err.value).startswith(f"No space left on device writing {tmp_path}/checkpoints/last.ckpt;")
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no temporary file left
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as err:
        write_summary(tmp_path, {"status": "running"})
    assert os_error_line(err.value).startswith(f"No space left on device writing {tmp_path}/summary.json;")


# -- the evaluation's cost, known before training (issue 58) --------------------------------------------------------
def test_the_evaluations_cost_is_estimated_before_training_and_warned_above_the_trainings(caplog):
    from types import SimpleNamespace

    from pelab.runs.eval_cost import (
        EvalCost,
        estimate_eval_cost,
        extrapolation_flops,
        forward_flops_per_token,
        report_eval_cost,
    )

    assert forward_flops_per_token(1000, 2, 32, 128) == 2 * 1000 + 4 * 2 * 32 * 128
    once = extrapolation_flops(1000, 2, 32, [512], 4096, 128, sliding=False)
    assert extrapolation_flops(1000, 2, 32, [512], 4096, 128, sliding=True) == 5 * once  # + 512 / 128 re-reads
    # a micro model stand-in: what the estimate reads of the GPT
    model = SimpleNamespace(matmul_params=lambda: 30_000, config=SimpleNamespace(n_layers=2, d_model=32))

    def cost(*overrides: str) -> EvalCost:
        settings = validate_config(compose([*FAST, *overrides]))
        per_token = 6.0 * 30_000 + 12 * 2 * 32 * settings.data.seq_len
        return estimate_eval_cost(settings, model, 1_000_000, per_token)

    small, long = cost(), cost("data.seq_len=4096", "eval.lengths=[1,2,4,8]", "eval.tokens=null")
    assert small.ratio < 1 < long.ratio and small.probes > 0 and cost("probes.enabled=false").probes == 0
    # eval.at: one point (step 15 of 30), its perplexity on eval.tokens (nonoverlap only), the probes too with
    # eval.at_probes; counted in the ratio and said in the line
    at, probed = cost("eval.at=[0.5]"), cost("eval.at=[0.5]", "eval.at_probes=true")
    assert (small.points, small.along, at.points) == (0, 0.0, 1)
    assert at.along == pytest.approx(extrapolation_flops(30_000, 2, 32, [32, 64], 256, 32, sliding=False))
    assert probed.along == pytest.approx(at.along + probed.probes) and probed.ratio > at.ratio > small.ratio
    assert "; during training (eval.at, 1 point): about " in at.line() and "during" not in small.line()
    assert at.record()["along_training_points"] == 1
    with caplog.at_level("INFO", logger="pelab.runs.eval_cost"):
        report_eval_cost(small)
        report_eval_cost(long)
        report_eval_cost(EvalCost(extrapolation=2e9, probes=0.0, training=1e9))  # a smoke run's: no warning
    info, warning, smoke = caplog.records[-3:]
    assert smoke.levelname == "INFO"
    assert info.levelname == "INFO" and info.getMessage().startswith("evaluation after training: about ")
    assert warning.levelname == "WARNING" and "the evaluation costs more than the training" in warning.getMessage()
