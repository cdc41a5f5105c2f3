"""pelab.metric_keys: every form of key round-trips, malformed keys are refused, and the keys the evaluation
writes (the committed studies' summary.json files, and the result classes' own `.metrics()`) parse back to
themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pelab.metric_keys import (
    MetricKey,
    format_key,
    interval_keys,
    length_of,
    lengths_of,
    metric_key,
    parse_key,
    with_variant,
)

ROOT = Path(__file__).resolve().parents[1]

FORMS = {
    "extrap/ppl@512": MetricKey("extrap", "ppl", 512),
    "extrap/ppl_ratio_lo@512": MetricKey("extrap", "ppl_ratio", 512, bound="lo"),
    "extrap/ppl_sliding_hi@128": MetricKey("extrap", "ppl_sliding", 128, bound="hi"),
    "extrap/bpb@2048": MetricKey("extrap", "bpb", 2048),
    "extrap/ppl@parent_x4": MetricKey("extrap", "ppl", parent_x=4),
    "extrap/ppl@parent_x0.5": MetricKey("extrap", "ppl", parent_x=0.5),
    "extrap/yarn/ppl@512": MetricKey("extrap", "ppl", 512, variant="yarn"),
    "extrap/step0/ppl@parent_x1": MetricKey("extrap", "ppl", variant="step0", parent_x=1),
    "probe/mqar/acc@1024": MetricKey("probe", "acc", 1024, kind="mqar"),
    "probe/mqar_offset/acc_hi@256": MetricKey("probe", "acc", 256, kind="mqar_offset", bound="hi"),
    "probe/step0/mqar/lim_gap_lo@128": MetricKey("probe", "lim_gap", 128, kind="mqar", variant="step0", bound="lo"),
    "probe/kv/not_in_context@128": MetricKey("probe", "not_in_context", 128, kind="kv"),
    "probe/mqar/auc": MetricKey("probe", "auc", kind="mqar"),
    "probe/step0/mqar/effective_length": MetricKey("probe", "effective_length", kind="mqar", variant="step0"),
    "attn/entropy@512": MetricKey("attn", "entropy", 512),
    "attn/mass_past_L@512/layer3": MetricKey("attn", "mass_past_L", 512, layer=3),
    "attn/step0/distance@128/layer0": MetricKey("attn", "distance", 128, variant="step0", layer=0),
    "train/induction_acc@2048": MetricKey("train", "induction_acc", 2048),  # a curve logged during training
}


@pytest.mark.parametrize("key", FORMS)
def test_every_form_round_trips(key):
    assert parse_key(key) == FORMS[key]
    assert format_key(FORMS[key]) == key


@pytest.mark.parametrize("key", [
    "val/ppl", "train/loss", "extrap", "extrap/ppl@", "extrap/ppl@L", "extrap/ppl@0128", "extrap/ppl@128@256",
    "extrap/ppl@parent_x4.0", "extrap/ppl@parent_xnan", "extrap/a/b/ppl@128", "probe/acc@128",
    "probe/a/b/c/acc@128", "probe/mqar/_lo@128", "attn/entropy@128/layer", "attn/entropy@128/layer0/x",
    "extrap//ppl@128", "extrap/ppl @128", "nonoverlap@128", "train/lr", "train/induction_acc",
])
def test_malformed_keys_are_refused(key):
    assert parse_key(key) is None


def test_the_helpers():
    assert metric_key("extrap/ppl", 512) == "extrap/ppl@512"
    assert metric_key("extrap/ppl_ratio", 512, "lo") == "extrap/ppl_ratio_lo@512"
    assert metric_key("extrap/ppl", parent_x=4.0) == "extrap/ppl@parent_x4"
    assert metric_key("attn/entropy", 512, layer=1) == "attn/entropy@512/layer1"
    for name, bound in [("extrap/ppl@512", ""), ("val/ppl", ""), ("extrap/ppl_lo", "hi"), ("extrap/ppl", "mid")]:
        with pytest.raises(ValueError):
            metric_key(name, 512, bound)
    assert interval_keys("probe/mqar/acc@128") == ("probe/mqar/acc_lo@128", "probe/mqar/acc_hi@128")
    with pytest.raises(ValueError):
        interval_keys("extrap/ppl_lo@128")
    assert with_variant("probe/mqar/acc@128", "step0") == "probe/step0/mqar/acc@128"
    assert with_variant("probe/mqar/auc", "yarn") == "probe/yarn/mqar/auc"
    with pytest.raises(ValueError):
        with_variant("extrap/yarn/ppl@128", "step0")
    keys = ["extrap/ppl@1024", "extrap/ppl@128", "extrap/ppl_lo@256", "extrap/ppl@parent_x4", "val/ppl",
            "extrap/yarn/ppl@64", "attn/entropy@128/layer0", "attn/entropy@256"]
    assert lengths_of(keys, "extrap/ppl") == [128, 1024]
    assert lengths_of(keys, "attn/entropy") == [256]
    assert length_of("extrap/yarn/ppl@64", "extrap/yarn/ppl") == 64 and length_of("val/ppl", "val/ppl") is None


def committed_metrics() -> list[tuple[str, dict]]:
    """(summary.json, one `metrics` dict) of every committed run: its own, its evaluations' and its points along
    training."""
    found = []

    def walk(path: Path, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "metrics" and isinstance(v, dict):
                    found.append((str(path.relative_to(ROOT)), v))
                walk(path, v)
        elif isinstance(node, list):
            for v in node:
                walk(path, v)

    for path in sorted((ROOT / "experiments").rglob("summary.json")):
        walk(path, json.loads(path.read_text()))
    return found


def test_the_committed_runs_keys_parse_back_to_themselves():
    """Every key with "@" the evaluation wrote into a committed study, incl. probe, per-layer, parent_x and step0
    keys, is a metric key, and formats back to itself."""
    found = committed_metrics()
    keys = {k for _, m in found for k in m if "@" in k}
    assert any("lost_in_the_middle" in p for p, _ in found) and any("length_extrapolation/v3" in p for p, _ in found)
    for form in ("probe/mqar/acc@", "extrap/ppl_ratio_lo@", "@parent_x", "/layer0", "extrap/step0/", "probe/step0/"):
        assert any(form in k for k in keys), form
    bad = sorted(k for k in keys if (p := parse_key(k)) is None or format_key(p) != k)
    assert not bad, bad


def test_the_writers_keys_parse_back_to_themselves():
    """The result classes' own keys (the dashboard asks them the same way), per-kind names without @L included."""
    from pelab.dashboard import metric_keys
    from pelab.evaluation.attention_stats import metrics as attention_metrics

    keys = metric_keys([64, 128, 256], ["mqar", "kv", "passkey"])
    rows = [{"length": n, "layer": layer, "head": 0, "q_lo": 0, "q_hi": n, "entropy": 1.0, "distance": 2.0,
             "mass_past_L": 0.1, "max_logit": 3.0} for n in (64, 128) for layer in (0, 1)]
    keys += list(attention_metrics(rows))
    assert any(k.startswith("attn/") for k in keys) and any(k.startswith("probe/kv/") for k in keys)
    bad = sorted(k for k in keys if (p := parse_key(k)) is None or format_key(p) != k)
    assert not bad, bad
