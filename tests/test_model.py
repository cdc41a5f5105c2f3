"""The GPT runs every scheme through the same hooks: shapes, causality, positions, scaling switches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import OmegaConf
from torch import nn

from encoding_inputs import MICRO
from helpers.encodings import embed
from pelab.conf_values import group_yaml
from pelab.encodings import available_encodings, build_encoding, resolve_pe_config
from pelab.encodings.rotary import RoPE
from pelab.errors import PositionOutOfRange
from pelab.model import GPT, GPTConfig, build_model

V = 50
# Every registered encoding at its defaults (a scheme added under conf/pe/ is tested with no edit here), then
# knob variants; a variant named after an encoding replaces its default entry.
VARIANTS = {
    "nope": {"name": "nope"},
    "sinusoidal": {"name": "sinusoidal"},
    "learned": {"name": "learned", "max_position": 64},
    "t5_bias": {"name": "t5_bias", "num_buckets": 8, "max_distance": 16},
    "rope": {"name": "rope"},
    "rope_yarn_partial": {
        "name": "rope",
        "rotary_fraction": 0.5,
        "scaling": {"type": "yarn", "factor": 2.0},
        "train_length": 8,
    },
    "alibi": {"name": "alibi"},
    "xpos": {"name": "xpos", "scale_base": 16.0},
    "kerple_log": {"name": "kerple", "variant": "log"},
    "kerple_power": {"name": "kerple", "variant": "power"},
    "sandwich": {"name": "sandwich"},
    "fire": {"name": "fire", "init_L": 8.0},
    "cope": {"name": "cope", "max_position": 8},
    "p_rope": {"name": "rope", "frequency_fraction": 0.5},
    "randomized_alibi": {"name": "alibi", "randomized": {"max_position": 256}},
}
SCHEMES = {**{name: {"name": name, "train_length": 64} for name in available_encodings()}, **VARIANTS}


def micro(pe_cfg: dict, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = {**OmegaConf.to_container(group_yaml("model", "micro")), **overrides}
    return build_model(cfg, pe_cfg, V).eval()


def tokens(B: int = 2, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- presets and config --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "layers", "d", "heads"),
    [("micro", 2, 32, 2), ("tiny", 4, 256, 4), ("small", 6, 384, 6), ("base", 12, 768, 12)],
)
def test_model_presets(preset, layers, d, heads):
    cfg = OmegaConf.to_container(group_yaml("model", preset))
    cfg.pop("name", None)  # a label for run names, not a model field
    config = GPTConfig(vocab_size=V, **cfg).validate()
    assert (config.n_layers, config.d_model, config.n_heads, config.d_ff) == (layers, d, heads, 4 * d)
    assert config.head_dim % 2 == 0  # RoPE pairs


def test_config_and_encoding_mismatch_errors():
    with pytest.raises(ValueError, match="multiple of model.n_heads"):
        GPTConfig(vocab_size=V, n_layers=1, n_heads=3, d_model=32).validate()
    with pytest.raises(ValueError, match="model.dropout"):
        GPTConfig(vocab_size=V, n_layers=1, n_heads=2, d_model=32, dropout=1.0).validate()
    with pytest.raises(ValueError, match="built for d_model=64"):
        GPT(
            GPTConfig(vocab_size=V, n_layers=1, n_heads=2, d_model=32),
            build_encoding({"name": "nope"}, 64, 2),
        )
    model = micro({"name": "nope"})
    with pytest.raises(ValueError, match="pos must have shape"):
        model(tokens(), pos=torch.arange(5))


# ---- shapes and composition -----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
def test_logits_shape_for_every_scheme(scheme):
    model = micro(SCHEMES[scheme])
    idx = tokens(3, 10)
    logits = model(idx)
    assert logits.shape == (3, 10, V) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # explicit positions: start offset == arange; per-row (B, T) positions == each row alone
    torch.testing.assert_close(model(idx, start=5), model(idx, pos=torch.arange(5, 15)))
    pos = torch.stack([torch.arange(10), torch.arange(3, 13), torch.arange(20, 30)])
    batched = model(idx, pos=pos)
    for b in range(3):
        torch.testing.assert_close(
            batched[b : b + 1], model(idx[b : b + 1], pos=pos[b]), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned"])
def test_absolute_encodings_are_summed_into_the_embedding(scheme):
    model = micro(SCHEMES[scheme])
    idx = tokens(2, 9)
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    model(idx, start=3)
    pos = torch.arange(3, 12)
    table = embed(model.pe, torch.zeros(1, 9, 32), pos)[0]  # (T, D): what the encoding adds
    assert seen["x"].shape == (2, 9, 32)  # width unchanged: a sum, not a concatenation
    torch.testing.assert_close(seen["x"], model.tok_emb(idx) + table)


# ---- causality ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scheme", "path"),
    [(s, "default") for s in SCHEMES]
    + [(s, "chunked_bias") for s in ("alibi", "t5_bias", "kerple_log", "sandwich", "fire", "cope")],
)
def test_changing_token_t_never_changes_earlier_logits(scheme, path):
    model = micro(SCHEMES[scheme], attn_chunk_size=5)
    if path == "chunked_bias":
        model.pe.max_bias_elements = 0  # force the per-query-chunk bias
    T, t = 13, 6
    idx = tokens(2, T)
    base = model(idx)
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % V
    out = model(changed)
    torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
    assert (out[:, t:] - base[:, t:]).abs().amax(dim=-1).min() > 1e-6  # t and later do see it


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias", "kerple_power", "sandwich", "fire"])
def test_shared_and_chunked_bias_paths_agree_and_bias_is_built_once(scheme):
    cfg = resolve_pe_config(SCHEMES[scheme], d_model=32, n_heads=2, train_length=None)

    class Counting(get_class(cfg.pop("_target_"))):
        calls = 0

        def score_bias(self, q_pos, k_pos):
            type(self).calls += 1
            return super().score_bias(q_pos, k_pos)

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=V, n_layers=3, n_heads=2, d_model=32, attn_chunk_size=4)
    model = GPT(config, Counting(32, 2, **cfg)).eval()
    idx = tokens(2, 11)
    shared = model(idx)
    assert Counting.calls == 1  # once per forward, shared by the 3 layers
    model.pe.max_bias_elements = 0
    Counting.calls = 0
    chunked = model(idx)
    assert Counting.calls == 3 * math.ceil(11 / 4)  # per layer and query chunk: bounded memory
    torch.testing.assert_close(chunked, shared, atol=1e-5, rtol=1e-5)


def test_rope_tables_computed_once_per_forward():
    class Counting(RoPE):
        computed = 0

        def _inv_freq_for(self, pos):
            type(self).computed += 1
            return super()._inv_freq_for(pos)

    cfg = resolve_pe_config({"name": "rope"}, d_model=32, n_heads=2, train_length=None)
    cfg.pop("_target_")
    model = GPT(GPTConfig(vocab_size=V, n_layers=3, n_heads=2, d_model=32), Counting(32, 2, **cfg)).eval()
    model(tokens())
    model(tokens())
    assert Counting.computed == 2  # one cos/sin table per forward, reused by the 3 layers


# ---- the last block on the last rows only (probe scoring) ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "path"),
    [(s, "default") for s in SCHEMES]
    + [(s, "chunked_bias") for s in ("alibi", "t5_bias", "kerple_log", "sandwich", "fire", "cope")],
)
def test_hidden_from_index_equals_the_last_rows_of_the_whole_forward(scheme, path):
    """Rows from_index..T-1 through a last block that computes only them: the same hidden states, for
    consecutive, offset and per-row positions, within and past every scheme's fitted length (rope_yarn and
    cope fit 8 positions; 40 > 8), with query chunks of 3 (several chunks in the suffix and in the rest)."""
    model = micro(SCHEMES[scheme], attn_chunk_size=3)
    if path == "chunked_bias":
        model.pe.max_bias_elements = 0  # the per-query-chunk bias (bias_fn(q0, q1))
    with torch.no_grad():
        for T in (12, 40):
            idx = tokens(2, T, seed=T)
            gap = torch.cat([torch.arange(T // 2), torch.arange(T // 2, T) + 10])  # not consecutive
            per_row = torch.stack([torch.arange(T) + 3, gap])  # (B, T)
            for kwargs in ({}, {"start": 5}, {"pos": per_row}):
                full = model.hidden(idx, **kwargs)  # (B, T, D)
                for q0 in (0, 1, T - 7, T - 3, T - 1):
                    last = model.hidden(idx, **kwargs, from_index=q0)
                    assert last.shape == (2, T - q0, 32)
                    torch.testing.assert_close(last, full[:, q0:], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(full[:, -1], full[:, -2], atol=1e-3)  # the rows differ: a real check
        with pytest.raises(ValueError, match=r"from_index must be in \[0, 12\)"):
            model.hidden(tokens(2, 12), from_index=12)


def test_hidden_from_index_runs_the_last_block_on_those_rows_only():
    model = micro({"name": "alibi"})
    seen = []
    for block in model.blocks:
        block.mlp.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    model.hidden(tokens(2, 20), from_index=17)
    assert seen == [(2, 20, 32), (2, 3, 32)]  # the first block on every row (keys), the last on 3


def test_hidden_from_index_default_is_the_training_forward_bit_for_bit():
    """from_index=0 is today's path: the same numbers and gradients (randomized positions, dropout: same
    seed, same draws)."""
    for scheme in ("rope", "randomized_alibi", "t5_bias", "cope"):
        model = micro(SCHEMES[scheme], dropout=0.1).train()
        idx = tokens(2, 16)
        runs = []
        for kwargs in ({}, {"from_index": 0}):
            torch.manual_seed(3)
            model.zero_grad()
            h = model.hidden(idx, **kwargs)
            h.square().sum().backward()
            runs.append((h.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (h0, g0), (h1, g1) = runs
        assert torch.equal(h0, h1) and len(g0) == len(g1) and all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_hidden_from_index_through_explicit_logits_scaled_and_observed():
    """log_length scaling past the training length (queries q0..T-1 only) and an attention observer (every
    query computed and shown, then the rows sliced) give the rows of the whole forward."""
    cfg = {**OmegaConf.to_container(group_yaml("model", "micro")), "attn_chunk_size": 4}
    torch.manual_seed(0)
    model = build_model({**cfg, "attn_logit_scale": "log_length"}, {"name": "rope"}, V, train_length=8).eval()
    idx = tokens(2, 24)
    with torch.no_grad():
        full = model.hidden(idx)
        torch.manual_seed(0)
        unscaled = build_model(cfg, {"name": "rope"}, V, train_length=8).eval().hidden(idx)
        assert not torch.allclose(full[:, -1], unscaled[:, -1], atol=1e-4)  # the scaling is on at T=24 > 8
        torch.testing.assert_close(model.hidden(idx, from_index=21), full[:, 21:], atol=1e-5, rtol=1e-5)
        seen = []
        model.blocks[-1].attn.observer = lambda scores, q0: seen.append(q0)
        torch.testing.assert_close(model.hidden(idx, from_index=21), full[:, 21:], atol=1e-5, rtol=1e-5)
    assert seen == [0, 4, 8, 12, 16, 20]  # the diagnostics still see every query


# ---- positions the encoding cannot represent ---------------------------------------------------------------
def test_learned_raises_clear_error_beyond_table():
    model = micro({"name": "learned", "max_position": 16})
    model(tokens(1, 16))  # positions 0..15 fit
    with pytest.raises(PositionOutOfRange, match=r"pe.max_position=16.*got position 16"):
        model(tokens(1, 17))
    with pytest.raises(PositionOutOfRange, match="got position 20"):
        model(tokens(1, 8), start=13)
    with pytest.raises(PositionOutOfRange, match="got position 99"):
        model(tokens(1, 2), pos=torch.tensor([0, 99]))
    micro({"name": "sinusoidal"})(tokens(1, 4), start=100_000)  # unbounded schemes take any position


# ---- RoPE scaling switched at evaluation time on a checkpoint trained without it -------------------------
def test_rope_scaling_switch_on_a_trained_state_dict():
    trained = micro({"name": "rope"})
    with torch.no_grad():  # sharpen attention (a trained model's is far from uniform, init's is not)
        for block in trained.blocks:
            block.attn.qkv.weight.mul_(20)
    state = trained.state_dict()
    assert not any("inv_freq" in key for key in state)  # checkpoints carry no frequencies
    idx = tokens(2, 20)
    reference = trained(idx)
    for scaling in (
        {"type": "linear", "factor": 4.0},
        {"type": "yarn", "factor": 4.0},
        {"type": "dynamic_ntk", "factor": 4.0},
    ):
        scaled = micro({"name": "rope", "scaling": scaling, "train_length": 8}, seed=1)
        scaled.load_state_dict(state)  # strict: same keys whatever the scaling
        assert (scaled(idx) - reference).abs().max() > 1e-3
    # factor 1 behaves as none
    same = micro({"name": "rope", "scaling": {"type": "yarn", "factor": 1.0}, "train_length": 8}, seed=1)
    same.load_state_dict(state)
    torch.testing.assert_close(same(idx), reference)


# ---- parameters, init, tying, dropout, training signal ---------------------------------------------------
def test_params_init_and_weight_tying():
    nope, learned = micro({"name": "nope"}), micro({"name": "learned", "max_position": 64})
    assert learned.lm_head.weight is learned.tok_emb.weight
    assert learned.num_params(exclude_embedding=False) - nope.num_params(exclude_embedding=False) == 64 * 32
    assert learned.num_params() == nope.num_params()  # the table is excluded, and the tied head
    d, L = 32, 2
    assert nope.num_params() == L * (12 * d * d + 2 * d) + d  # no biases in the micro preset
    assert nope.matmul_params() == learned.matmul_params() == V * d + nope.num_params()  # the head's matmul
    big = build_model({"n_layers": 4, "n_heads": 4, "d_model": 128}, {"name": "nope"}, 100)
    proj_std = torch.cat([b.attn.proj.weight.flatten() for b in big.blocks]).std().item()
    assert proj_std == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.1)
    assert big.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_the_non_embedding_count_of_the_study_model_leaves_out_the_tied_embedding_and_the_encoding():
    """summary.json's model.params_non_embedding (issue 49: it equalled params, 836,864, for the 4-layer length-
    extrapolation model): every parameter outside the token embedding (= the tied head) and the encoding, counted
    from the parameter names; the FLOPs estimate's N keeps the head."""
    from pelab.training.module import flops_per_token

    vocab, d, L = 385, 128, 4  # conf/experiment/length_extrapolation.yaml, byte tokens
    for pe in ({"name": "rope"}, {"name": "fire"}, {"name": "learned", "max_position": 1024}):
        model = build_model({"n_layers": L, "n_heads": 4, "d_model": d}, pe, vocab, train_length=128)
        outside = sum(p.numel() for name, p in model.named_parameters()
                      if not name.startswith(("tok_emb.", "lm_head.", "pe.")))
        assert model.num_params(exclude_embedding=True) == outside == L * (12 * d * d + 2 * d) + d == 787_584
        pe_params = sum(p.numel() for p in model.pe.parameters())
        assert model.num_params(exclude_embedding=False) == 787_584 + vocab * d + pe_params
        assert model.matmul_params() == 787_584 + vocab * d  # what flops_per_token multiplies: unchanged
        assert flops_per_token(model, 128) == 6 * (787_584 + vocab * d) + 12 * L * d * 128


