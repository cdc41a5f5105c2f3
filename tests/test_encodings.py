"""The position contract and its configs (pelab.encodings.base, pelab.encodings.config): every YAML is its
schema's defaults and builds; bad names and knobs are clear errors; parameter counts; randomized positions."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from encoding_inputs import MICRO, D, H, rope
from pelab.encodings import PositionEncoding, available_encodings, build_encoding, pe_schema
from pelab.encodings.base import random_sorted_positions
from pelab.encodings.config import PE_CONF_DIR, load_pe_yaml
from pelab.model import build_model


# ---- configs -----------------------------------------------------------------------------------------------
def test_every_yaml_names_an_encoding_class_and_composes_its_schemas_defaults():
    """The schema dataclass is the one source of defaults: a YAML composed outside Hydra is its class's schema
    defaults with the file's own keys over them (tests/test_conf_schemas.py: no file restates a default)."""
    assert len(available_encodings()) >= 11
    for name in available_encodings():
        cfg = load_pe_yaml(name)  # as Hydra composes it: the schema node `_<Config>` under the file
        assert cfg.name == name
        cls = get_class(cfg._target_)
        assert issubclass(cls, PositionEncoding) and pe_schema(cfg) is cls.Config
        defaults = OmegaConf.to_container(OmegaConf.structured(cls.Config))
        own = OmegaConf.load(PE_CONF_DIR / f"{name}.yaml")
        assert list(own.defaults) == [f"_{cls.Config.__name__}", "_self_"], name
        own.pop("defaults")
        assert OmegaConf.to_container(cfg) == {**defaults, **OmegaConf.to_container(own)}, name


