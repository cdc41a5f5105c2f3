"""Context extension (train.py extend.from=...): a new run from a parent's weights, its link to the parent,
and the refusal of a parent of another shape."""

from __future__ import annotations

import pytest
import yaml

from helpers.runs import FAST, compose, offline_runs, summaries, wandb_records, wandb_summary
from pelab.errors import ConfigError
from pelab.summary import read_summary
from pelab.tasks.train import train


@pytest.fixture(scope="module")
def parent(sweep):
    """The shared sweep's rope seed-0 run (trained at L=32, evaluated at 32, 64, 128 tokens)."""
    (summary,) = [s for s in summaries(sweep) if s["config"]["pe"]["name"] == "rope" and s["config"]["seed"] == 0]
    return summary


@pytest.mark.slow
def test_extended_run_starts_from_the_parents_weights_and_records_it(parent, tmp_path):
    out = tmp_path / "child"
    # Twice the parent's length; lengths 0.5, 1, 2 x 64 = the parent's 32, 64, 128 on the same 256 tokens.
    child = train(compose([*FAST, "pe=rope", "logger=wandb", "logger.wandb.mode=offline",
                           f"extend.from={parent['output_dir']}", "extend.eval_before=true", "data.seq_len=64",
                           "eval.lengths=[0.5,1,2]", "eval.tokens=256", "probes.enabled=false",
                           "eval.diagnostics.enabled=true",
                           "trainer.max_steps=2", "trainer.val_check_interval=2"], out))
    assert child["status"] == "ok" and child["global_step"] == 2  # a new run: step 0, not the parent's 10
    m, pm = child["metrics"], parent["metrics"]
    # step 0 = the parent's own weights on the same tokens: its evaluation, exactly (CPU fp32)
    for L in (32, 64, 128):
        assert m[f"extrap/step0/ppl@{L}"] == pm[f"extrap/ppl@{L}"]
    assert m["extrap/ppl@32"] != pm["extrap/ppl@32"]  # and two steps of training changed them
    # lengths also on the parent's axis
    assert m["extrap/ppl@parent_x4"] == m["extrap/ppl@128"]
    assert child["evaluation"]["extrapolation"]["parent_train_length"] == 32
    link = child["extended_from"]
    assert link["path"].endswith("checkpoints/last.ckpt") and link["path"].startswith(parent["output_dir"])
    assert (link["train_length"], link["seq_len"], link["step"], link["name"]) == (32, 32, 10, parent["name"])
    assert link["wandb_run_id"] == parent["wandb"]["id"]  # the sweep logs to W&B offline: the parent's run
    assert child["config"]["extend"]["parent"] == link
    # the W&B config and the CSV logger's hparams.yaml have it too
    (run,) = offline_runs(out)
    configs = [r for r in wandb_records(run) if "extend" in str(r.get("config", ""))]
    assert any('"train_length":32' in str(r).replace(" ", "").replace("'", '"') for r in configs)
    # the parent's checkpoint artifact is named in the config (offline: W&B declares inputs online only), after
    # the parent's W&B run (a parent without one: the unit test below)
    assert wandb_summary(run)["config"]["extend"]["parent_artifact"] == f"model-{parent['wandb']['id']}:latest"
    hparams = yaml.safe_load((out / "csv" / "hparams.yaml").read_text())
    assert hparams["cfg"]["extend"]["parent"]["train_length"] == 32
    # attention diagnostics (eval.diagnostics.enabled): summary, PNGs, W&B table and plots, the sweep report
    att = child["evaluation"]["attention"]
    assert {r["length"] for r in att["rows"]} == {32, 64, 128} and att["seconds"] > 0
    assert child["evaluation"]["seconds"]["attention"] == att["seconds"]
    assert 0 < m["attn/mass_past_L@128"] < 1 and m["attn/mass_past_L@64"] == 0  # distances >= 64 exist at 128 only
    for stat in ("entropy", "distance", "mass_past_L", "max_logit"):
        assert (out / "plots" / f"attn_{stat}.png").stat().st_size > 5000
    s = wandb_summary(run)["summary"]
    assert s["attn/table"]["_type"] == "table-file" and s["attn/table"]["nrows"] == len(att["rows"])
    from pelab.report import build_report

    rep = build_report([out], tmp_path / "report")
    assert "## Attention diagnostics" in rep.markdown and (tmp_path / "report" / "attn_entropy_vs_length.png").is_file()


