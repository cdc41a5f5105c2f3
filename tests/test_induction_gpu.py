"""experiments/gpu/induction_heads.py, the GPU plan of Mamba's Table 11, on the CPU: its stacked step (seeds as one
vmapped model, one AdamW over the stacked weights) is each seed's own Lightning run, step for step; a row split
over calls is the row trained in one; its folders are what compare.py reads. The CUDA-graph step is unrun here."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from helpers.runs import ROOT, compose

SMALL = ["data.seq_len=16", "model.d_model=16", "model.n_heads=2"]


@pytest.fixture(scope="module")
def gpu_plan():
    spec = importlib.util.spec_from_file_location("ih_gpu", ROOT / "experiments/gpu/induction_heads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def stacked_steps(gpu_plan, row: str, seeds: list[int], steps: int):
    cfg = gpu_plan.compose_row(row, SMALL)
    stacked = gpu_plan.Stacked.build(cfg, seeds, torch.device("cpu"))
    init = {k: v.detach().clone() for k, v in stacked.params.items()}
    rows = gpu_plan.Chunks(cfg, seeds, steps)[0]  # (steps, S, B, L + 2)
    for k in range(steps):
        stacked.step(rows[k])
    return stacked, init


@pytest.mark.slow
@pytest.mark.parametrize("row", ["xpos", "sinusoidal"])
def test_stacked_steps_are_each_seeds_lightning_run(gpu_plan, row, tmp_path):
    """Four stacked steps of seeds 0 and 1 leave each seed with the weights that `train()` (real Hydra composition
    and Trainer) leaves its run: the same init, batches, loss and Adam. xPos goes through the rotary rule under vmap
    (its scale buffers stacked too); the sinusoid adds to the embeddings."""
    from pelab.tasks.train import train

    steps, seeds = 4, [0, 1]
    stacked, init = stacked_steps(gpu_plan, row, seeds, steps)
    d, lr = int(stacked.cfg.model.d_model), float(stacked.cfg.optim.lr)
    for i, seed in enumerate(seeds):
        out = tmp_path / f"s{seed}"
        summary = train(compose(["experiment=induction_heads", *gpu_plan.ROWS[row], *SMALL, f"seed={seed}",
                                 f"trainer.max_steps={steps}", "evaluate_after_fit=false",
                                 "callbacks.checkpoint.every_n_steps=null", "callbacks.progress_bar=false",
                                 "provenance.allow_dirty=true"], out))
        assert summary["status"] == "ok"
        state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        for name, stacked_w in stacked.params.items():
            lightning_w, w = state[f"model.{name}"], stacked_w[i].detach()
            if row == "sinusoidal" and name.endswith("attn.qkv.bias"):
                # The key bias adds q.b to every logit of a query: softmax ignores it, so its gradient is rounding
                # noise (1e-10), which Adam's normalisation turns into steps of up to lr in either direction, and
                # the two paths round differently. Under RoPE / xPos the bias is rotated: a real gradient.
                keys = slice(d, 2 * d)
                assert (w[keys] - lightning_w[keys]).abs().max() <= lr * steps * 1.01
                w, lightning_w = torch.cat([w[:d], w[2 * d:]]), torch.cat([lightning_w[:d], lightning_w[2 * d:]])
            assert torch.allclose(w, lightning_w, rtol=1e-5, atol=1e-6), name
            assert not torch.equal(lightning_w, init[name][i]) or name.endswith("bias"), f"{name} did not move"
    w = stacked.params["blocks.0.attn.qkv.weight"]
    assert not torch.equal(w[0], w[1])  # two seeds, two models


def test_a_row_split_over_calls_is_the_row_in_one(gpu_plan, tmp_path):
    """--max-chunks 1 then a relaunch (the state saved, the batch stream resumed at its step) gives the weights, the
    curve and the folders of one call; compare.py reads those folders (accuracies per length, plateau criterion)."""
    def settings(out, max_chunks=None):
        s, _ = gpu_plan.parse(["--cpu-smoke", "--rows", "rope", "--out", str(out)])
        s.max_chunks = max_chunks
        return s

    whole = settings(tmp_path / "whole")
    assert [r["done"] for r in gpu_plan.run(whole)] == [True]
    split = settings(tmp_path / "split", max_chunks=1)
    first = gpu_plan.run(split)
    assert first == [{**first[0], "done": False, "step": 3}]
    split.max_chunks = None
    assert [r["done"] for r in gpu_plan.run(split)] == [True]
    a, b = (torch.load(p / "state" / "rope.pt", weights_only=False) for p in (tmp_path / "whole", tmp_path / "split"))
    assert a["step"] == b["step"] == 6 and a["history"] == b["history"]
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k
    for seed in (0, 1):
        sa, sb = (json.loads((p / "runs" / f"rope-s{seed}" / "summary.json").read_text())
                  for p in (tmp_path / "whole", tmp_path / "split"))
        assert sa["metrics"] == sb["metrics"] and sa["global_step"] == 6 and sa["config"]["seed"] == seed
        rows = sa["evaluation"]["probes"]["rows"]
        assert [(r["length"], r["n"]) for r in rows] == [(8, 6), (16, 6), (32, 4)]  # the CPU runs' caps
    spec = importlib.util.spec_from_file_location("ih_compare", ROOT / "experiments/induction_heads/compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    _, plateaus = compare.run_accuracies(tmp_path / "whole" / "runs")
    assert [name for name, _, _ in plateaus["rope"]] == ["rope-s0", "rope-s1"]
    assert all(reached is False for _, reached, _ in plateaus["rope"])  # 6 steps: nowhere near 1.000 in-window


def test_bad_settings_are_one_line(gpu_plan, tmp_path):
    s, _ = gpu_plan.parse(["--cpu-smoke", "--out", str(tmp_path), "--rows", "rope"])
    s.check_every = 4
    with pytest.raises(SystemExit, match="--check-every=4 must be a multiple of --chunk=3"):
        gpu_plan.run(s)
    s, _ = gpu_plan.parse(["--out", str(tmp_path), "--steps", "5000"])
    if s.device.type == "cpu":
        with pytest.raises(SystemExit, match="add --no-graphs"):
            gpu_plan.check(s)
    with pytest.raises(SystemExit, match="weight_decay=0"):
        gpu_plan.Stacked.build(gpu_plan.compose_row("rope", [*SMALL, "optim.weight_decay=0.1"]), [0],
                               torch.device("cpu"))
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("row", ["nope", "learned", "t5_bias", "alibi", "kerple_power", "sandwich", "fire", "cope",
                                 "p_rope", "fox"])
def test_every_schemes_stacked_loss_and_gradient_are_each_models(gpu_plan, row):
    """Issue 52's rows (and FoX) through the stacked step: each seed's loss and gradient equal its own model's, so
    the GPU plan can train every scheme (randomized positions draw per seed under vmap, checked in the smoke)."""
    overrides = ["pe=fox"] if row == "fox" else gpu_plan.ROWS[row]
    from helpers.runs import compose as hydra_compose

    cfg = hydra_compose(["experiment=induction_heads", *overrides, *SMALL])
    stacked = gpu_plan.Stacked.build(cfg, [0, 1], torch.device("cpu"))
    rows = gpu_plan.Chunks(cfg, [0, 1], 1)[0][0]  # (S, B, L + 2)
    losses = stacked.losses(rows)
    losses.sum().backward()
    for i, seed in enumerate([0, 1]):
        model = stacked.load_into(gpu_plan.build_model(cfg.model, cfg.pe, 16, 16), i)
        loss = torch.nn.functional.cross_entropy(model(rows[i, :, :-1])[:, -1], rows[i, :, -1])
        torch.testing.assert_close(losses[i], loss, rtol=1e-5, atol=1e-6)
        loss.backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(stacked.params[name].grad[i], p.grad, rtol=1e-4, atol=1e-6, msg=name)
