"""Bad input is one line naming the key, before any data, model or training cost (README "Bad inputs").

Most cases run in-process through `validate_config` on real Hydra compositions (an import of torch per CLI
subprocess costs seconds); a few representative ones run the real `python train.py` and check that nothing
was built: no token cache, no checkpoint, no model in the summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import CONF_DIR, FAST, compose, run_cli
from pelab.data.config import LOADER_KEYS
from pelab.errors import ConfigError
from pelab.tasks.train import validate_config

BAD = [
    # (overrides, the key the one-line message must name) -- issue 15 / 16 cases first
    (["trainer.max_steps=abc"], "trainer.max_steps"),
    (["seed=abc"], "seed"),
    (["model.n_heads=0"], "model.n_heads"),  # was a ZeroDivisionError
    (["model.d_model=0"], "model.d_model"),
    (["model.dropout=1.5"], "model.dropout"),
    (["optim.lr=-1"], "optim.lr"),
    (["probes.depths=[1.5]"], "probes.depths"),  # was an error after the whole training
    (["probes.kinds=[bogus]"], "probes.kinds"),
    (["probes.samples=0"], "probes.samples"),
    (["eval.protocols=[bogus]"], "eval.protocols"),
    # types, unknown and missing keys
    (["data.seq_len=abc"], "data.seq_len"),
    (["probes.depths=[a]"], "probes.depths[0]"),
    (["probes.depths=0.5"], "probes.depths"),
    (["compile=maybe"], "compile"),
    (["matmul_precision=tf32"], "matmul_precision"),
    (["model.n_heads=null"], "model.n_heads"),
    (["+model.n_kv_heads=2"], "model.n_kv_heads"),
    (["model.name=???"], "model.name"),
    (["probes.lengths=${eval.nothing}"], "probes.lengths"),
    # ranges
    (["model.d_model=48", "model.n_heads=5"], "model.n_heads"),
    (["data.recall_mix=1.5"], "data.recall_mix"),
    (["data.recall_loss=values"], "data.recall_loss"),
    (["optim.betas=[0.9]"], "optim.betas"),
    (["trainer.val_check_interval=0.5"], "trainer.val_check_interval"),
    (["trainer.precision=bogus"], "trainer.precision"),
    (["trainer.devices=0"], "trainer.devices"),
    (["seed=-1"], "seed"),
    (["eval.split=dev"], "eval.split"),
    # optim.nonfinite, callbacks.checkpoint.every_n_steps, debug.emulate_world_size: tests/test_reliability.py
    # pe: each encoding's own schema (pelab.encodings.resolve_pe_config)
    (["pe=kerple", "pe.variant=bogus"], "pe.variant"),
    (["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction"),
    (["pe=rope", "pe.scaling.type=bogus"], "pe.scaling.type"),
    (["pe=rope", "pe.scaling.factor=0"], "pe.scaling.factor"),
]


def _ids(cases):
    return [" ".join(o) for o, _ in cases]


def _fails_naming(overrides: list[str], key: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(compose([*FAST, *overrides]))
    message = str(err.value)
    assert f"{key}=" in message or f"{key} " in message or f"{key}:" in message, message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("overrides, key", BAD, ids=_ids(BAD))
def test_bad_setting_is_one_line_naming_it(overrides, key):
    _fails_naming(overrides, key)


def test_the_message_says_what_the_value_must_be():
    assert "converted to Integer" in _fails_naming(["trainer.max_steps=abc"], "trainer.max_steps")
    assert "[0, 1]" in _fails_naming(["probes.depths=[0.5,1.5]"], "probes.depths")
    assert "[kv, passkey, mqar," in _fails_naming(["probes.kinds=[kv,bogus]"], "probes.kinds")


# -- through the real command line: exit 1, one `Error:` line, nothing built --------------------------
def _fails_before_any_cost(args: list[str], key: str, tmp_path: Path) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    out = run_cli([*FAST, "logger=csv", f"hydra.run.dir={run}", *args], cwd=tmp_path, timeout=180,
                  env={"PELAB_CACHE_DIR": str(cache)})
    assert out.returncode == 1, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and key in errors[0], out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == errors[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert not cache.exists() or not any(cache.iterdir()), "a token cache was built"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and key in summary["error"]
    assert "data" not in summary and "model" not in summary and not (run / "checkpoints").exists()


CLI_BAD = [
    (["trainer.max_steps=abc"], "trainer.max_steps"),  # a type
    (["probes.depths=[1.5]"], "probes.depths"),  # a range (was an error after the whole training)
    (["pe=rope", "pe.frequency_fraction=2"], "pe.frequency_fraction"),  # an encoding's own check
]


@pytest.mark.parametrize("args, key", CLI_BAD, ids=_ids(CLI_BAD))
def test_cli_bad_input_stops_before_any_cost(args, key, tmp_path):
    _fails_before_any_cost(args, key, tmp_path)


# -- the shipped configs --------------------------------------------------------------------------------
def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml") if not p.stem.startswith("_"))


REQUIRED = {"text_dir": ["data.path=/texts"], "hf": ["data.name=org/corpus"]}  # the `???` of those configs


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in ("model", "data", "trainer", "pe", "experiment")
                                    for o in _options(g)])
def test_every_shipped_config_passes_validation(choice):
    validate_config(compose([choice, *REQUIRED.get(choice.split("=")[1], [])]))


@pytest.mark.parametrize("corpus", [o for o in _options("data") if o != "stdlib"])
def test_the_corpus_choice_changes_only_the_corpus(corpus):
    """Every data config composes the same loader settings (conf/data/_loader.yaml): switching corpus
    never changes the training length or the mix."""
    data, default = compose([f"data={corpus}"]).data, compose([]).data
    assert {k: data[k] for k in LOADER_KEYS} == {k: default[k] for k in LOADER_KEYS}


def test_probe_key_lengths_follow_the_training_mix():
    cfg = compose(["data.recall_key_len=5", "data.recall_value_len=2"])
    assert (cfg.probes.key_len, cfg.probes.value_len) == (5, 2)
    assert compose(["data.recall_key_len=5", "probes.key_len=4"]).probes.key_len == 4  # still settable