def test_the_parent_artifact_is_named_by_the_parents_wandb_run_else_by_its_folder(tmp_path):
    """Lightning's name for a run's checkpoints, model-<W&B run id>; a parent logged without W&B has no id, so its
    run folder names it. Offline, the name is only written into the child's config."""
    from types import SimpleNamespace

    from pelab.runs.loggers import use_parent_checkpoint

    class OfflineRun:  # what use_parent_checkpoint touches of a W&B run: its config and its mode
        def __init__(self):
            self.settings, self.saved = SimpleNamespace(mode="offline"), {"extend": {"from": "x"}}
            self.config = SimpleNamespace(get=self.saved.get, update=lambda d, allow_val_change: self.saved.update(d))

    ckpt = str(tmp_path / "0_rope-micro-L32-s0" / "checkpoints" / "last.ckpt")
    for wandb_run_id, name in (("h0p3tmz3", "model-h0p3tmz3"), (None, "model-0_rope-micro-L32-s0")):
        run = OfflineRun()
        assert use_parent_checkpoint(run, {"path": ckpt, "wandb_run_id": wandb_run_id}) == name
        assert run.saved["extend"] == {"from": "x", "parent_artifact": f"{name}:latest"}


@pytest.mark.parametrize("override, key", [("model.n_layers=3", "model.n_layers"), ("tokenizer=bpe", "tokenizer."),
                                           ("pe=alibi", "pe.")])
def test_a_parent_of_another_shape_is_refused_in_one_line_before_any_data(parent, tmp_path, override, key):
    cfg = compose([*FAST, "pe=rope", "logger=csv", f"extend.from={parent['output_dir']}", override], tmp_path)
    with pytest.raises(ConfigError, match=key) as err:
        train(cfg)
    assert "\n" not in str(err.value) and "extend.from=" in str(err.value)
    saved = read_summary(tmp_path)
    assert saved["status"] == "failed" and "data" not in saved  # refused before the token cache was built


def test_scaling_child_scales_relative_to_the_parents_length(parent, tmp_path):
    """pe.train_length (what PI / YaRN scale relative to) defaults to the parent's L, not the child's."""
    from pelab.training.extension import extension_parent

    cfg = compose([*FAST, "pe=rope", f"extend.from={parent['output_dir']}", "data.seq_len=128",
                   "pe.scaling.type=yarn", "pe.scaling.factor=4"], tmp_path)
    link = extension_parent(cfg)
    assert link["train_length"] == 32 and cfg.pe.train_length == 32


@pytest.mark.slow
def test_a_finished_scaling_child_is_skipped_by_a_relaunched_multirun(parent, tmp_path):
    """The child records the pe.train_length it took from its parent; the same launch again (null there) is the
    same run: skipped when finished, resumed when not, never refused as "other settings"."""
    from pelab.runs.folder import relaunch_decision
    from pelab.tasks.task import resolved_config

    out = tmp_path / "child"
    args = [*FAST, "pe=rope", "logger=csv", f"extend.from={parent['output_dir']}", "data.seq_len=64",
            "pe.scaling.type=linear", "pe.scaling.factor=2", "eval.lengths=[1]", "eval.tokens=256",
            "probes.enabled=false", "trainer.max_steps=2", "trainer.val_check_interval=2"]
    done = train(compose(args, out))
    assert done["status"] == "ok" and done["config"]["pe"]["train_length"] == 32
    again = resolved_config(compose(args, out))
    assert again["pe"]["train_length"] is None  # filled from the parent only when the run starts
    assert relaunch_decision(out, again, read_summary(out), None, multirun=True) == "skip"
    assert relaunch_decision(out, again, read_summary(out), "auto", multirun=False) == "continue"
    # and the resume itself: the checkpoint records the filled length, the launch null (a study relaunched after
    # its machine went resumes its interrupted children: issue 59's seeds 16-17)
    resumed = train(compose([*args, "ckpt_path=auto"], out))
    assert resumed["status"] == "ok" and resumed["resumed_from"]["step"] == 2
    assert resumed["metrics"]["val/ppl"] == done["metrics"]["val/ppl"]
    other = resolved_config(compose([*args, "pe.train_length=64"], out))  # a real change is still refused
    with pytest.raises(ConfigError, match="pe.train_length=32 before but 64 now"):
        relaunch_decision(out, other, read_summary(out), None, multirun=True)
