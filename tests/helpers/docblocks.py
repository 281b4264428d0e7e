"""The code blocks of the documentation (README.md, docs/**/*.md but the generated docs/CONFIG.md), for the
tests that run them.

Every fenced block has a language. ``text`` blocks are pictures and sample output, not commands; every
other block is preceded by a line ``<!-- checked by tests/FILE.py::TEST[, tests/FILE2.py::TEST2] -->``
naming the tests that run it (tests/unit/test_docs.py checks that each named test exists and reads that
document).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helpers import REPO

CHECKED = re.compile(r"^<!-- checked by (.+?) -->$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
GENERATED = {"docs/CONFIG.md"}


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository, e.g. "docs/guides/spark.md"
    line: int  # 1-based line of the opening fence
    lang: str  # the fence's info string ("" when missing)
    section: str  # the nearest heading above, without its #s
    text: str  # the block's content, dedented by the fence's indentation, ending with a newline
    checked_by: tuple[str, ...]  # "tests/FILE.py::TEST" entries of the annotation above the fence

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.section})"


def documents() -> list[str]:
    """README.md and every page under docs/ but the generated ones, relative to the repository."""
    docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
    return ["README.md", *(d for d in docs if d not in GENERATED)]


def blocks(doc: str) -> list[Block]:
    """The fenced code blocks of ``doc`` (a path relative to the repository), in order. Raises
    ValueError naming the file and line of a fence that is never closed."""
    lines = (REPO / doc).read_text().splitlines()
    out, section, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = line.lstrip("#").strip()
        m = FENCE.match(line)
        if m:
            indent, lang = m.group(1), m.group(2)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise ValueError(f"{doc}:{i + 1}: a code block that is never closed")
            text = "".join(
                f"{ln[len(indent) :] if ln.startswith(indent) else ln.lstrip()}\n" for ln in lines[i + 1 : end]
            )
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            c = CHECKED.match(above)
            checked = tuple(t.strip() for t in c.group(1).split(",")) if c else ()
            out.append(Block(doc, i + 1, lang, section, text, checked))
            i = end
        i += 1
    return out


def section_blocks(doc: str, section: str, lang: str | None = None) -> list[Block]:
    """The blocks of ``doc`` under the heading ``section`` (exact text), optionally of one language."""
    found = [b for b in blocks(doc) if b.section == section and (lang is None or b.lang == lang)]
    if not found:
        raise LookupError(f"{doc} has no {lang or ''} code block under the heading {section!r}")
    return found


def commands(block: Block) -> list[str]:
    """The shell commands of a block: comment-only lines dropped, trailing ``# ...`` comments cut,
    backslash continuations joined, surrounding whitespace stripped."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in joined.splitlines():
        line = strip_comment(line).strip()
        if line:
            out.append(line)
    return out


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` outside quotes that starts a word)."""
    quote, prev = None, " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return line[:i]
        prev = ch
    return line
