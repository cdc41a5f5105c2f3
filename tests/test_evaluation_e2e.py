"""Extrapolation evaluation through the harness: end of training, eval.py, W&B, RoPE scaling at eval time."""

from __future__ import annotations

import json
import math

import pytest

from helpers.runs import FAST, compose, offline_runs, run_cli, wandb_records, wandb_summary
from pelab.summary import as_float
from pelab.tasks.evaluate import evaluate
from pelab.tasks.train import train

# One document per split; validation uses every window of the val split, and an over-large eval.tokens
# shrinks to the same whole windows, so the extrapolation span at the training length is exactly the
# validation set.
SAME_TOKENS = ["data.max_bytes=1", "data.val_windows=null", "eval.tokens=null", "eval.split=val"]


@pytest.mark.slow
def test_nonoverlap_ppl_at_training_length_equals_val_ppl_on_the_same_tokens(tmp_path):
    cfg = compose([*FAST, *SAME_TOKENS, "pe=alibi", "logger=csv", "eval.lengths=[1]", "probes.enabled=false"],
                  tmp_path)
    m = train(cfg)["metrics"]
    assert m["extrap/ppl@32"] == pytest.approx(m["val/ppl"], rel=1e-5)
    assert m["extrap/ppl_sliding@32"] == pytest.approx(m["val/ppl"], rel=1e-5)  # S = L: same windows


@pytest.mark.slow
def test_end_of_training_evaluation_is_logged_everywhere(trained_run):
    out, summary = trained_run
    m = summary["metrics"]
    for L in (32, 64, 128):
        assert m[f"extrap/ppl@{L}"] > 1 and m[f"extrap/ppl_sliding@{L}"] > 1
        assert math.isfinite(m[f"extrap/bpb@{L}"])
    assert m["extrap/ppl_ratio@32"] == pytest.approx(1.0)
    saved = json.loads((out / "summary.json").read_text())
    cost = saved["eval_cost"]  # estimated before training (pelab.runs.eval_cost)
    assert cost["extrapolation_tflop"] > 0 and cost["probes_tflop"] > 0 and 0 < cost["ratio"] < 1
    ev = saved["evaluation"]["extrapolation"]
    assert ev["loss_by_position_length"] == 128 and len(ev["loss_by_position"]) == 128
    for png in ("ppl_vs_length", "loss_by_position", "probe_kv_heatmap", "probe_passkey_depth"):
        assert (out / "plots" / f"{png}.png").stat().st_size > 5000
    # The W&B offline run holds the scalars, the tables and the figures.
    (run,) = offline_runs(out)
    s = wandb_summary(run)["summary"]
    assert s["extrap/ppl@64"] == pytest.approx(m["extrap/ppl@64"])
    assert s["extrap/table"]["_type"] == "table-file" and s["extrap/table"]["nrows"] == 6
    assert s["probe/kv/table"]["_type"] == "table-file"
    assert s["probe/passkey/table"]["nrows"] == 5 * 2  # depths x lengths
    assert s["plots/probe_kv_heatmap"]["_type"] == "image-file"
    history = [r for r in wandb_records(run) if r.get("type") == "history"]
    assert any("train/loss" in json.dumps(h) for h in history)


@pytest.mark.slow
def test_eval_py_reproduces_the_end_of_training_numbers(trained_run, tmp_path):
    out, summary = trained_run
    res = run_cli([f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}", f"paths.output_dir={tmp_path}",
                   "logger=csv"], cwd=tmp_path, script="eval.py")
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads((tmp_path / "summary.json").read_text())["metrics"]
    for key, value in summary["metrics"].items():
        if key.startswith(("extrap/", "probe/")):
            a, b = as_float(again[key]), as_float(value)
            assert (math.isnan(a) and math.isnan(b)) or a == b, key


@pytest.mark.slow
def test_rope_scaling_at_eval_time_changes_only_lengths_past_training(trained_run, tmp_path):
    out, _ = trained_run
    ckpt = out / "checkpoints" / "last.ckpt"
    res = run_cli([f"ckpt_path={ckpt}", f"paths.output_dir={tmp_path / 'f4'}", "logger=csv", "probes.enabled=false",
                   "pe.scaling.factor=4", "scaling_sweep=[none,linear,ntk,dynamic_ntk,yarn]"],
                  cwd=tmp_path, script="eval.py")
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((tmp_path / "f4" / "summary.json").read_text())["metrics"]
    for kind in ("linear", "ntk", "dynamic_ntk", "yarn"):
        assert m[f"extrap/{kind}/ppl@128"] != m["extrap/none/ppl@128"], kind
    # dynamic NTK leaves lengths within the training window untouched.
    assert m["extrap/dynamic_ntk/ppl@32"] == pytest.approx(m["extrap/none/ppl@32"], rel=1e-6)
    # Factor 1 is no scaling for PI, NTK and YaRN (dynamic NTK still stretches past L by design). In this
    # process (the command line is covered above): `_overrides_` is what eval.py reads from Hydra's record.
    cfg1 = compose([f"ckpt_path={ckpt}", "logger=csv", "probes.enabled=false", "pe.scaling.factor=1",
                    "scaling_sweep=[none,linear,ntk,yarn]", "+_overrides_=[pe.scaling.factor]"],
                   tmp_path / "f1", config_name="eval")
    m1 = evaluate(cfg1)["metrics"]
    for kind in ("linear", "ntk", "yarn"):
        assert m1[f"extrap/{kind}/ppl@128"] == pytest.approx(m1["extrap/none/ppl@128"], rel=1e-6), kind


