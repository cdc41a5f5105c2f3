"""eval.py's validation pass (as train.py's): the command line refused in one line naming the key before torch,
Lightning or W&B is imported; the checkpoint's config typed and range-checked at its training length before any
data or model is built; and a checkpoint's config written before a key existed brought to today's form in one
place (`pelab.tasks.evaluate.todays_form`), its missing values read from the conf/ files, never from a default
written again in the code."""

from __future__ import annotations

import zipfile

import pytest
from omegaconf import OmegaConf

from helpers.runs import FAST, compose, run_cli
from pelab.errors import ConfigError
from test_preflight import _no_heavy_imports


def fake_checkpoint(path):
    """A zip file: what the command line's check sees of a checkpoint before torch reads it."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"not read before torch")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("args, key", [
    (["eval.lengths=[abc]"], "eval.lengths"),  # a type, in the evaluation's schema
    (["probes.samples=many"], "probes.samples"),
    (["device=tpu"], "device"),
    (["scaling_sweep=yarn"], "scaling_sweep"),
    (["+data.seq_len=64"], "data.seq_len"),  # the checkpoint's: eval.py does not change it
    (["ckpt_path=missing.ckpt"], "ckpt_path"),
    (["ckpt_path=cut.ckpt"], "ckpt_path"),  # cut short: its zip directory is gone
])
def test_a_bad_eval_command_is_refused_before_torch_lightning_or_wandb_is_imported(args, key, tmp_path):
    good = fake_checkpoint(tmp_path / "good.ckpt")
    (tmp_path / "cut.ckpt").write_bytes(good.read_bytes()[:40])
    out = run_cli([f"ckpt_path={good}", f"hydra.run.dir={tmp_path / 'run'}", "logger=csv", *args], cwd=tmp_path,
                  timeout=120, env=_no_heavy_imports(tmp_path), script="eval.py")
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and key in last, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


def old_checkpoint_config(tmp_path) -> dict:
    """A training config as an older run recorded it: no eval.seed, eval.diagnostics, probes.filler,
    probes.prefix_multiples or data.recall_pairs (keys added since), and eval.every_n_val (removed since)."""
    cfg = OmegaConf.to_container(compose([*FAST], tmp_path), resolve=True)
    for group, key in (("eval", "seed"), ("eval", "diagnostics"), ("probes", "filler"),
                       ("probes", "prefix_multiples"), ("data", "recall_pairs")):
        del cfg[group][key]
    cfg["eval"]["every_n_val"] = 2
    return cfg


def test_an_old_checkpoint_config_takes_the_missing_values_from_the_conf_files(tmp_path):
    from pelab.tasks.evaluate import checkpoint_settings

    eval_cfg = compose(["ckpt_path=x.ckpt"], tmp_path, config_name="eval")
    merged, (ev, probes), variants = checkpoint_settings(old_checkpoint_config(tmp_path), eval_cfg, [])
    assert (ev.seed, ev.diagnostics.enabled, ev.diagnostics.windows) == (0, False, 2)  # conf/eval/default.yaml
    assert (probes.filler, probes.prefix_multiples) == ("val", [0, 1, 3, 7])  # conf/probes/default.yaml
    assert probes.pairs == merged.data.recall_pairs == 8  # conf/data/_loader.yaml, which probes.pairs follows
    assert "every_n_val" not in merged.eval and variants == [None]
    # a config written now is taken as it is
    now = OmegaConf.to_container(compose([*FAST, "eval.seed=3"], tmp_path), resolve=True)
    assert checkpoint_settings(now, eval_cfg, [])[1][0].seed == 3


def test_the_checkpoints_training_length_checks_the_eval_overrides(tmp_path):
    """A range that depends on the checkpoint (its data.seq_len) is checked once it is read, before any data."""
    from pelab.tasks.evaluate import checkpoint_settings

    train_cfg = OmegaConf.to_container(compose([*FAST], tmp_path), resolve=True)  # data.seq_len=32
    for override, key in (("eval.protocols=[bogus]", "eval.protocols"), ("eval.lengths=[0.01]", "eval.lengths"),
                          ("probes.lengths=[0.01]", "probes.lengths")):
        eval_cfg = compose(["ckpt_path=x.ckpt", override], tmp_path, config_name="eval")
        with pytest.raises(ConfigError, match=rf"^{key}="):
            checkpoint_settings(train_cfg, eval_cfg, [override.split("=")[0]])


def test_partial_tokenizer_data_and_wandb_configs_take_their_files_values():
    """What a hand-built or older config lacks comes from its conf/ file: the token-cache key of a bare bpe config
    is the one the code's own defaults gave before (conf/tokenizer/bpe.yaml), a bare W&B config starts the
    project of conf/logger/wandb.yaml."""
    from pelab.data.sources import source_settings
    from pelab.data.tokenizer import tokenizer_fingerprint
    from pelab.runs.loggers import wandb_values

    assert tokenizer_fingerprint({"kind": "bpe"}) == {"kind": "bpe", "vocab_size": 4096, "min_frequency": 2,
                                                      "train_bytes": 8_000_000, "reserved_keys": 64,
                                                      "reserved_values": 64}
    assert tokenizer_fingerprint("byte") == {"kind": "byte", "reserved_keys": 64, "reserved_values": 64}
    text = source_settings({"source": "text_dir", "path": "texts"})
    assert (text["glob"], text["encoding"], text["val_fraction"]) == ("**/*.txt", "utf-8", 0.02)
    w = wandb_values({"mode": "offline"})
    assert (w["project"], w["job_type"], w["init_timeout"], w["mode"]) == ("pelab", "train", 20, "offline")


# -- eval.py's folder and checkpoint (issue 58) --------------------------------------------------------------
def test_eval_refuses_a_training_runs_folder_and_takes_an_evaluations_or_a_new_one(tmp_path):
    import json

    from pelab.tasks.preflight import check_eval_folder, check_not_a_training_run

    trained, evaluated, killed, new = (tmp_path / n for n in ("trained", "evaluated", "killed", "new"))
    for folder, record in ((trained, {"status": "ok", "name": "rope"}), (evaluated, {"status": "ok", "task": "eval"})):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(record))
    (killed / "checkpoints").mkdir(parents=True)  # a run killed before its first summary write: still a run
    for folder in (trained, killed):
        with pytest.raises(ConfigError, match=rf"hydra\.run\.dir={folder} holds a training run: eval\.py writes its "
                                              r"own summary\.json and W&B run"):
            check_not_a_training_run(folder, "hydra.run.dir")
    check_not_a_training_run(evaluated, "hydra.run.dir")  # an evaluation rerun in its own folder
    check_not_a_training_run(new, "hydra.run.dir")
    # Hydra's callback checks eval.py's folder only (train.py's relaunch rules are its own)
    with pytest.raises(ConfigError, match="holds a training run"):
        check_eval_folder(OmegaConf.create({"task": "eval", "hydra": {"run": {"dir": str(trained)}}}), "hydra.run.dir")
    check_eval_folder(OmegaConf.create({"task": "train", "hydra": {"run": {"dir": str(trained)}}}), "hydra.run.dir")


def test_eval_ckpt_path_may_name_a_run_folder(tmp_path):
    from pelab.tasks.evaluate import checkpoint_of

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"ckpt_path=.*run is a folder without checkpoints"):
        checkpoint_of(str(tmp_path / "run"))
    last.write_bytes(b"x")
    assert checkpoint_of(str(tmp_path / "run")) == str(last)  # its newest checkpoint, as train.py takes it
    assert checkpoint_of(str(last)) == str(last)


@pytest.mark.parametrize("value", ["", " ", None])
def test_an_empty_run_folder_setting_is_refused(value, tmp_path):
    from pelab.tasks.preflight import check_folders

    config = OmegaConf.create({"hydra": {"run": {"dir": value}}, "paths": {"cache_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"hydra\.run\.dir=\s*is empty, which would write the run into the current "
                                          r"folder"):
        check_folders(config, "hydra.run.dir")


def test_a_folder_of_other_files_is_refused_unless_allowed(tmp_path):
    """A run folder belongs to PELab or is empty (both entry points: Hydra's callback)."""
    from pelab.tasks.preflight import check_run_folder_is_ours

    docs, run, empty = tmp_path / "docs", tmp_path / "run", tmp_path / "empty"
    docs.mkdir(), run.mkdir(), empty.mkdir()
    for name in ("doc1.txt", "doc2.txt", "doc3.txt", "doc4.txt"):
        (docs / name).write_text("mine")
    (run / ".hydra").mkdir()
    (run / "notes.txt").write_text("a user's notes beside a run")

    def check(folder, **paths):
        check_run_folder_is_ours(OmegaConf.create({"hydra": {"run": {"dir": str(folder)}}, "paths": paths}),
                                 "hydra.run.dir")

    with pytest.raises(ConfigError, match=rf"hydra\.run\.dir={docs} already holds files but no PELab run \(doc1\.txt, "
                                          r"doc2\.txt, doc3\.txt \(\+1 more\)\); .* paths\.allow_nonempty=true"):
        check(docs)
    check(docs, allow_nonempty=True)
    for folder in (run, empty, tmp_path / "new"):  # a run's folder (the relaunch rules decide), empty, new
        check(folder)
