"""The default run (`python train.py`, README "The first run"): its recipe is pinned here, so a change to it is
deliberate, and the recipe, micro-sized, is shown to acquire retrieval through the real harness."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import pelab.tasks.names  # noqa: F401  the resolver of the run name (${pelab.sweep_suffix:})
from helpers.runs import compose


def test_the_default_config_is_the_first_run_recipe():
    """Chosen by measurement (experiments/first_run/README.md): text and mqar rows side by side, byte level,
    the retrieval model, 900 steps; probed by depth x length at 1-8 x L, 200 instances at each of 5 depths."""
    cfg = compose([])
    c = {g: OmegaConf.to_container(cfg[g], resolve=True)
         for g in ("pe", "model", "tokenizer", "data", "trainer", "optim", "eval", "probes")}
    c["threads"] = cfg.threads
    assert (c["pe"]["name"], c["model"]["name"], c["tokenizer"]["kind"], c["data"]["source"]) == \
        ("rope", "recall", "byte", "stdlib")
    assert {k: c["model"][k] for k in ("d_model", "n_layers", "n_heads", "init", "tie_embeddings")} == \
        {"d_model": 128, "n_layers": 2, "n_heads": 2, "init": "kaiming", "tie_embeddings": False}
    d = c["data"]
    assert (d["seq_len"], d["batch_size"], d["recall_mix"], d["recall_kinds"], d["recall_loss"], d["recall_pairs"]) \
        == (128, 32, 0.25, ["mqar"], "two_means", 8)
    assert d["recall_curriculum"] == [[0, 32, 0.5], [200, 64, 0.5], [400, 128, 0.25]]
    assert (c["trainer"]["max_steps"], c["trainer"]["val_check_interval"]) == (900, 300)
    o = c["optim"]
    assert (o["lr"], o["betas"], o["warmup_steps"]) == (1e-3, [0.9, 0.98], 50)
    e, p = c["eval"], c["probes"]
    assert (e["lengths"], e["tokens"], e["protocols"], e["split"]) == ([1, 2, 4, 8], 32768, ["nonoverlap"], "test")
    assert (p["kinds"], p["lengths"], p["samples"], len(p["depths"])) == (["mqar"], [1, 2, 4, 8], 200, 5)
    assert c["threads"] == "auto"


@pytest.mark.slow
def test_the_default_recipe_micro_sized_acquires_retrieval(tmp_path):
    """The default recipe (mqar rows among text, two means, the span curriculum, the retrieval model's shape and
    optimizer) at L = 32 with 4 pairs and a curriculum scaled to it, through train(): the in-window probes (200
    instances, not trained on) are above copying one of the 4 context values (0.25) by their whole interval,
    and the text perplexity is measured on text only (the evaluation split has no recall rows)."""
    from pelab.tasks.train import train

    cfg = compose(["data.seq_len=32", "data.recall_pairs=4", "data.recall_curriculum=[[0,16,0.5],[300,32,0.25]]",
                   "trainer.val_check_interval=450", "eval.lengths=[1,2]",
                   "eval.tokens=8192", "probes.lengths=[1]", "trainer=cpu", "logger=csv",
                   "callbacks.progress_bar=false", "seed=0"], tmp_path)
    summary = train(cfg)
    m = summary["metrics"]
    assert summary["status"] == "ok" and summary["global_step"] == 900
    assert summary["evaluation"]["probes"]["copy"]["mqar"] == pytest.approx(0.25)
    # measured: 0.99 [0.975, ...] (seed 0, 183 s beside four other single-thread jobs); 450 steps gave 0.24
    assert m["probe/mqar/acc_lo@32"] > 0.25 and m["probe/mqar/acc@32"] >= 0.9, m["probe/mqar/acc@32"]
    assert m["extrap/ppl@32"] < 10  # the text is learned as well (measured 6.7)