def test_every_built_in_schema_is_found_without_importing_torch():
    """The command line types `pe` before torch is imported: a built-in YAML's `_target_` has its schema in
    pelab.encodings.settings.SCHEMAS (the test above checks it is the class's own `Config`)."""
    import subprocess
    import sys

    from pelab.encodings.settings import SCHEMAS

    targets = {str(load_pe_yaml(name)._target_) for name in available_encodings()}
    assert {t for t in targets if t.startswith("pelab.")} <= set(SCHEMAS)
    code = ("import sys; from pelab.encodings import default_pe_config, available_encodings; "
            "[default_pe_config(n) for n in available_encodings()]; assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("name", available_encodings())
def test_load_pe_yaml_is_what_hydra_composes(name):
    """Outside Hydra (default_pe_config, report defaults) a YAML reads as Hydra composes it into `pe`: its
    schema's defaults (the node `pe/_<Config>` of pelab.conf_values) under the file's own keys."""
    from helpers.runs import compose

    loaded = OmegaConf.to_container(load_pe_yaml(name))
    assert "defaults" not in loaded and loaded["train_length"] is None
    assert loaded == OmegaConf.to_container(compose([f"pe={name}"]).pe)


@pytest.mark.parametrize("name", available_encodings())
def test_yaml_builds_and_has_expected_shapes(name):
    cfg = load_pe_yaml(name)
    assert cfg.randomized.max_position is None  # every scheme can be randomized; off by default
    pe = build_encoding(cfg, D, H, train_length=64)
    assert type(pe) is get_class(cfg._target_) and pe.name == name
    B, T = 2, 7
    pos = torch.arange(T)
    state = pe.prepare(pos, consecutive=True)
    if pe.has_content_bias:
        q, k = torch.randn(2, H, 7, D // H), torch.randn(2, H, 7, D // H)
        assert pe.content_bias(q[..., 3:, :], k, 3, state).shape == (2, H, 4, 7)
    x = torch.randn(B, T, D)
    if pe.has_layer_input_bias:  # a per-layer module reading the layer input x, its bias per query chunk
        assert pe.layer_input_bias()(x, state)(3, 7).shape == (B, H, 4, 7)
    assert pe.embed(x, state).shape == (B, T, D)  # sum composition: width unchanged
    q, k = torch.randn(B, H, T, D // H), torch.randn(B, H, T, D // H)
    q2, k2 = pe.rotate(q, k, state)
    assert q2.shape == q.shape and k2.shape == k.shape
    if pe.has_bias:
        assert pe.score_bias(pos, pos).shape == (H, T, T)
        batched = pe.score_bias(pos.expand(B, T), pos.expand(B, T))
        torch.testing.assert_close(batched, pe.score_bias(pos, pos).expand(B, H, T, T))  # per-row = shared
    hooks_changed = [
        not torch.equal(pe.embed(x, state), x),
        not torch.equal(q2, q),
    ]
    assert hooks_changed == [pe.has_embed, pe.has_rotate]


def test_unknown_name_and_knob_are_clear_errors():
    with pytest.raises(ValueError, match="known encodings.*alibi"):
        build_encoding({"name": "ropee"}, D, H)
    with pytest.raises(ValueError, match=r"pe.max_len is not a setting.*max_position"):
        build_encoding({"name": "learned", "max_len": 10}, D, H, train_length=8)
    with pytest.raises(ValueError, match="pe.scaling.type=yarn2"):
        rope({"type": "yarn2"})
    with pytest.raises(ValueError, match="needs pe.train_length"):
        rope({"type": "yarn", "factor": 2.0})  # YaRN needs the training length
    with pytest.raises(ValueError, match="pe.frequency_fraction.*Float"):
        rope(frequency_fraction="abc")  # typed by the schema


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nope", 0),
        ("sinusoidal", 0),
        ("rope", 0),
        ("alibi", 0),
        ("learned", 64 * D),
        ("t5_bias", 32 * H),
        ("xpos", 0),
        ("sandwich", 0),
        ("kerple", 2 * H),  # r1, r2 per head
        ("fire", (1 * 32 + 32) + (32 * H + H) + 2),  # MLP 1 -> 32 -> H, c, L multiplier
        ("cope", 64 * (D // H)),  # max_position x head_dim
    ],
)
def test_num_learnable_params(name, expected):
    knobs = {"learned": {"max_position": 64}, "cope": {"max_position": 64},
             "fire": {"init_L": 64.0}}.get(name, {})
    pe = build_encoding({"name": name, **knobs}, D, H)
    assert pe.num_learnable_params() == expected
    randomized = build_encoding({"name": name, **knobs, "randomized": {"max_position": 64}}, D, H)
    assert randomized.num_learnable_params() == expected  # randomized positions add nothing


# ---- randomized positions ----------------------------------------------------------------------------------
def test_random_positions_sorted_unique_in_range():
    torch.manual_seed(0)
    pos = random_sorted_positions(300, (64, 128))
    assert pos.shape == (64, 128) and pos.min() >= 0 and pos.max() < 300
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted and distinct
    assert not torch.equal(pos[0], pos[1])  # each row its own draw
    assert pos.max() > 250  # positions reach far past the 128-token input
    with pytest.raises(ValueError, match="max_position=100.*128"):
        random_sorted_positions(100, (128,))


def test_randomized_positions_remap_only_in_training():
    torch.manual_seed(0)
    pe = build_encoding({"name": "rope", "randomized": {"max_position": 4096}}, D, H)
    pos = torch.arange(128)
    pe.train()
    a, b = pe.prepare(pos), pe.prepare(pos)
    assert a.pos.shape == (128,) and not torch.equal(a.pos, b.pos) and a.pos.max() >= 128
    torch.testing.assert_close(a.tables[0][0], pe.cos_sin(a.pos)[0])  # the tables follow the drawn positions
    pe.eval()
    assert pe.prepare(pos).pos is pos  # evaluation: ordinary positions, untouched
    with pytest.raises(ValueError, match=r"pe.randomized.max_len is not a setting"):
        build_encoding({"name": "rope", "randomized": {"max_len": 10}}, D, H)
    with pytest.raises(ValueError, match=r"pe.randomized.max_position=64 must be at least the training length"):
        build_encoding({"name": "rope", "randomized": {"max_position": 64}}, D, H, train_length=128)


def test_randomized_model_trains_on_random_positions_and_evaluates_on_ordinary_ones():
    torch.manual_seed(0)
    # learned table: null max_position follows the largest position training can reach
    model = build_model(MICRO, {"name": "learned", "max_position": None, "randomized": {"max_position": 256}},
                        vocab_size=20, train_length=16)
    assert model.pe.weight.num_embeddings == 256
    plain = build_model(MICRO, {"name": "learned", "max_position": 256}, vocab_size=20, train_length=16)
    plain.load_state_dict(model.state_dict())  # randomized positions add no parameters
    idx = torch.randint(0, 20, (2, 16))
    model.eval()
    plain.eval()
    torch.testing.assert_close(model(idx), plain(idx))  # eval: positions 0..15, as the plain model
    model.train()
    seen = []
    model.pe.embed = lambda x, state: seen.append(state.pos) or x  # record the positions the scheme sees
    model(idx)
    model(idx)
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])
    assert all((p[1:] > p[:-1]).all() and p.max() < 256 for p in seen)
