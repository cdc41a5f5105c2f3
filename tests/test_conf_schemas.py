"""Every default is written once: the schemas with defaults (each encoding's PEConfig subclass, the model's
GPTConfig) are Hydra config nodes (`pe/_RoPEConfig`, `model/_GPTConfig`; pelab.conf_values) that the YAML files
compose first, and no YAML writes a value its schema already gives; the tokenizer choices share one base."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers.runs import compose
from pelab import CONF_DIR
from pelab.conf_values import group_yaml, schema_node
from pelab.data.tokenizer import tokenizer_settings
from pelab.encodings.settings import SCHEMAS
from pelab.errors import ConfigError
from pelab.model.config import GPTConfig
from pelab.tasks.config import validate

GROUPS = ("pe", "model")


def _leaves(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_each_schema_stores_its_defaults_as_a_node():
    for schema in SCHEMAS.values():
        node = OmegaConf.to_container(schema_node("pe", f"_{schema.__name__}"))
        assert node == OmegaConf.to_container(OmegaConf.structured(schema)), schema
    rope = OmegaConf.to_container(schema_node("pe", "_RoPEConfig"))
    assert rope["base"] == 10000.0 and rope["scaling"]["type"] == "none" and rope["_target_"] == "???"
    model = OmegaConf.to_container(schema_node("model", "_GPTConfig"))
    assert set(model) == {f.name for f in fields(GPTConfig)} - set(GPTConfig.FILLED_KEYS)
    assert schema_node("pe", "_NoSuchConfig") is None


@pytest.mark.parametrize("group", GROUPS)
def test_no_yaml_restates_a_default_of_its_schema(group):
    """A YAML of these groups composes its schema node first and holds only its choices and deviations."""
    files = sorted((Path(CONF_DIR) / group).glob("*.yaml"))
    assert files
    for path in files:
        own = OmegaConf.to_container(OmegaConf.load(path))
        (schema,) = [e for e in own.pop("defaults") if e != "_self_"]
        defaults = _leaves(OmegaConf.to_container(schema_node(group, schema)))
        restated = {k: v for k, v in _leaves(own).items() if k in defaults and defaults[k] == v}
        assert not restated, f"{path.name} restates its schema's defaults {restated}: drop them"


@pytest.mark.parametrize(("override", "key"), [("pe.base=abc", "pe.base"), ("model.dropout=-1", "model.dropout"),
                                                ("pe.scaling.factor=0", "pe.scaling.factor")])
def test_a_bad_value_for_a_key_the_yaml_leaves_to_its_schema_is_pelabs_one_line_error(override, key):
    """The nodes are plain, so the validation pass (not Hydra's typing) answers, naming the key."""
    cfg = compose(["pe=rope", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        validate(cfg)
    assert "\n" not in str(err.value)


def test_group_yaml_reads_a_file_as_hydra_composes_it():
    for group in GROUPS:
        for path in (Path(CONF_DIR) / group).glob("*.yaml"):
            assert group_yaml(group, path.stem) == compose([f"{group}={path.stem}"])[group], path


# Each tokenizer choice as composed (the token cache key and the run's record read it): the reserved ids come from
# conf/tokenizer/_reserved.yaml, which every choice composes.
TOKENIZERS = {
    "byte": {"kind": "byte", "reserved_keys": 64, "reserved_values": 64},
    "bpe": {"kind": "bpe", "vocab_size": 4096, "min_frequency": 2, "train_bytes": 8_000_000, "reserved_keys": 64,
            "reserved_values": 64},
    "pretrained": {"kind": "pretrained", "name": "???", "revision": None, "eot_token": None, "reserved_keys": 64,
                   "reserved_values": 64},
}


@pytest.mark.parametrize("choice", TOKENIZERS)
def test_every_tokenizer_choice_composes_the_shared_reserved_ids(choice):
    choices = {p.stem for p in (Path(CONF_DIR) / "tokenizer").glob("*.yaml") if not p.stem.startswith("_")}
    assert choices == set(TOKENIZERS)
    assert OmegaConf.to_container(compose([f"tokenizer={choice}"]).tokenizer) == TOKENIZERS[choice]  # Hydra
    assert OmegaConf.to_container(group_yaml("tokenizer", choice)) == TOKENIZERS[choice]  # the disk read
    assert tokenizer_settings(choice) == TOKENIZERS[choice]  # a config built by hand
