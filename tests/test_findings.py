"""The findings pages quote generated tables, not typed ones: every block of an experiments/ page between
`<!-- generated: python -m pelab.report ARGS -->` and `<!-- end generated -->` holds tables that the report
built from the committed run folders (ARGS, relative to the repository root) contains verbatim."""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path

import pytest

from helpers.shared import build_once

ROOT = Path(__file__).resolve().parents[1]


def generated_blocks() -> list[tuple[str, str, str]]:
    """(page, report arguments, block text) of every generated block under experiments/."""
    from pelab.report.generated import generated_blocks as blocks

    return [(str(page.relative_to(ROOT)), args, body) for page, args, body in blocks([ROOT / "experiments"])]


def tables(text: str) -> list[str]:
    """The markdown tables of a text: runs of lines starting with '|'."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    return found


def test_the_studies_findings_are_generated():
    """The length-extrapolation, retrieval and context-extension findings: the summary page and each study's own."""
    blocks = generated_blocks()
    assert {"experiments/README.md", "experiments/length_extrapolation/v3/README.md",
            "experiments/lost_in_the_middle/v3/README.md", "experiments/context_extension/v3/README.md"} <= {
        page for page, _, _ in blocks}
    summary = " ".join(args for page, args, _ in blocks if page == "experiments/README.md")
    for runs in ("length_extrapolation/v3/runs", "lost_in_the_middle/v3/runs", "context_extension/v3/runs"):
        assert f"experiments/{runs}" in summary, f"experiments/README.md quotes no generated table of {runs}"


@pytest.fixture(scope="session")
def report_of(tmp_path_factory):
    """report.md of `python -m pelab.report ARGS` (minus the page's --out), built once per session for each ARGS:
    several pages quote the same report (the summary page and each study's own), which takes minutes to build."""
    from pelab.report.cli import main

    def report(args: str) -> str:
        argv = shlex.split(args)
        if "--out" in argv:  # the page names where it keeps the report; the test builds its own
            i = argv.index("--out")
            del argv[i:i + 2]

        def build(out: Path) -> None:
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(ROOT)  # ARGS are relative to the repository root
                assert main([*argv, "--out", str(out), "--no-figures"]) == 0  # the tables are compared

        key = hashlib.sha256(shlex.join(argv).encode()).hexdigest()[:16]
        return (build_once(tmp_path_factory, f"report-{key}", build) / "report.md").read_text()

    return report


def _block_id(block: tuple[str, str, str]) -> str:
    """The page and the runs folder its block reports on (the block text itself is no readable id)."""
    page, args, _ = block
    return f"{page}:{shlex.split(args)[0]}"


