"""Refill the generated tables of the findings pages from the committed runs: in every experiments/ page, each
block between `<!-- generated: python -m pelab.report ARGS -->` and `<!-- end generated -->` has its tables
(each under a `**title**` line) replaced by the tables of that title in the report ARGS builds (and the report
itself rewritten where --out says). tests/test_findings.py checks the pages against the report.

    python experiments/fill_generated.py            # from the repository root
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: python -m pelab\.report (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.DOTALL)
# a table under its bold title, with the report's caption paragraph between them or not; or a list under its bold
# title (the generated claim sentences); a title starts its line (a bold word inside a paragraph is no title)
TITLED = re.compile(r"(?m)^(\*\*(?P<title>[^*\n]+)\*\*[^\n]*\n\n)(?:[^|\n-][^\n]*\n\n)?((?:\|[^\n]*\n)+|(?:- [^\n]*\n)+)")


def report_tables(markdown: str) -> dict[str, str]:
    """title -> table (its lines, newline-terminated) of a report."""
    return {m["title"]: m.group(3) for m in TITLED.finditer(markdown)}


def refill(body: str, tables: dict[str, str], page: Path) -> str:
    def one(m: re.Match) -> str:
        if m["title"] not in tables:
            sys.exit(f"{page}: the report has no table titled {m['title']!r}; titles: {sorted(tables)}")
        return m.group(1) + tables[m["title"]]

    return TITLED.sub(one, body)


def main() -> None:
    from pelab.report.cli import main as report

    for page in sorted((ROOT / "experiments").rglob("*.md")):
        text = page.read_text()
        if "<!-- generated:" not in text:
            continue

        def fill(m: re.Match, page: Path = page) -> str:
            if report(shlex.split(m["args"])) != 0:
                sys.exit(f"{page}: python -m pelab.report {m['args']} failed")
            argv = shlex.split(m["args"])
            out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[0]) / "report"
            return m.group(1) + refill(m["body"], report_tables((out / "report.md").read_text()), page) + m.group(4)

        page.write_text(BLOCK.sub(fill, text))
        print(f"refilled {page.relative_to(ROOT)}")


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    main()
