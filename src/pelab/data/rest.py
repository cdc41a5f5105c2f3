"""Literal and code blocks of reStructuredText, found line by line (no docutils): what `data=django_docs` counts as
code (its share of the bytes) and removes with `data.code=strip`. Everything else of the markup stays as written
(inline roles, section underlines, other directives, link targets): it is the text a reader of the source sees.

A code block is, as docutils and Sphinx define them (docutils' "reStructuredText Markup Specification", sections
"Literal Blocks" and "Doctest Blocks"; Sphinx's "Showing code examples"):
- a code directive (`CODE_DIRECTIVES`: `.. code-block:: python`, Django's `.. console::`, ...) with its options and
  its body, the lines after it that are blank or indented deeper than the directive;
- a literal block: the lines indented deeper than a paragraph line that ends in `::` (its directive lines `.. x::`
  excluded), after the blank line that follows it; when stripped, the marker is rendered as docutils renders it
  (`text::` -> `text:`, `text ::` -> `text`, a lone `::` line removed);
- a doctest block: a paragraph whose first line starts with `>>>`, up to the next blank line.
Blank lines at the end of a block are not counted as code (they separate it from what follows).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

CODE_DIRECTIVES = ("code-block", "code", "sourcecode", "console", "parsed-literal", "doctest", "testcode",
                   "testoutput", "highlight", "literalinclude")
_CODE_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(" + "|".join(CODE_DIRECTIVES) + r")::")
_EXPLICIT = re.compile(r"^\s*\.\.(\s|$)")  # a directive, comment or target line: not a paragraph


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index after the last non-blank line, from `start` on, of the block indented deeper than `indent`."""
    end = i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        if lines[i].strip():
            end = i + 1
        i += 1
    return end


def code_spans(lines: list[str]) -> Iterator[tuple[int, int, int | None]]:
    """(first, stop, marker) line ranges of the code blocks of `lines` (lines without their newline), in order;
    `marker`: the index of the paragraph line ending in `::` that opens a literal block, else None."""
    i, in_paragraph = 0, False
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i, in_paragraph = i + 1, False
            continue
        directive = _CODE_DIRECTIVE.match(line)
        if directive:
            stop = _block_end(lines, i + 1, _indent(line))
            yield i, max(stop, i + 1), None
            i, in_paragraph = max(stop, i + 1), False
            continue
        if not in_paragraph and line.lstrip().startswith(">>>"):
            stop = i
            while stop < len(lines) and lines[stop].strip():
                stop += 1
            yield i, stop, None
            i = stop
            continue
        if line.rstrip().endswith("::") and not _EXPLICIT.match(line):
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j > i + 1 and j < len(lines) and _indent(lines[j]) > _indent(line):
                stop = _block_end(lines, j, _indent(line))
                yield j, stop, i
                i, in_paragraph = stop, False
                continue
        in_paragraph = not _EXPLICIT.match(line)
        i += 1


def _marker_text(line: str) -> str | None:
    """The paragraph line that opened a literal block, as docutils renders it (None: the line goes)."""
    body = line.rstrip()[:-2]
    if not body.strip():
        return None
    return body.rstrip() if body.endswith((" ", "\t")) else body + ":"


def strip_code(text: str) -> str:
    """`text` without its code blocks (`code_spans`); runs of blank lines left behind are folded to one."""
    lines = text.split("\n")
    drop: set[int] = set()
    markers: dict[int, str | None] = {}
    for first, stop, marker in code_spans(lines):
        drop.update(range(first, stop))
        if marker is not None:
            markers[marker] = _marker_text(lines[marker])
    kept = []
    for i, line in enumerate(lines):
        if i in drop or (i in markers and markers[i] is None):
            continue
        kept.append(markers.get(i, line) if i in markers else line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept))


def code_bytes(text: str) -> int:
    """UTF-8 bytes of `text` inside code blocks (each line with its newline)."""
    lines = text.split("\n")
    return sum(len(lines[i].encode("utf-8")) + 1 for first, stop, _ in code_spans(lines) for i in range(first, stop))
