"""experiments/peer/peer.py: x-transformers trained on PELab's batches and scored by PELab's evaluation."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from helpers.runs import FAST, ROOT, compose

pytest.importorskip("x_transformers", reason="x-transformers (the bench extra: pip install -e .[bench]) is not installed")

TINY = [*FAST, "trainer.max_steps=20", "probes.enabled=false", "eval.lengths=[1,2]", "eval.tokens=256"]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("pelab_peer", ROOT / "experiments" / "peer" / "peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_peer_evaluation_is_pelabs_own(peer, tmp_path):
    """A PELab GPT through the peer's adapter and evaluation gives PELab's numbers exactly; a length past
    the adapter's learned table is n/a (NaN with a note), as PELab's learned positions are."""
    from pelab.evaluation.suite import run_evaluation
    from pelab.model import build_model
    from pelab.runs.build import build_datamodule

    cfg = compose([*TINY, "pe=alibi"], tmp_path)
    dm = build_datamodule(cfg, int(cfg.data.batch_size))
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(0)
    gpt = build_model(cfg.model, cfg.pe, dm.vocab_size, int(cfg.data.seq_len))
    direct = run_evaluation(gpt, dm, cfg, tmp_path / "pelab")
    via_peer = peer.evaluate(peer.PeerLM(gpt), dm, cfg, tmp_path / "peer")
    nan_safe = lambda m: {k: None if math.isnan(v) else v for k, v in m.items()}
    assert nan_safe(direct) == nan_safe(via_peer) and math.isfinite(direct["extrap/ppl@64"])
    capped = peer.evaluate(peer.PeerLM(gpt, max_position=32), dm, cfg, tmp_path / "capped")
    assert capped["extrap/ppl@32"] == direct["extrap/ppl@32"] and math.isnan(capped["extrap/ppl@64"])


def test_peer_trains_on_pelab_batches_end_to_end(peer, tmp_path):
    """A few steps of x-transformers with learned positions: loss falls, summary.json in PELab's shape,
    2x L is n/a for the learned table."""
    out = tmp_path / "learned"
    assert peer.main(["--pe", "learned", "--out", str(out), "--log-every", "5", *TINY]) == 0
    from pelab.summary import read_summary

    s = read_summary(out)
    # the peer's scheme only: PELab's encoding knobs (pe.max_position, ...) are not the peer's settings
    assert s["status"] == "ok" and s["config"]["pe"] == {"name": "xt_learned"}
    assert s["peer"]["kwargs"]["decoder"]["dim"] == s["config"]["model"]["d_model"]
    # PELab's own token record, so a report over peer and PELab runs can check they saw the same tokens
    assert s["data"]["vocab_size"] == s["peer"]["kwargs"]["wrapper"]["num_tokens"]
    assert s["data"]["fingerprint"]["key"] and s["data"]["fingerprint"]["tokenizer"]["kind"] == s["config"]["tokenizer"]["kind"]
    curve = [p["loss"] for p in s["train_curve"]]
    assert curve[-1] < curve[0] - 0.3
    m = s["metrics"]
    assert math.isfinite(m["extrap/ppl@32"]) and m["extrap/ppl@32"] < math.exp(curve[0])
    assert m["extrap/ppl@64"] == "nan"
    notes = {r["length"]: r["note"] for r in s["evaluation"]["extrapolation"]["rows"]}
    assert notes[64].startswith("n/a")


def test_learned_scale_sinusoid_is_x_transformers_scaled_sinusoid():
    """pe=sinusoidal pe.scale=D^-0.5 pe.learn_scale=true is x-transformers' ScaledSinusoidalEmbedding (its
    channels are [sin..., cos...] where PELab interleaves sin, cos), with one learned scalar."""
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding

    from helpers.encodings import embed
    from pelab.encodings import build_encoding

    D, T = 32, 300
    pe = build_encoding({"name": "sinusoidal", "scale": D**-0.5, "learn_scale": True}, D, 4)
    ref = ScaledSinusoidalEmbedding(D)
    x = torch.zeros(1, T, D)
    ours = embed(pe, x, torch.arange(T))[0]  # (T, D)
    theirs = ref(x)  # (T, D)
    torch.testing.assert_close(ours[:, 0::2], theirs[:, : D // 2], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[:, 1::2], theirs[:, D // 2 :], atol=1e-4, rtol=1e-4)
    assert [p.numel() for p in pe.parameters()] == [1]
    ours.sum().backward()
    assert pe.scale.grad is not None


def test_unscaled_position_table_is_the_same_function_with_a_faster_table(peer, tmp_path):
    """--unscaled-table folds x-transformers' d^-0.5 into its learned table: logits unchanged at step 0, and
    one identical Adam step moves the table's output d^0.5 times as far as x-transformers' own."""
    cfg = compose([*TINY, "pe=learned"], tmp_path)
    torch.manual_seed(0)
    model, _ = peer.build_peer("learned", cfg, vocab_size=300)
    idx = torch.randint(0, 300, (2, 16))
    before = model(idx)
    table = model.net.pos_emb
    out_before = table.emb.weight.detach() * table.scale

    def output_step(m):  # how far one Adam step (lr 1e-2) moves the table's output rows
        w0 = m.net.pos_emb.emb.weight.detach().clone() * m.net.pos_emb.scale
        opt = torch.optim.Adam([m.net.pos_emb.emb.weight], lr=1e-2)
        m(idx).logsumexp(-1).mean().backward()
        opt.step()
        return (m.net.pos_emb.emb.weight.detach() * m.net.pos_emb.scale - w0)[:16].abs().mean()

    import copy

    scaled = copy.deepcopy(model)
    peer.unscale_position_table(model)
    assert table.scale == 1.0 and torch.allclose(table.emb.weight, out_before)
    torch.testing.assert_close(model(idx), before)
    d = cfg.model.d_model
    ratio = output_step(model) / output_step(scaled)
    assert ratio == pytest.approx(d**0.5, rel=0.05)


def test_t5_table_init_redraws_only_the_peers_t5_table(peer, tmp_path):
    """--t5-table-std=s draws x-transformers' T5 table from N(0, s) (its default is N(0, 1)); nothing else of
    the network changes, and the bias it adds changes with the table."""
    cfg = compose([*TINY, "pe=t5_bias"], tmp_path)
    torch.manual_seed(0)
    model, _ = peer.build_peer("t5_bias", cfg, vocab_size=300)
    table = model.net.attn_layers.rel_pos.relative_attention_bias.weight
    others = {n: p.detach().clone() for n, p in model.named_parameters() if "relative_attention_bias" not in n}
    idx = torch.randint(0, 300, (2, 16))
    before = model(idx)
    assert 0.7 < table.std().item() < 1.3  # x-transformers' own N(0, 1)
    torch.manual_seed(1)
    peer.init_t5_table(model, cfg.model.d_model**-0.5)
    assert table.std().item() == pytest.approx(cfg.model.d_model**-0.5, rel=0.5)  # 128 draws: within 50%
    assert all(torch.equal(p, others[n]) for n, p in model.named_parameters() if n in others)
    assert not torch.allclose(model(idx), before)


def test_tie_scale_sets_the_peers_logit_scale(peer, tmp_path):
    """--tie-scale=s multiplies the tied head's logits by s instead of x-transformers' d^-0.5: the same
    network (same seed) gives logits (s / d^-0.5) times its default ones."""
    cfg = compose([*TINY, "pe=alibi"], tmp_path)
    idx = torch.randint(0, 300, (2, 16))
    torch.manual_seed(0)
    default, _ = peer.build_peer("alibi", cfg, vocab_size=300)
    torch.manual_seed(0)
    unscaled, kwargs = peer.build_peer("alibi", cfg, vocab_size=300, tie_scale=1.0)
    assert kwargs["wrapper"]["tie_embedding_scale"] == 1.0
    d = cfg.model.d_model
    torch.testing.assert_close(unscaled(idx), default(idx) * d**0.5, rtol=1e-4, atol=1e-5)
