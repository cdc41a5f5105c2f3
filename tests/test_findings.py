"""The findings pages quote generated tables, not typed ones: every block of an experiments/ page between
`<!-- generated: python -m pelab.report ARGS -->` and `<!-- end generated -->` holds tables that the report
built from the committed run folders (ARGS, relative to the repository root) contains verbatim."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("page,args,body", generated_blocks(), ids=lambda x: x if "/" in x else None)
def test_a_pages_tables_are_the_reports_tables(page, args, body, tmp_path, monkeypatch):
    from pelab.report.cli import main

    monkeypatch.chdir(ROOT)
    argv = [a for a in shlex.split(args)]
    if "--out" in argv:  # the page names where it keeps the report; the test builds its own
        i = argv.index("--out")
        del argv[i:i + 2]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    quoted = tables(body)
    assert quoted, f"{page}: a generated block without a table"
    for table in quoted:
        assert table in report, f"{page}: this table is not what `python -m pelab.report {args}` builds now:\n{table}"
