"""The probe-kind table (pelab.data.recall.kinds): the built-in entries, and a kind defined outside the package (a
module written to tmp_path, imported through probes.plugins' `import_plugins`) probed by the real `run_probes` on a
micro GPT, its accuracy equal to one computed here with the model's plain forward."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from helpers.plugins import TOY_KIND
from pelab.data.recall import (
    DEPTH,
    OFFSET,
    PROBE_KINDS,
    ProbeKind,
    import_plugins,
    kind_names,
    make_probe_samples,
    probe_kind,
    register_probe_kind,
)
from pelab.data.tokenizer import ByteTokenizer
from pelab.encodings import build_encoding
from pelab.errors import ConfigError
from pelab.evaluation.probes import run_probes
from pelab.model import GPT, GPTConfig

TOK = ByteTokenizer()



@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module on sys.path, imported as probes.plugins would; unregistered afterwards."""
    (tmp_path / "toy_kind.py").write_text(textwrap.dedent(TOY_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    import_plugins(["toy_kind"])
    yield "repeat_letter"
    PROBE_KINDS.pop("repeat_letter", None)
    sys.modules.pop("toy_kind", None)


def test_the_built_in_table():
    ruler = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe")  # docs/ruler.md
    assert kind_names() == ("kv", "passkey", "mqar", "kv_single", "passkey_single", "mqar_offset",
                            "induction_heads", *ruler)
    assert kind_names(trainable=True) == kind_names()[:5] + ruler  # mqar_offset and induction_heads are probe-only
    assert [k for k, e in PROBE_KINDS.items() if e.single_token] == ["mqar", "kv_single", "passkey_single",
                                                                     "mqar_offset", "induction_heads", *ruler]
    assert [k for k, e in PROBE_KINDS.items() if e.layout == OFFSET] == ["mqar_offset"]
    assert probe_kind("mqar").vocabulary(8) == {"reserved_keys": 8, "reserved_values": 8}
    assert probe_kind("passkey_single").vocabulary(8) == {"reserved_values": 1}
    assert probe_kind("kv").vocabulary(8) == {}
    assert probe_kind("mqar").min_length(8) == 18 and probe_kind("mqar").row_min_length(8) == 32
    assert probe_kind("kv").layout == DEPTH and probe_kind("kv").min_length is None


def test_unknown_and_duplicate_kinds_are_refused():
    with pytest.raises(ValueError, match=r"unknown probes.kinds entry 'bogus'; known: \['kv', 'passkey'"):
        probe_kind("bogus")
    with pytest.raises(ValueError, match="already registered"):
        register_probe_kind(ProbeKind("kv", "kv", lambda *a: []))
    with pytest.raises(ValueError, match="layout"):
        register_probe_kind(ProbeKind("new_kind", "kv", lambda *a: [], layout="diagonal"))
    assert "new_kind" not in PROBE_KINDS
    with pytest.raises(ConfigError, match="probes.plugins: cannot import 'no_such_module_here'"):
        import_plugins(["no_such_module_here"])


def test_a_kind_from_outside_the_package_is_probed_end_to_end(plugin):
    assert plugin in kind_names() and plugin not in kind_names(trainable=True)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOK.vocab_size, n_layers=1, n_heads=2, d_model=32)
    model = GPT(cfg, build_encoding({"name": "rope"}, cfg.d_model, cfg.n_heads)).eval()
    res = run_probes(model, TOK, kinds=[plugin, "passkey"], depths=[0.0, 1.0], lengths=[16, 24],
                     samples_per_cell=12, seed=3)
    m = res.metrics()
    for L in (16, 24):
        samples = make_probe_samples(plugin, TOK, L, 0.0, 12, 3)
        x = torch.tensor([s.input_ids + s.answer_ids for s in samples])
        with torch.no_grad():
            pred = model(x)[:, -2].argmax(-1)  # the prediction of the answer token
        expected = (pred == torch.tensor([s.answer_ids[0] for s in samples])).float().mean().item()
        assert m[f"probe/{plugin}/acc@{L}"] == pytest.approx(expected)
    assert res.chance(plugin) == pytest.approx(0.25)  # its own four-letter vocabulary
    assert [r["kind"] for r in res.to_dict()["rows"]].count(plugin) == 2 * 2