@pytest.mark.slow
def test_learned_positions_past_the_table_are_not_applicable(tmp_path):
    cfg = compose([*FAST, "pe=learned", "pe.max_position=64", "logger=csv", "eval.lengths=[1,2,4]",
                   "probes.lengths=[1,4]"], tmp_path)
    summary = train(cfg)
    assert summary["status"] == "ok"
    m = summary["metrics"]
    assert math.isfinite(m["extrap/ppl@64"]) and math.isnan(m["extrap/ppl@128"])
    rows = json.loads((tmp_path / "summary.json").read_text())["evaluation"]["extrapolation"]["rows"]
    note = next(r["note"] for r in rows if r["length"] == 128)
    assert note.startswith("n/a") and "63" in note
    assert math.isnan(m["probe/kv/acc@128"])


def test_scaling_a_non_rope_checkpoint_is_a_clear_error(tmp_path):
    from omegaconf import OmegaConf

    from pelab.errors import ConfigError
    from pelab.tasks.evaluate import merged_config

    cfg = compose(["pe.scaling.type=yarn"], config_name="eval", output_dir=tmp_path)
    train_cfg = OmegaConf.to_container(compose([*FAST, "pe=alibi"], tmp_path), resolve=True)
    with pytest.raises(ConfigError, match=r"pe.scaling is not a setting.*pe=alibi.*drop the override"):
        merged_config(train_cfg, cfg, ["pe.scaling.type"])


def test_an_unknown_scaling_type_in_the_sweep_is_named_by_the_encodings_own_check(tmp_path):
    from omegaconf import OmegaConf

    from pelab.errors import ConfigError
    from pelab.tasks.evaluate import scaling_variants

    merged = OmegaConf.create(OmegaConf.to_container(compose([*FAST, "pe=rope"], tmp_path), resolve=True))
    assert scaling_variants(merged, ["none", "yarn"]) == ["none", "yarn"]
    with pytest.raises(ConfigError, match=r"scaling_sweep=\['none', 'bogus'\]: pe\.scaling\.type=bogus"):
        scaling_variants(merged, ["none", "bogus"])


@pytest.mark.slow
def test_eval_without_ckpt_path_names_it(tmp_path):
    res = run_cli([f"paths.output_dir={tmp_path}", "logger=csv"], cwd=tmp_path, script="eval.py", timeout=120)
    assert res.returncode != 0
    assert "ckpt_path" in res.stderr + res.stdout


@pytest.mark.slow
def test_reported_numbers_come_from_test_and_selection_from_val(tmp_path):
    """A corpus whose validation documents repeat one byte pattern and whose test documents are random letters:
    val/ppl (what selects checkpoints) is read on the easy validation text, the reported extrapolation on the
    hard test text, and the summary says which split each is from."""
    import random

    from pelab.data.corpora import split_of

    rng, root = random.Random(0), tmp_path / "texts"
    root.mkdir()
    kinds = {"train": 0, "val": 0, "test": 0}
    for i in range(400):
        name = f"doc{i:03d}.txt"
        split = split_of(name, 0.2, 0.2)
        easy = "ab" * 400
        hard = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(800))
        text = {"val": easy, "test": hard}.get(split, easy if i % 2 else hard)
        (root / name).write_text(text)
        kinds[split] += 1
    assert min(kinds.values()) > 10
    cfg = compose([*FAST, "data=text_dir", f"data.path={root}", "data.val_fraction=0.2", "data.test_fraction=0.2",
                   "logger=csv", "probes.enabled=false", "eval.lengths=[1]", "eval.tokens=2048",
                   "trainer.max_steps=120", "trainer.val_check_interval=60"], tmp_path / "run")
    summary = train(cfg)
    m = summary["metrics"]
    assert summary["evaluation"]["extrapolation"]["split"] == "test"
    assert 3 * m["val/ppl"] < m["extrap/ppl@32"]  # "ab" repeated vs 26 random letters
    assert cfg.callbacks.checkpoint.monitor == "val/ppl"  # best.ckpt is chosen on validation