def test_dropout_is_active_only_in_training():
    model = micro({"name": "alibi"}, dropout=0.3)
    idx = tokens()
    torch.testing.assert_close(model(idx), model(idx))
    model.train()
    assert (model(idx) - model(idx)).abs().max() > 1e-4


@pytest.mark.parametrize("scheme", ["learned", "t5_bias", "kerple_log", "kerple_power", "fire", "cope"])
def test_gradients_reach_the_encoding_parameters(scheme):
    model = micro(SCHEMES[scheme]).train()
    if scheme == "cope":  # zero-initialised table: the bias and its input gradient start at 0
        torch.nn.init.normal_(model.pe.pos_emb)
    idx = tokens(2, 10)
    loss = nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    for name, p in model.pe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    grad = next(model.pe.parameters()).grad
    if scheme == "learned":  # only the rows of positions used (0..8) get a gradient
        assert grad[9:].abs().sum() == 0 and grad[:9].abs().sum(-1).min() > 0


# ---- a new scheme is one module + one YAML, no other file changes ----------------------------------------
NEW_SCHEME = """
from dataclasses import dataclass

import torch
from torch import nn

from pelab.encodings import PEConfig, PositionEncoding


class LogDistanceBias(PositionEncoding):
    \"\"\"Example new scheme (KERPLE-log-like): bias = -r_h * log(1 + distance), r_h learned.\"\"\"

    has_bias = True

    @dataclass
    class Config(PEConfig):
        init: float = 1.0

    def __init__(self, d_model, n_heads, *, init, **common):
        super().__init__(d_model, n_heads, **common)
        self.r = nn.Parameter(torch.full((n_heads,), float(init)))

    def score_bias(self, q_pos, k_pos):
        dist = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0).float()
        return -self.r[:, None, None] * torch.log1p(dist)
"""


