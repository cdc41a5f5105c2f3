"""README.md's commands and knobs against the real configs: every `python train.py` / `python eval.py` command
in it composes with Hydra and passes pelab's checks, and every `key=` of the knob table exists, so documented
overrides cannot rot."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from helpers.runs import CONF_DIR, ROOT, compose
from pelab.tasks.evaluate import OVERRIDABLE, OWN_KEYS
from pelab.tasks.train import validate_config

README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"```(?!text)[a-z]*\n(.*?)```", re.DOTALL)  # ```text blocks are not commands


def shell_commands() -> list[str]:
    """The shell command lines of README.md: each line of its code blocks (continuations joined), and each
    inline `python ...` span of its text."""
    lines = []
    for block in FENCE.findall(README):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`((?:while )?python3? (?:train|eval)\.py[^`]*)`", FENCE.sub("", README))
    return lines


def readme_commands() -> list[tuple[str, list[str]]]:
    """(script, overrides) of every `python train.py` / `python eval.py` in README.md. Placeholders
    (`<...>`) become a dummy path segment; a multirun (`-m`) is represented by its first job: each swept
    override takes its first value."""
    out = []
    parser = OverridesParser.create()
    for line in shell_commands():
        line = re.sub(r"<[^<>]*>", "x", line)
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part, comments=True)
            while words and words[0] in ("while", "do", "then", "time"):
                words = words[1:]
            if len(words) < 2 or words[0] not in ("python", "python3") or words[1] not in ("train.py", "eval.py"):
                continue
            overrides = []
            for o in parser.parse_overrides([w for w in words[2:] if w not in ("-m", "--multirun")]):
                first = next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else None
                overrides.append(o.input_line if first is None else f"{o.get_key_element()}={first}")
            out.append((words[1], overrides))
    return out


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_this_test_looks_for():
    scripts = [script for script, _ in COMMANDS]
    assert scripts.count("train.py") >= 6 and scripts.count("eval.py") >= 3, COMMANDS
    assert ("train.py", []) in COMMANDS  # the main job
    assert any(any(o.startswith("data.seq_len=") for o in ovs) for _, ovs in COMMANDS)  # the multirun, composed


@pytest.mark.parametrize("script, overrides", COMMANDS, ids=[" ".join([s, *o]) for s, o in COMMANDS])
def test_every_readme_command_composes_and_passes_the_checks(script, overrides, tmp_path):
    cfg = compose(overrides, tmp_path, config_name=script.removesuffix(".py"))
    if script == "train.py":
        validate_config(cfg)  # the same typed, range-checked pass as a run, before any data
    else:  # eval.py changes only pe.*, eval.*, probes.* of the checkpoint (pelab.tasks.evaluate)
        for o in overrides:
            key = o.split("=", 1)[0].lstrip("+~")
            assert key.startswith(OVERRIDABLE) or key == "pe" or key.split(".")[0] in OWN_KEYS, o
        assert cfg.ckpt_path


def knobs() -> dict[str, set[str]]:
    """The `key=` (or `key=value`) of the knob table (the section "The knobs"): key -> the values named."""
    section = README.split("## The knobs", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    out: dict[str, set[str]] = {}
    for key, value in re.findall(r"`([a-z_][\w.]*)=([^`\s]*)`", table):
        out.setdefault(key, set()).update([value] if value else [])
    return out


def has_key(cfg: DictConfig, key: str) -> bool:
    """`key` is in `cfg`, set or not (`???`)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()  # `in node` is False for ???


# A knob may belong to an option other than the default (data.path to data=text_dir): the compositions tried.
OPTIONS = [[], ["data=text_dir"], ["tokenizer=pretrained"]]


def test_every_knob_of_the_table_is_a_key_of_the_configs(tmp_path):
    table = knobs()
    assert {"pe", "pe.scaling.type", "data.path", "data.glob", "trainer.max_steps"} <= set(table), table
    configs = [compose(o, tmp_path) for o in OPTIONS]
    groups = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()}  # `experiment=recall`: a group choice
    unknown = [k for k in table if k not in groups and not any(has_key(c, k) for c in configs)]
    assert not unknown, f"README knobs that no config has: {unknown}"
    options = [f"{k}={v}" for k, values in table.items() if k in groups for v in values
               if not (Path(CONF_DIR) / k / f"{v}.yaml").is_file()]
    assert not options, f"README group options that do not exist: {options}"
