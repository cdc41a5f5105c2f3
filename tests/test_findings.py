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
BLOCK = re.compile(r"<!-- generated: python -m pelab\.report (?P<args>[^>]*?) -->\n(?P<body>.*?)<!-- end generated -->",
                   re.DOTALL)


def generated_blocks() -> list[tuple[str, str, str]]:
    """(page, report arguments, block text) of every generated block under experiments/."""
    out = []
    for page in sorted((ROOT / "experiments").rglob("*.md")):
        for m in BLOCK.finditer(page.read_text()):
            out.append((str(page.relative_to(ROOT)), m["args"], m["body"]))
    return out


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
            "experiments/lost_in_the_middle/README.md", "experiments/context_extension/README.md"} <= {
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
                assert main([*argv, "--out", str(out)]) == 0

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
