"""experiments/induction_schemes (issue 52): the learning-rate rule stated before the runs (choose_lr.py) on hand-built
pilot folders, the run script's overrides through real Hydra composition, and its declared questions."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import sys

import pytest

from helpers.runs import ROOT, compose

HERE = ROOT / "experiments" / "induction_schemes"


@pytest.fixture(scope="module")
def choose_lr():
    spec = importlib.util.spec_from_file_location("is_choose_lr", HERE / "choose_lr.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def pilot_run(folder, pe: str, lr: float, checks: dict[int, float], step: int = 10_000) -> None:
    """A finished pilot run: summary.json and the in-window checks in csv/metrics.csv (rows name the step before)."""
    (folder / "csv").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "status": "ok", "global_step": step,
        "config": {"pe": {"name": pe}, "optim": {"lr": lr}, "trainer": {"max_steps": 10_000}}}))
    with open(folder / "csv" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "train/loss", "train/retrieval_acc"])
        w.writeheader()
        for s in range(50, step + 1, 50):  # a loss row every 50 steps, a check every 500
            w.writerow({"step": s - 1, "train/loss": 1.0, "train/retrieval_acc": checks.get(s, "")})


def checks(last: list[float], early: float = 0.0) -> dict[int, float]:
    out = {s: early for s in range(500, 8_000, 500)}  # before the last five: never read
    out.update({10_000 - 500 * i: v for i, v in enumerate(last)})
    return out


def test_the_higher_mean_of_the_last_five_checks_wins_and_a_tie_keeps_2e4(choose_lr, tmp_path):
    pilot_run(tmp_path / "a", "alibi", 2e-4, checks([0.5, 0.5, 0.4, 0.4, 0.2], early=1.0))  # mean 0.40
    pilot_run(tmp_path / "b", "alibi", 1e-3, checks([0.6, 0.5, 0.5, 0.4, 0.3]))  # mean 0.46: chosen
    pilot_run(tmp_path / "c", "nope", 2e-4, checks([0.30] * 5))
    pilot_run(tmp_path / "d", "nope", 1e-3, checks([0.30 + 1 / 512] * 5))  # within one instance in 256: a tie
    pilot_run(tmp_path / "e", "rope", 2e-4, checks([0.9] * 5))
    pilot_run(tmp_path / "f", "rope", 1e-3, checks([0.1] * 5))
    choice = choose_lr.choose(choose_lr.pilot_runs(tmp_path))
    assert {k: v["lr"] for k, v in choice.items()} == {"alibi": 1e-3, "nope": 2e-4, "rope": 2e-4}
    assert choice["alibi"]["pilot"] == pytest.approx({"0.0002": 0.40, "0.001": 0.46})
    assert "| alibi | 0.400 | 0.460 | 0.001 |" in choose_lr.table(choice)


def test_an_unfinished_or_missing_pilot_run_is_refused(choose_lr, tmp_path):
    pilot_run(tmp_path / "a", "alibi", 2e-4, checks([0.5] * 5), step=9_500)
    with pytest.raises(ValueError, match="step 9500 of 10000: not complete"):
        choose_lr.pilot_runs(tmp_path)
    (tmp_path / "a" / "summary.json").unlink()
    pilot_run(tmp_path / "b", "alibi", 2e-4, checks([0.5] * 5))
    with pytest.raises(ValueError, match="the pilot needs 2e-4 and 1e-3"):
        choose_lr.choose(choose_lr.pilot_runs(tmp_path))


def test_the_run_scripts_overrides_compose_to_the_recipe_at_the_rate():
    text = (HERE / "run.sh").read_text()
    name = re.search(r"name='(name=[^']+)'", text).group(1)
    cfg = compose(["experiment=induction_heads", "seed=3", "pe=alibi", "optim.lr=1e-3", name])
    assert cfg.name == "alibi-induction-L256-lr0.001-s3"
    assert (cfg.data.seq_len, cfg.data.batch_size, cfg.trainer.max_steps, cfg.optim.weight_decay) == (256, 8, 25000, 0)
    assert cfg.model.n_heads == 8 and cfg.model.d_model == 128 and cfg.model.d_ff == 0


def test_the_declared_questions_load_and_compare_every_run():
    from pelab.report.questions import load_questions

    decl = load_questions(HERE / "questions.yaml")
    assert decl.declared == "before the runs" and decl.retrieval_runs == "all"
    assert [(q.a, q.b, q.metric) for q in decl.questions] == [
        ("alibi", "rope", "probe/induction_heads/acc@1024"), ("nope", "rope", "probe/induction_heads/acc@512")]


def test_the_read_out_of_a_uniform_last_layer_is_one_over_the_keys(tmp_path):
    """attention.py on a checkpoint whose last layer cannot tell keys apart (NoPE, its queries zeroed: every logit
    equal): at the query the copy-reading head puts 1/K on the copy, its entropy is log K and its mass at distances
    >= 257 is the share of such keys, whatever the head; the layer diagnostics are recorded at both lengths."""
    import math

    import torch
    from omegaconf import OmegaConf

    from pelab.model import build_model

    spec = importlib.util.spec_from_file_location("is_attention", HERE / "attention.py")
    attention = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(attention)
    cfg = compose(["experiment=induction_heads", "pe=nope", "model.d_model=16", "model.n_heads=2"])
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.pe, 16, 256)
    with torch.no_grad():
        model.blocks[-1].attn.qkv.weight[:16].zero_()  # the queries' rows: every score 0
        model.blocks[-1].attn.qkv.bias[:16].zero_()
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"cfg": OmegaConf.to_container(cfg, resolve=False), "vocab_size": 16},
                "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, ckpt)
    stats = attention.run_stats(ckpt, instances=3)
    for L in (256, 2048):
        K = L + 1
        assert stats[f"readout/copy@{K}"] == pytest.approx(1 / K, rel=1e-5)
        assert stats[f"readout/entropy@{K}"] == pytest.approx(math.log(K), rel=1e-5)
        assert stats[f"readout/far@{K}"] == pytest.approx(max(0, K - 257) / K, abs=1e-6)
        assert {f"attn/entropy@{K}/layer0", f"attn/mass_past_L@{K}/layer1"} <= set(stats)


def test_attention_reuses_earlier_records_and_reads_only_the_new_runs(tmp_path, monkeypatch, capsys):
    """--records: the runs already recorded (issue 51's, a study's first seeds) are not read again, and are rendered
    with the new ones; a run in two record files is refused."""
    spec = importlib.util.spec_from_file_location("is_attention", HERE / "attention.py")
    attention = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(attention)
    sweep = tmp_path / "sweep"
    for run, scheme in (("0_rope-s1", "rope"), ("0_alibi-s4", "alibi")):
        (sweep / run / "checkpoints").mkdir(parents=True)
        (sweep / run / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint: reading it would fail")
        (sweep / run / "summary.json").write_text(json.dumps({"status": "ok", "config": {"pe": {"name": scheme},
                                                                                              "seed": 1}}))
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps([{"run": "0_rope-s1", "scheme": "rope", "seed": 1, "stats": {"readout/copy@257": 0.9}}]))
    read = []
    monkeypatch.setattr(attention, "run_stats", lambda ckpt, instances: read.append(ckpt.parent.parent.name) or
                        {"readout/copy@257": 0.5})
    monkeypatch.setattr("sys.argv", ["attention.py", str(sweep), "--records", str(earlier), "--out",
                                     str(tmp_path / "a.md")])
    attention.main()
    assert read == ["0_alibi-s4"]
    records = json.loads((tmp_path / "a.json").read_text())
    assert [(r["run"], r["stats"]["readout/copy@257"]) for r in records] == [("0_rope-s1", 0.9), ("0_alibi-s4", 0.5)]
    assert "| alibi | 1 | 0.50 (0.50-0.50)" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["attention.py", "--records", str(earlier), str(tmp_path / "a.json")])
    with pytest.raises(SystemExit) as exc:
        attention.main()
    assert exc.value.code == 2 and "run 0_rope-s1 is in more than one file" in capsys.readouterr().err


def test_the_table_reads_training_runs_and_scaling_sweeps_with_t_intervals_over_seeds(tmp_path):
    import math

    import numpy as np
    import scipy.stats

    spec = importlib.util.spec_from_file_location("is_table", HERE / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    accs = [0.70, 0.55, 0.80]
    for s, a in enumerate(accs):  # training runs of alibi, one failed run beside them
        (tmp_path / f"alibi{s}").mkdir()
        (tmp_path / f"alibi{s}" / "summary.json").write_text(json.dumps({
            "status": "ok", "config": {"pe": {"name": "alibi"}},
            "metrics": {"probe/induction_heads/acc@1024": a, "probe/induction_heads/acc@8192": float("nan")}}))
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "summary.json").write_text(json.dumps({"status": "failed", "config": {"pe": {"name": "alibi"}},
                                                                   "metrics": {"probe/induction_heads/acc@1024": 0.0}}))
    (tmp_path / "sweep").mkdir()  # eval.py's scaling sweep of a rope checkpoint
    (tmp_path / "sweep" / "summary.json").write_text(json.dumps({
        "status": "ok", "config": {"pe": {"name": "rope"}},
        "metrics": {"probe/ntk/induction_heads/acc@2048": 0.9, "probe/yarn/induction_heads/acc@2048": 0.8,
                    "probe/ntk/induction_heads/acc_lo@2048": 0.5}}))
    rows = table.row_values([tmp_path])
    assert {k: dict(v) for k, v in rows.items()} == {"alibi": {1024: accs}, "rope+ntk": {2048: [0.9]},
                                                      "rope+yarn": {2048: [0.8]}}
    half = scipy.stats.t.ppf(0.975, 2) * np.std(accs, ddof=1) / math.sqrt(3)
    mean = np.mean(accs)
    text = table.table(rows)
    assert f"| alibi | n/a | n/a | n/a | n/a | {100 * mean:.1f} [{100 * (mean - half):.1f}, {100 * min(1, mean + half):.1f}] (3) |" in text
    assert "| rope+ntk | n/a | n/a | n/a | n/a | n/a | 90.0 (1) |" in text
    table.figure(rows, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000
