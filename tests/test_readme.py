"""README.md and docs/*.md against the real configs: every `python train.py` / `python eval.py` command in
them composes with Hydra and passes pelab's checks, and every `key=` of the knob tables exists, so documented
overrides cannot rot. The README stays a first screen (at most 200 lines) that links every docs page, and every
relative link of the pages resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from helpers.runs import CONF_DIR, ROOT, compose, config_dir
from pelab.tasks.evaluate import OVERRIDABLE, OWN_KEYS
from pelab.tasks.train import validate_config

# page (relative to the repository root) -> its text: the README first, then the docs pages
PAGES = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
README = PAGES["README.md"]
DOCS = [page for page in PAGES if page != "README.md"]
FENCE = re.compile(r"```(?!text)[a-z]*\n(.*?)```", re.DOTALL)  # ```text blocks are not commands


def shell_commands(text: str) -> list[str]:
    """The shell command lines of a page: each line of its code blocks (continuations joined), and each inline
    `python ...` span of its text."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`((?:while )?python3? (?:train|eval)\.py[^`]*)`", FENCE.sub("", text))
    return lines


def readme_commands() -> list[tuple[str, str, list[str]]]:
    """(page, script, overrides) of every `python train.py` / `python eval.py` in README.md and docs/. Placeholders
    (`<...>`) become a dummy path segment; a multirun (`-m`) is represented by its first job: each swept
    override takes its first value. A folder added with `-cd` / `--config-dir` (a study's frozen presets) is added
    to the composition's search path."""
    out = []
    parser = OverridesParser.create()
    for page, line in [(page, line) for page, text in PAGES.items() for line in shell_commands(text)]:
        line = re.sub(r"<[^<>]*>", "x", line)
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part, comments=True)
            while words and words[0] in ("while", "do", "then", "time"):
                words = words[1:]
            if len(words) < 2 or words[0] not in ("python", "python3") or words[1] not in ("train.py", "eval.py"):
                continue
            overrides, args = [], []
            for i, w in enumerate(words[2:], start=2):
                if w in ("-cd", "--config-dir") or w.startswith("--config-dir="):
                    overrides.append(config_dir(w.partition("=")[2] or words[i + 1]))
                elif words[i - 1] not in ("-cd", "--config-dir") and w not in ("-m", "--multirun"):
                    args.append(w)
            for o in parser.parse_overrides(args):
                first = next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else None
                overrides.append(o.input_line if first is None else f"{o.get_key_element()}={first}")
            out.append((page, words[1], overrides))
    return out


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_this_test_looks_for():
    scripts = [script for _, script, _ in COMMANDS]
    assert scripts.count("train.py") >= 8 and scripts.count("eval.py") >= 5, COMMANDS
    in_readme = [(script, ovs) for page, script, ovs in COMMANDS if page == "README.md"]
    assert ("train.py", []) in in_readme and len(in_readme) >= 6, in_readme  # the main job and the examples
    assert any(o.startswith("data.seq_len=") and s == "train.py" for s, ovs in in_readme for o in ovs)  # multirun
    assert any(o.startswith("extend.from=") for _, _, ovs in COMMANDS for o in ovs)  # context extension (docs)
    assert any(page != "README.md" and script == "eval.py" for page, script, _ in COMMANDS)


@pytest.mark.parametrize("page, script, overrides", COMMANDS,
                         ids=[f"{p}: " + " ".join([s, *o]) for p, s, o in COMMANDS])
def test_every_readme_command_composes_and_passes_the_checks(page, script, overrides, tmp_path):
    cfg = compose(overrides, tmp_path, config_name=script.removesuffix(".py"))
    if script == "train.py":
        validate_config(cfg)  # the same typed, range-checked pass as a run, before any data
    else:  # eval.py changes only pe.*, eval.*, probes.* of the checkpoint (pelab.tasks.evaluate)
        for o in overrides:
            key = o.split("=", 1)[0].lstrip("+~")
            assert key.startswith(OVERRIDABLE) or key == "pe" or key.split(".")[0] in OWN_KEYS, o
        assert cfg.ckpt_path


def knob_rows(text: str) -> list[str]:
    """The table rows of a page's section "The knobs"."""
    section = text.split("## The knobs", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def knobs() -> dict[str, set[str]]:
    """The `key=` (or `key=value`) of the knob tables (the sections "The knobs" of README.md and docs/knobs.md):
    key -> the values named."""
    table = "\n".join(knob_rows(README) + knob_rows(PAGES["docs/knobs.md"]))
    out: dict[str, set[str]] = {}
    for key, value in re.findall(r"`([a-z_][\w.]*)=([^`\s]*)`", table):
        out.setdefault(key, set()).update([value] if value else [])
    return out


def has_key(cfg: DictConfig, key: str) -> bool:
    """`key` is in `cfg`, set or not (`???`)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118 (`in node` is False for ???)


# A knob may belong to an option other than the default (data.path to data=text_dir): the compositions tried.
OPTIONS = [[], ["data=text_dir"], ["tokenizer=pretrained"]]


def test_every_knob_of_the_table_is_a_key_of_the_configs(tmp_path):
    table = knobs()
    assert {"pe", "pe.scaling.type", "data.path", "data.glob", "trainer.max_steps"} <= set(table), table
    configs = [compose(o, tmp_path) for o in OPTIONS]
    groups = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()}  # `experiment=recall`: a group choice
    unknown = [k for k in table if k not in groups and not any(has_key(c, k) for c in configs)]
    assert not unknown, f"README / docs knobs that no config has: {unknown}"
    options = [f"{k}={v}" for k, values in table.items() if k in groups for v in values
               if not (Path(CONF_DIR) / k / f"{v}.yaml").is_file()]
    assert not options, f"README / docs group options that do not exist: {options}"


def test_the_readmes_knob_rows_are_rows_of_the_full_table():
    """The README's short knob table repeats rows of docs/knobs.md word for word (links aside), so they cannot
    drift apart."""
    def unlinked(rows: list[str]) -> list[str]:
        return [re.sub(r"\]\([^)]*\)", "]", row) for row in rows]
    short, full = unlinked(knob_rows(README)), unlinked(knob_rows(PAGES["docs/knobs.md"]))
    assert len(short) >= 8 and len(full) > len(short), (short, full)
    assert not [row for row in short if row not in full], "README knob rows not in docs/knobs.md"


def test_the_readme_is_a_first_screen_that_links_every_docs_page():
    assert len(README.splitlines()) <= 200, "README.md is over 200 lines: move reference material into docs/"
    assert "\n## Set up and run (fresh machine)\n" in README and "python -m pytest -q\n" in README  # CI's command
    assert len(DOCS) >= 5, DOCS
    linked = {target for target in re.findall(r"\]\((docs/[^)#\s]+)", README)}
    unlinked = [page for page in DOCS if page not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    for page in DOCS:  # each page starts with one line saying what it holds
        first, second, *_ = PAGES[page].splitlines()
        assert first.startswith("# ") and len(first) > 20 and not second, page


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):  # http(s):, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (ROOT / page).parent / path if path else ROOT / page
            if not file.exists():
                broken.append(f"{page}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in {
                    slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.MULTILINE)}:
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, broken