def write_new_scheme(folder) -> str:
    """A scheme in a module of its own outside pelab, and its conf/pe YAML; returns the config folder."""
    (folder / "log_distance_pe.py").write_text(NEW_SCHEME)
    (folder / "conf" / "pe").mkdir(parents=True)
    (folder / "conf" / "pe" / "log_distance.yaml").write_text(
        "defaults:\n  - _PEConfig\n  - _self_\n_target_: log_distance_pe.LogDistanceBias\nname: log_distance\n"
        "init: 0.5\n")
    return str(folder / "conf")


def test_adding_a_scheme_needs_no_other_file(tmp_path, monkeypatch):
    from helpers.runs import compose

    monkeypatch.syspath_prepend(str(tmp_path))
    conf = write_new_scheme(tmp_path)
    cfg = compose(["pe=log_distance", f"hydra.searchpath=[file://{conf}]", "model=micro"])
    model = build_model(cfg.model, cfg.pe, V, train_length=12)
    assert type(model.pe).__name__ == "LogDistanceBias" and model.pe.num_learnable_params() == 2
    idx = tokens()
    assert model(idx).shape == (2, 12, V)
    pos = torch.arange(12)
    assert model.pe.score_bias(pos, pos)[0, 5, 2].item() == pytest.approx(-0.5 * math.log(4))
    with pytest.raises(ValueError, match="pe.init: Value 'abc'"):  # typed by its own schema
        build_model(cfg.model, {**cfg.pe, "init": "abc"}, V, train_length=12)