def claim_lines(text: str) -> list[str]:
    """The generated claim sentences of a text: the list lines under a `**Claims**` title."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("**"):
            inside = line.startswith("**Claims**")
        elif inside and line.startswith("- "):
            out.append(line)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("page,args,body", generated_blocks(), ids=[_block_id(b) for b in generated_blocks()])
def test_a_pages_tables_are_the_reports_tables(page, args, body, report_of):
    report = report_of(args)
    quoted = tables(body)
    assert quoted, f"{page}: a generated block without a table"
    for table in quoted:
        assert table in report, f"{page}: this table is not what `python -m pelab.report {args}` builds now:\n{table}"
    for claim in claim_lines(body):  # the claim sentences, verbatim: generated from the verdicts, never typed
        assert claim in report.splitlines(), f"{page}: this claim is not what `python -m pelab.report {args}` says:\n{claim}"


@pytest.mark.slow
def test_new_runs_naming_the_optimizer_join_the_committed_runs_rows(tmp_path):
    """Runs launched now record optim._target_, the committed runs do not: a study folder holding both builds the
    tables its page quotes (experiments/corpora: each row's seed-0 run given the key the config names today)."""
    import json
    import shutil

    from pelab.report.cli import main
    from pelab.training.config import OPTIMIZER

    page, args, body = next(b for b in generated_blocks() if b[0] == "experiments/corpora/README.md")
    argv = shlex.split(args)
    runs = tmp_path / "runs"
    shutil.copytree(ROOT / argv[0], runs)
    stamped = 0
    for summary in runs.rglob("summary.json"):
        record = json.loads(summary.read_text())
        assert "_target_" not in record["config"]["optim"]
        if record["config"]["seed"] == 0:
            record["config"]["optim"] = {"_target_": OPTIMIZER, **record["config"]["optim"]}
            summary.write_text(json.dumps(record, indent=2))
            stamped += 1
    assert stamped == 2  # one of each row's three seeds
    i = argv.index("--out")
    argv[i + 1] = str(tmp_path / "report")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the other arguments are relative to the repository root
        assert main([str(runs), *argv[1:], "--no-figures"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    for table in tables(body):
        assert table in report, f"{page}: a table changed once some runs name the optimizer:\n{table}"


# The sections of a findings page that make claims, and what counts as a number in them: digits standing alone
# ("1.28", "3 seeds", "8 ×", "−0.07"), not names that hold digits (t5_bias, v3, L128, s0), not text in backticks
# (a setting: `trainer.max_steps=1500`) or in a link's target.
CLAIM = r"(findings|what (the runs|it|they) (supports?|shows?)|claims)"
CLAIM_HEADING = re.compile(rf"^#{{1,4}} .*{CLAIM}", re.IGNORECASE)
# a bold-titled claim paragraph, to its blank line, and the list it introduces (after a blank line, the lines that
# start a list item or continue one, up to the first line that does neither)
CLAIM_PARAGRAPH = re.compile(rf"^\*\*{CLAIM}", re.IGNORECASE)
NUMBER = re.compile(r"(?<![\w.=/@`+−-])[−+-]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:\s?%|\s?×)?(?![\w])")


def claim_numbers(text: str) -> list[tuple[int, str]]:
    """(line, number) of every number in a claim section or claim paragraph (with its list) of a page outside its
    generated blocks and code."""
    found, section, paragraph, gap, fence, generated = [], 0, False, False, False, False
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            gap = paragraph
            continue
        if gap:  # past a blank line a claim paragraph goes on only into its list
            paragraph, gap = line.startswith(("- ", "* ", "  ")), False
        if line.startswith("```"):
            fence = not fence
        elif line.startswith("<!-- generated:"):
            generated = True
        elif line.startswith("<!-- end generated"):
            generated = False
        elif (m := re.match(r"^(#+) ", line)) and not fence:
            level, paragraph = len(m.group(1)), False
            if CLAIM_HEADING.match(line):
                section = level
            elif section and level <= section:
                section = 0
            continue
        if fence or generated or line.startswith(("<!--", "```")):
            continue
        paragraph = paragraph or bool(CLAIM_PARAGRAPH.match(line))
        if section or paragraph:
            prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))
            found += [(i, n.group(0)) for n in NUMBER.finditer(prose)]
    return found


def test_a_claim_outside_a_generated_block_carries_no_number():
    """Findings prose cannot contradict its tables: in the sections of a page that make claims (Findings, What the
    runs support, Claims) and in its bold-titled claim paragraphs (What it shows, ...) with their lists, every number
    sits in a generated block (the verdicts, the claim sentences, the tables, the Setup list) that the report builds
    from the committed runs; the prose around them says what they mean."""
    assert claim_numbers("## Findings\nrope is 1.28× alibi over `trainer.max_steps=1500` in 3 seeds (t5_bias, v3)\n"
                         "<!-- generated: python -m pelab.report x -->\n1.5\n<!-- end generated -->\n## Setup\n4 "
                         "layers\n**What it shows.** 12 of 54\nresolved\n\n7 steps\n**Claims that change**:\n\n- 5 "
                         "seeds\n  over 6\n\n- 8 ×\n\nDone in 9 min") == [
        (2, "1.28×"), (2, "3"), (8, "12"), (8, "54"), (14, "5"), (15, "6"), (17, "8 ×")]
    pages = [page for page in sorted((ROOT / "experiments").rglob("*.md"))
             if not (page.name == "report.md" and page.parent.name == "report")]  # a report the CLI wrote
    offending = {str(page.relative_to(ROOT)): found for page in pages if (found := claim_numbers(page.read_text()))}
    assert not offending, "numbers typed into claims (page: [(line, number), ...]): " + "; ".join(
        f"{page}: {found[:8]}{' ...' if len(found) > 8 else ''}" for page, found in offending.items())
