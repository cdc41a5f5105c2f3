"""Checkpoints (pelab.training.checkpoints): another run's checkpoint is refused before any work, a truncated one is
a one-line error (train.py and eval.py), eval of a checkpoint with another encoding or vocabulary is refused, and
last.ckpt follows every validation while best.ckpt keeps the best.

Moved from tests/test_reliability.py (split by concern); the other bad inputs: tests/test_bad_inputs.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers.resume import RESUME
from helpers.runs import FAST, ONE_THREAD, compose, csv_rows, load_checkpoint, run_cli, summary_of
from pelab.errors import CheckpointError
from pelab.tasks.train import train


@pytest.mark.parametrize("overrides, setting", [
    (["model.d_model=64"], "model.d_model=32 in the checkpoint but 64 now"),
    (["tokenizer=bpe"], "tokenizer.kind='byte' in the checkpoint but 'bpe' now"),
    (["pe=alibi"], "pe.name='rope' in the checkpoint but 'alibi' now"),
])
def test_resuming_another_runs_checkpoint_is_refused_before_any_work(reference, overrides, setting, tmp_path):
    ckpt = reference / "checkpoints" / "last.ckpt"
    cfg = compose([*RESUME, "logger=csv", f"ckpt_path={ckpt}", *overrides], tmp_path)
    with pytest.raises(CheckpointError, match=f"ckpt_path={ckpt} belongs to another run: .*{setting}"):
        train(cfg)
    assert "data" not in summary_of(tmp_path)  # refused before the data was built


def test_truncated_checkpoint_is_a_clear_error(reference, tmp_path):
    data = (reference / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"ckpt_path={bad} is not a readable checkpoint"):
        train(compose([*RESUME, "logger=csv", f"ckpt_path={bad}"], tmp_path / "run"))


@pytest.mark.slow
def test_eval_py_prints_one_line_for_a_corrupted_checkpoint(reference, tmp_path):
    data = (reference / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    res = run_cli([f"ckpt_path={bad}", f"paths.output_dir={tmp_path / 'eval'}", "logger=csv"], cwd=tmp_path,
                  script="eval.py", env=ONE_THREAD, timeout=180)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"Error: ckpt_path={bad} is not a readable checkpoint")
    assert summary_of(tmp_path / "eval")["status"] == "failed"


def test_eval_of_a_checkpoint_with_another_encoding_or_vocabulary_is_refused(reference, tmp_path):
    from pelab.errors import ConfigError
    from pelab.tasks.evaluate import evaluate, merged_config

    ckpt = load_checkpoint(reference / "checkpoints" / "last.ckpt")
    eval_cfg = compose(["pe=alibi"], config_name="eval", output_dir=tmp_path)
    with pytest.raises(ConfigError, match="pe=alibi does not fit this checkpoint, trained with pe=rope"):
        merged_config(ckpt["hyper_parameters"]["cfg"], eval_cfg, ["pe"])

    # The tokenizer changed since training: the vocabulary no longer matches the weights.
    ckpt["hyper_parameters"]["vocab_size"] = 300
    other = tmp_path / "other-vocab.ckpt"
    torch.save(ckpt, other)
    cfg = compose([f"ckpt_path={other}", "logger=csv"], config_name="eval", output_dir=tmp_path / "eval")
    with pytest.raises(ConfigError, match="vocabulary has 300 ids but its tokenizer now gives 385"):
        evaluate(cfg)


@pytest.mark.slow
def test_last_ckpt_is_the_last_validation_even_when_validation_got_worse(tmp_path):
    """Validations after step 20 are made worse: best.ckpt stays at 20 while last.ckpt follows every validation
    to the end (Lightning alone left it at the last improvement, so eval.py and extend.from read old weights)."""
    out = tmp_path / "run"
    s = train(compose([*FAST, "logger=csv", "evaluate_after_fit=false", "trainer.max_steps=40",
                       "trainer.val_check_interval=10", "+callbacks.worse._target_=helpers.callbacks.WorsenAfter",
                       "+callbacks.worse.step=30"], out))
    vals = [float(r["val/ppl"]) for r in csv_rows(out) if r.get("val/ppl")]
    assert len(vals) == 4 and min(vals) == vals[1] < vals[2] and vals[1] < vals[3]  # best at 20, worse after
    assert load_checkpoint(out / "checkpoints" / "last.ckpt")["global_step"] == s["global_step"] == 40
    assert load_checkpoint(out / "checkpoints" / "best.ckpt")["global_step"] == 20


# -- the decisions, unit by unit (milliseconds) ------------------------------------------------------------
def test_checkpoint_mismatches_name_the_weight_defining_settings_only(reference):
    """Another model, encoding or tokenizer is named (name/kind first); what does not change the weights (dropout,
    the attention kernel, RoPE's scaling at evaluation) is not."""
    import copy

    from pelab.training.checkpoints import checkpoint_mismatches

    cfg = load_checkpoint(reference / "checkpoints" / "last.ckpt")["hyper_parameters"]["cfg"]
    assert checkpoint_mismatches(cfg, cfg) == []
    now = copy.deepcopy(cfg)
    now["model"].update(dropout=0.0, attn_backend="flex", n_layers=3)
    now["pe"]["scaling"] = {**now["pe"]["scaling"], "type": "yarn", "factor": 4.0}
    now["tokenizer"]["reserved_keys"] = 8
    now["model"]["added_since"] = True  # a key the checkpoint predates
    assert checkpoint_mismatches(cfg, now) == ["model.n_layers=2 in the checkpoint but 3 now",
                                               "tokenizer.reserved_keys=64 in the checkpoint but 8 now"]
    now["pe"] = {**copy.deepcopy(cfg["pe"]), "name": "alibi", "_target_": "pelab.encodings.bias.ALiBi"}
    assert checkpoint_mismatches(cfg, now)[1] == "pe.name='rope' in the checkpoint but 'alibi' now"


def test_a_checkpoint_whose_config_names_the_former_module_paths_still_loads(reference, tmp_path):
    """Run folders and checkpoints written before the harness was split into pelab.training and pelab.runs record
    `_target_: pelab.harness.*` in their config. Those strings are never instantiated again: the checkpoint pickles
    no pelab class, eval.py rebuilds the model from model.* / pe.*, and a resume compares the defining settings
    only."""
    import copy
    import io
    import pickletools
    import zipfile

    from pelab.runs.folder import check_resume_checkpoint
    from pelab.tasks.evaluate import checkpoint_settings, load_model

    path = reference / "checkpoints" / "last.ckpt"
    with zipfile.ZipFile(path) as z:
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    imported, strings = [], []  # the modules a load imports: GLOBAL names one, STACK_GLOBAL the last two strings
    for op, arg, _ in pickletools.genops(io.BytesIO(pickled)):
        strings += [arg] if isinstance(arg, str) else []
        imported += [arg.split()[0]] if op.name == "GLOBAL" else [strings[-2]] if op.name == "STACK_GLOBAL" else []
    assert imported and not [m for m in imported if m.startswith("pelab")], imported

    ckpt = load_checkpoint(path)
    now = ckpt["hyper_parameters"]["cfg"]
    before = copy.deepcopy(now)
    former = {"RunCheckpoint": "pelab.harness.callbacks", "ResumableCSVLogger": "pelab.harness.loggers",
              "SafeWandbLogger": "pelab.harness.loggers"}
    entries = [e for group in ("callbacks", "logger") for e in before[group].values() if isinstance(e, dict)]
    for entry in entries:
        name = entry["_target_"].rpartition(".")[2]
        entry["_target_"] = f"{former[name]}.{name}"
    assert len(entries) >= 2
    ckpt["hyper_parameters"]["cfg"] = before
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)

    eval_cfg = compose([f"ckpt_path={old}"], config_name="eval", output_dir=tmp_path / "eval")
    merged, _, _ = checkpoint_settings(before, eval_cfg, [])
    model = load_model(merged, load_checkpoint(old), int(ckpt["hyper_parameters"]["vocab_size"]))
    assert model.num_params() > 0
    assert check_resume_checkpoint(str(old), now, same_run=True)[0] == ckpt["global_step"]  # ckpt_path=auto