def test_kaiming_init_and_untied_head_are_model_options():
    tied, untied = micro({"name": "rope"}), micro({"name": "rope"}, init="kaiming", tie_embeddings=False)
    assert tied.lm_head.weight is tied.tok_emb.weight and untied.lm_head.weight is not untied.tok_emb.weight
    assert abs(tied.tok_emb.weight.std().item() - 0.02) < 0.002  # GPT-2
    # x-transformers' TransformerWrapper: kaiming-normal token embedding, std sqrt(2 / d); Linear defaults
    assert abs(untied.tok_emb.weight.std().item() - (2 / 32) ** 0.5) < 0.02
    assert abs(untied.lm_head.weight.std().item() - (3 * 32) ** -0.5) < 0.01  # U(-1/sqrt(d), 1/sqrt(d))
    xt = pytest.importorskip("x_transformers")
    peer = xt.TransformerWrapper(num_tokens=V, max_seq_len=16, attn_layers=xt.Decoder(dim=32, depth=1, heads=2))
    assert abs(peer.token_emb.emb.weight.std().item() - untied.tok_emb.weight.std().item()) < 0.02
    # the untied input embedding is a lookup: not in the 6N FLOPs count; the head's matrix is
    assert untied.matmul_params() == tied.matmul_params()
    assert untied.num_params() == tied.num_params()  # neither vocabulary matrix is a non-embedding parameter
    with pytest.raises(ValueError, match="model.init=bogus"):
        micro({"name": "rope"}, init="bogus")


# ---- every scheme in the model: causal, and a few steps lower the loss -------------------------------------
NEW = [
    {"name": "xpos"},
    {"name": "kerple", "variant": "log"},
    {"name": "kerple", "variant": "power"},
    {"name": "sandwich"},
    {"name": "fire"},
    {"name": "cope", "max_position": None},
    {"name": "rope", "frequency_fraction": 0.5},
    {"name": "alibi", "randomized": {"max_position": 512}},
]


@pytest.mark.parametrize("pe_cfg", NEW, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_new_scheme_is_causal_and_learns(pe_cfg):
    torch.manual_seed(0)
    model = build_model(MICRO, dict(pe_cfg), vocab_size=32, train_length=32)
    half = torch.randint(0, 32, (8, 16))
    data = torch.cat([half, half, half[:, :1]], dim=1)  # second half repeats the first: copyable
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses  # ln 32 = 3.47 at the start
    model.eval()
    x = torch.randint(0, 32, (2, 40))
    y = x.clone()
    y[:, 25:] = (y[:, 25:] + 1) % 32
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :25], model(y)[:, :25])  # the future does not leak back
        assert not torch.allclose(model(x)[:, 25:], model(y)[:, 25:])
