"""Per-layer layouts (model.layout): the syntax and its one-line errors, local spans (sliding window, chunk) against
a dense reference mask built here, Scalable-Softmax against its formula on explicit logits, and the model: no
layout = today's model, a span >= T = global attention, one prepare per encoding per forward."""

from __future__ import annotations

import math

import pytest
import torch

from attention_inputs import qkv, random_bias
from pelab.encodings import available_encodings, build_encoding
from pelab.encodings.config import default_pe_config, pe_settings
from pelab.errors import ConfigError
from pelab.model import GPT, GPTConfig
from pelab.model.attention.dispatch import causal_attention
from pelab.model.attention.logits import observed_attention
from pelab.model.attention.span import Span
from pelab.model.config import validate_layout
from pelab.model.layout import LayerSpec, expand_layout, parse_layer


def dense_allowed(T: int, kind: str, size: int) -> torch.Tensor:
    """(T, T) True where query i may see key j: written out per pair, independently of pelab.model.attention.span."""
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(i + 1):
            allowed[i, j] = (i - j < size) if kind == "window" else (j // size == i // size)
    return allowed


def reference(q, k, v, allowed, bias=None, logit_scale=None):
    """softmax(scale * (q k^T / sqrt(Dh) + bias) masked) v, explicit."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if logit_scale is not None:
        scores = scores * logit_scale
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


# -- syntax ------------------------------------------------------------------------------------------------
def test_layer_syntax():
    assert parse_layer("rope@chunk:32+qk_norm", "k") == LayerSpec("rope", "chunk", 32, "none", True)
    assert parse_layer("nope+llama4_temp", "k") == LayerSpec("nope", "global", 0, "llama4_temp", False)
    assert parse_layer("alibi@window:8+ssmax", "k") == LayerSpec("alibi", "window", 8, "ssmax", False)
    assert parse_layer("rope@window:8+rotate_heads:2", "k").rotate_heads == 2
    specs = expand_layout(["rope@chunk:4", "nope"], 4)
    assert [s.pe for s in specs] == ["rope", "nope", "rope", "nope"]  # a pattern repeats to n_layers


@pytest.mark.parametrize(("text", "says"), [
    ("rope@local:32", "span 'local' is unknown"), ("rope@window", "needs a size"), ("rope@global:8", "takes no size"),
    ("rope@chunk:0", "positive integer"), ("rope+hot", "modifier 'hot'"), ("nope+ssmax+llama4_temp", "two temperatures"),
    ("@chunk:8", "names no encoding"), ("rope+rotate_heads", "rotate_heads:<n>"), ("rope+rotate_heads:0", "n >= 1"),
])
def test_bad_layer_is_one_line_naming_the_key(text, says):
    with pytest.raises(ConfigError, match=r"model\.layout\[0\]") as err:
        expand_layout([text], 2)
    assert says in str(err.value) and "\n" not in str(err.value)


def run_pe(name: str, length: int | None, **knobs):
    """The run's typed pe settings, as pelab.tasks.config passes them to validate_layout."""
    return pe_settings({**default_pe_config(name), **knobs}, d_model=16, n_heads=2, train_length=length)


def test_layout_checks_against_the_run():
    config = GPTConfig(vocab_size=8, n_layers=4, n_heads=2, d_model=16, layout=["rope@chunk:32", "nope"])
    assert len(validate_layout(config, run_pe("rope", 128), 128)) == 4
    rerope = {"scaling": {"type": "rerope", "window": 8}}
    for layout, pe, length, says in [
        (["rope@chunk:32", "nope"], run_pe("alibi", 128), 128, "names no layer with the run's encoding pe=alibi"),
        (["rope@chunk:32", "nopee"], run_pe("rope", 128), 128, "'nopee' is not an encoding"),
        (["rope@window:128", "nope"], run_pe("rope", 128), 128, "not shorter than the training length 128"),
        (["rope", "nope", "rope"], run_pe("rope", 128), 128, "3 entries for model.n_layers=4"),
        (["rope", "fire"], run_pe("rope", None), None, r"model\.layout: the layers of pe fire .*pe\.init_L"),  # not the run's pe.*
        (["rope", "alibi+rotate_heads:1"], run_pe("rope", 128), 128, r"\[1\]: \+rotate_heads needs a rotary encoding; pe alibi"),
        (["rope", "fope+rotate_heads:1"], run_pe("rope", 128), 128, r"\[1\]: .*but pe fope positions every head"),
        (["rope+rotate_heads:1"], run_pe("rope", 128, **rerope), 128, r"\[0\]: .*but pe rope positions every head"),
    ]:
        config.layout = layout
        with pytest.raises(ConfigError, match=says):
            validate_layout(config, pe, length)
    config.layout = ["rope+rotate_heads:1", "xpos+rotate_heads:1", "fox", "nope"]
    validate_layout(config, run_pe("rope", 128, scaling={"type": "yarn", "factor": 2.0}), 128)


def test_the_settings_capabilities_are_the_encodings():
    """validate_layout reads rotates / rotates_head_subset from the settings, the model from the encodings."""
    for name, knobs in [*((n, {}) for n in available_encodings()), ("fox", {"rope": True}),
                        ("rope", {"scaling": {"type": "rerope", "window": 8}})]:
        settings = run_pe(name, 128, **knobs)
        pe = build_encoding({**default_pe_config(name), **knobs, "train_length": 128}, 16, 2)
        assert (settings.rotates, settings.rotates_head_subset) == (pe.has_rotate, pe.rotates_head_subset), name


# -- local spans against a dense mask -----------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "size"), [("window", 5), ("chunk", 4), ("window", 1), ("chunk", 7)])
def test_span_matches_dense_mask(kind, size):
    T = 19
    q, k, v = qkv(T)
    allowed = dense_allowed(T, kind, size)
    span = Span(kind, size)
    want = reference(q, k, v, allowed)
    # query chunks of 6 rows (several chunks, the span crossing their edges), with and without a tensor bias
    assert torch.allclose(causal_attention(q, k, v, chunk_size=6, span=span), want, atol=1e-5)
    bias = random_bias(T)
    assert torch.allclose(causal_attention(q, k, v, bias, chunk_size=6, span=span), reference(q, k, v, allowed, bias),
                          atol=1e-5)
    # the last rows only (evaluation of probe answers) and the explicit-logits path of evaluation
    assert torch.allclose(causal_attention(q, k, v, chunk_size=6, q_start=11, span=span), want[..., 11:, :], atol=1e-5)
    assert torch.allclose(observed_attention(q, k, v, None, 6, span=span), want, atol=1e-5)


def test_span_with_a_per_distance_bias():
    """ALiBi on CPU is a DistanceBias whose chunks list queries in reverse order."""
    T, span = 23, Span("window", 6)
    q, k, v = qkv(T)
    alibi = build_encoding("alibi", d_model=24, n_heads=3)
    state = alibi.prepare(torch.arange(T), consecutive=True, largest=T - 1)
    dense = alibi.score_bias(torch.arange(T), torch.arange(T))  # (H, T, T), no mask
    want = reference(q, k, v, dense_allowed(T, "window", 6), dense)
    assert torch.allclose(causal_attention(q, k, v, state.bias, chunk_size=8, span=span), want, atol=1e-5)


def test_span_reads_only_the_keys_it_needs():
    span = Span("window", 32)
    assert span.first_key(100) == 69 and span.keys(512, 16384) == 543
    assert Span("chunk", 32).first_key(100) == 96


# -- temperature ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "n_seen"), [("window", lambda i: min(i + 1, 5)), ("chunk", lambda i: i % 5 + 1)])
def test_ssmax_is_s_log_n_times_the_logits(kind, n_seen):
    """Scalable-Softmax (Nakanishi 2025, eq. 4: softmax(s log n * z)), n = the keys each query sees."""
    torch.manual_seed(0)
    T, D, H = 12, 16, 2
    config = GPTConfig(vocab_size=8, n_layers=1, n_heads=H, d_model=D, layout=[f"nope@{kind}:5+ssmax"])
    nope = build_encoding("nope", D, H)
    model = GPT(config, nope)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.ssmax_scale.copy_(torch.tensor([0.3, 0.8]))
        attn.qkv.weight.mul_(40)  # logits of order 1, so that a wrong scale shows
    x = torch.randn(1, T, D)
    q, k, v = attn.qkv(x).view(1, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    n = torch.tensor([n_seen(i) for i in range(T)], dtype=torch.float)
    scale = torch.tensor([0.3, 0.8])[:, None, None] * n.log()[:, None]  # (H, T, 1): s_h log n_i
    y = reference(q, k, v, dense_allowed(T, kind, 5), logit_scale=scale)
    want = attn.proj(y.transpose(1, 2).reshape(1, T, D))
    assert torch.allclose(attn(x, nope, nope.prepare(torch.arange(T))), want, atol=1e-5)


# -- the model -----------------------------------------------------------------------------------------------
def _logits(layout, pe_name="rope", T=24, n_layers=2, **extra):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, n_layers=n_layers, n_heads=2, d_model=16, layout=layout, **extra)
    model = GPT(config, build_encoding(pe_name, 16, 2))
    idx = torch.randint(0, 32, (2, T), generator=torch.Generator().manual_seed(1))
    return model, model(idx)


def test_the_runs_own_encoding_as_a_layout_is_the_model_without_one():
    assert torch.equal(_logits(None)[1], _logits(["rope"])[1])
    # spans at least as long as the input are global attention
    assert torch.allclose(_logits(["rope@window:24"])[1], _logits(None)[1], atol=1e-5)
    assert torch.allclose(_logits(["rope@chunk:30"])[1], _logits(None)[1], atol=1e-5)
    assert not torch.allclose(_logits(["rope@chunk:8"])[1], _logits(None)[1], atol=1e-3)


def test_each_encoding_is_prepared_once_per_forward(monkeypatch):
    model, _ = _logits(["rope@chunk:8", "alibi", "rope@window:4", "nope+llama4_temp"], n_layers=4,
                       temperature_floor_scale=4)
    assert set(model.encodings()) == {"rope", "alibi", "nope"}
    calls = []
    for name, pe in model.encodings().items():
        original = pe.prepare
        monkeypatch.setattr(pe, "prepare", lambda *a, _o=original, _n=name, **kw: calls.append(_n) or _o(*a, **kw))
    model(torch.randint(0, 32, (1, 40)))
    assert sorted(calls) == ["alibi", "nope", "rope"]
    # the layout's other encodings are not counted as the model's non-embedding parameters
    assert model.num_params() == sum(p.numel() for b in (*model.blocks, model.ln_f) for p in b.parameters())


def test_local_layers_bound_the_memory_estimate():
    from pelab.runs.memory import evaluation

    model, _ = _logits(["rope@window:8"], attn_chunk_size=64)
    assert model.score_keys(2048) == 71  # 64 queries of a chunk reach back 7 keys before it
    assert _logits(["rope@window:8", "nope"], attn_chunk_size=64)[0].score_keys(2048) == 71  # NoPE: fused SDPA
    assert _logits(["rope@window:8", "alibi"], attn_chunk_size=64)[0].score_keys(2048) == 2048  # a global bias
    assert _logits(None)[0].score_keys(2048) == 0  # RoPE everywhere: no scores materialised
    scores = [evaluation(10**6, 8, 2048, 128, 512, 4, 256, 64, keys).parts["attention scores"] for keys in (None, 71)]
    assert scores[1] * 2048 == scores[0] * 71


def test_rotate_heads_needs_a_rotary_encoding_and_enough_heads():
    with pytest.raises(ConfigError, match=r"rotate_heads:3 is more than model.n_heads=2"):
        GPTConfig(vocab_size=8, n_layers=1, n_heads=2, d_model=16, layout=["rope+rotate_heads:3"]).validate()
    with pytest.raises(ValueError, match="needs a rotary encoding; pe alibi"):
        _logits(["rope", "alibi+rotate_heads:1"])


@pytest.mark.parametrize("pe", [{"name": "fope", "train_length": 24},  # crashed mid-forward on its per-head series
                                {"name": "rope", "train_length": 24, "scaling": {"type": "rerope", "window": 8}}])
def test_rotate_heads_refuses_an_encoding_that_positions_every_head(pe):
    """ReRoPE's far-pair scores reach every head (it ran, the unrotated head not position-free): refused, as FoPE."""
    config = GPTConfig(vocab_size=32, n_layers=1, n_heads=2, d_model=16, layout=[f"{pe['name']}+rotate_heads:1"])
    with pytest.raises(ValueError, match=f"rotates the last n heads only, but pe {pe['name']} positions every head"):
        GPT(config, build_encoding(pe, 16, 2))
    rope = GPTConfig(vocab_size=32, n_layers=1, n_heads=2, d_model=16, layout=["rope+rotate_heads:1"])
    GPT(rope, build_encoding({"name": "rope", "train_length": 24, "scaling": {"type": "yarn", "factor": 2.0}}, 16, 2))


def test_the_command_line_refuses_a_bad_layout_before_any_data():
    from helpers.runs import compose
    from pelab.tasks.config import validate

    validate(compose(["model.layout=[rope@chunk:32,nope+llama4_temp]", "data.seq_len=128"]))
    with pytest.raises(ConfigError, match=r"model\.layout\[1\]='nope@window:256'.*not shorter than the training"):
        validate(compose(["model.layout=[rope@chunk:32,nope@window:256]", "data.seq_len=128"]))
    with pytest.raises(ConfigError, match=r"names no layer with the run's encoding pe=alibi"):
        validate(compose(["pe=alibi", "model.layout=[rope@chunk:32,nope]"]))
    with pytest.raises(ConfigError, match=r"model\.layout=rope@chunk:32 must be a list.*model\.layout=\[rope@chunk:32\]"):
        validate(compose(["model.layout=rope@chunk:32"]))


def test_log_length_scaling_leaves_local_layers_on_their_fused_path():
    """A local layer's queries see at most span < L keys, so log(n)/log(L) is 1 there (SWAN's preset: the scaling acts
    on the global NoPE layer)."""
    from pelab.model import attention_paths, reset_attention_paths

    model, _ = _logits(["rope@window:8", "nope"], attn_logit_scale="log_length", train_length=16)
    plain, _ = _logits(["rope@window:8", "nope"], train_length=16)
    reset_attention_paths()
    idx = torch.randint(0, 32, (1, 40))
    with torch.no_grad():
        for m in (model, plain):  # logits of order 1 (same weights: same seed), so that a scaling shows
            m.blocks[1].attn.qkv.weight.mul_(40)
        scaled, unscaled = model.eval()(idx), plain.eval()(idx)
    paths = attention_paths()["paths"]
    assert set(paths["rope"]) == {"sdpa_mask"} and "explicit_logits" in paths["nope"]
    assert not torch.allclose(scaled, unscaled, atol=1e-4)  # the global layer is scaled
    reset_attention_paths()


@pytest.mark.parametrize(("kind", "size"), [("window", 32), ("chunk", 32), ("window", 5)])
def test_flex_block_mask_of_a_span_matches_dense_mask(kind, size):
    """The predicate of FlexAttention's block mask for a span (model.attn_backend=flex), run by flex_attention's
    eager reference (no compile; the compiled path is checked against SDPA on its first call of each shape)."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from pelab.model.attention.flex import mask_mod

    T = 128  # one flex block: the eager path needs no partial-block handling
    q, k, v = qkv(T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention warns when it runs uncompiled
        block_mask = create_block_mask(mask_mod(Span(kind, size)), None, None, T, T, device="cpu")
        out = flex_attention(q, k, v, block_mask=block_mask)
    assert torch.allclose(out, reference(q, k, v, dense_allowed(T, kind, size)), atol=1e-5)