def old_datamodule_group(cfg: dict, key: str = "source") -> dict:
    """`cfg` as recorded before the data group named its DataModule: a `datamodule` group held the `_target_`, the
    data config under `key` (`source` before 84642c5, then `data`) and the tokenizer; `data` had no `_target_`."""
    import copy

    old = copy.deepcopy(cfg)
    data = {k: v for k, v in old["data"].items() if k != "_target_"}
    old["datamodule"] = {"_target_": old["data"]["_target_"], key: copy.deepcopy(data),
                         "tokenizer": copy.deepcopy(old["tokenizer"])}
    old["data"] = data
    return old


@pytest.mark.parametrize("key", ["source", "data"])
def test_a_checkpoint_config_with_a_datamodule_group_builds_its_datamodule(reference, key):
    """A run recorded before the data group named its DataModule has a `datamodule` group (its data config under
    `source`, later `data`) and no data._target_; what builds a checkpoint's own DataModule again (eval.py,
    pelab.lm_eval, pelab.export) reads it through `todays_form`, which moves the `_target_` into `data`."""
    from omegaconf import OmegaConf

    from pelab.errors import ConfigError
    from pelab.runs.build import build_datamodule
    from pelab.tasks.evaluate import todays_form

    ckpt = load_checkpoint(reference / "checkpoints" / "last.ckpt")
    now = ckpt["hyper_parameters"]["cfg"]
    assert "datamodule" not in now and now["data"]["_target_"] == "pelab.data.datamodule.LMDataModule"
    old = old_datamodule_group(now, key)
    assert todays_form(old) == todays_form(now) == now
    with pytest.raises(ConfigError, match=r"data\._target_ is not set"):  # the recorded config as it is
        build_datamodule(OmegaConf.create(old), 1)
    dm = build_datamodule(OmegaConf.create(todays_form(old)), 1)
    dm.setup("validate")
    assert dm.vocab_size == ckpt["hyper_parameters"]["vocab_size"]


def test_todays_form_takes_the_datamodule_of_the_recorded_group_else_the_loader_files():
    """An induction-heads run's recorded `datamodule._target_` is kept (not conf/data/_loader.yaml's); a record
    with no datamodule group at all takes the file's."""
    from omegaconf import OmegaConf

    from pelab.tasks.evaluate import todays_form

    cfg = compose(["experiment=induction_heads"])
    now = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("data", "tokenizer")}
    assert now["data"]["_target_"] == "pelab.data.recall.induction_data.InductionDataModule"
    old = old_datamodule_group(now)
    assert todays_form(old)["data"] == todays_form(now)["data"] == now["data"]
    assert "datamodule" not in todays_form(old)
    older = {k: v for k, v in old.items() if k != "datamodule"}
    assert todays_form(older)["data"]["_target_"] == "pelab.data.datamodule.LMDataModule"
