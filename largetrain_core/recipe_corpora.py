"""The demo data of the fine-tuning recipes, converted from Debian packages (``scripts/fetch_corpora.sh``).

Two converters, pure functions plus a command line
(``python -m largetrain_core.recipe_corpora fortunes|faq SRC_DIR OUT_FILE``):

* **fortunes** -> ``fortunes.jsonl``, one labelled record a line,
  ``{"id": "<category>-<n>", "text": <fortune>, "label": <category>}``, from the fortune files of
  Debian's ``fortunes`` package (``usr/share/games/fortunes/``). The file name is the category.
  Format of a fortune file (fortune(6), strfile(1)): UTF-8 text (the package's ``<name>.u8`` links
  say so), entries separated by a line holding only ``%``; ``<name>.dat`` is strfile's binary
  index and is never read.
* **faq** -> ``python_faq.jsonl``, one chat record a line,
  ``{"id": "<page>-<n>", "messages": [{"role": "user", "content": <question>},
  {"role": "assistant", "content": <answer>}]}``, from the reStructuredText sources of the Python
  FAQ (``usr/share/doc/python3.11/html/_sources/faq/<page>.rst.txt`` of Debian's
  ``python3.11-doc``): a question is a section title, its answer the section's text.

``<n>`` counts from 1 in source order over the records kept. Records are written in order
(categories in the order given, pages sorted by name), as UTF-8 JSON lines with non-ASCII kept.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from largetrain_core import fs

# Chosen for distinct subjects; the sizes are those of fortunes 1:1.99.1-7.3 (entries, bytes):
# art 465/85 kB, computers 1050/238 kB, education 203/39 kB, food 198/34 kB, law 205/57 kB,
# love 150/20 kB, medicine 74/19 kB, pets 52/7 kB, politics 703/115 kB, science 625/130 kB,
# sports 147/37 kB, startrek 227/30 kB. Left out for overlapping these: linux, linuxcookie, perl
# (computers), work, people, men-women, wisdom, platitudes (general aphorisms), and the rest.
# Kept as the package has them: 2 texts under two labels each (law and politics, law and science)
# and 2 repeated within a category; largetrain_core.classification's split counts such held-out texts.
DEFAULT_CATEGORIES = (
    "art",
    "computers",
    "education",
    "food",
    "law",
    "love",
    "medicine",
    "pets",
    "politics",
    "science",
    "sports",
    "startrek",
)

# ---------------------------------------------------------------------------------------- fortunes

_CATEGORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # C0 controls and DEL, except tab and newline


def _overstrike(line: str) -> str:
    """The line as a terminal shows it: a backspace moves back one column and the next character
    replaces the one there, so ``_\\bx`` (underlined) and ``x\\bx`` (bold) both read ``x``. This is
    col(1) ``-b``: "output only the last character written to each column"."""
    if "\b" not in line:
        return line
    cells: list[str] = []
    col = 0
    for ch in line:
        if ch == "\b":
            col = max(col - 1, 0)
            continue
        if col < len(cells):
            cells[col] = ch
        else:
            cells.append(ch)
        col += 1
    return "".join(cells)


def read_utf8(path: Path) -> str:
    """The text of ``path``, strictly UTF-8. Raises ValueError naming the file, the line and the byte offset
    of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}: line {line} (byte {e.start}): not UTF-8: {e.reason}") from e


def parse_fortunes(text: str, category: str) -> list[str]:
    """The fortunes of one fortune file's ``text``, in file order.

    Rules (fortune(6) and strfile(1) of fortune-mod): entries are separated by a line holding only
    ``%`` (after CRLF or CR line ends are read as LF; a line that merely starts with ``%`` is text);
    the first entry starts at the top of the file; a ``%`` at the end of the file ends the last
    entry. Each entry is cleaned the way a terminal would show it: backspace overstrikes resolved
    (:func:`_overstrike`), other control characters but tab dropped (the bell, ``^G``, of a few
    jokes), trailing whitespace of each line and leading and trailing blank lines removed.
    Entries left empty (``%`` twice in a row, blank entries) are skipped. ``category`` only names
    the source in errors; it is not checked here.
    """
    del category  # the text is parsed the same whatever its category
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    fortunes: list[str] = []
    entry: list[str] = []

    def close() -> None:
        lines = [_CONTROL.sub("", _overstrike(line)).rstrip() for line in entry]
        while lines and not lines[0]:
            lines.pop(0)
        while lines and not lines[-1]:
            lines.pop()
        if lines:
            fortunes.append("\n".join(lines))
        entry.clear()

    for line in text.split("\n"):
        if line == "%":
            close()
        else:
            entry.append(line)
    close()
    return fortunes


def fortune_records(directory: str | Path, categories: list[str] | tuple[str, ...]) -> list[dict]:
    """``{"id": "<category>-<n>", "text": ..., "label": <category>}`` for every fortune of the files
    ``<directory>/<category>`` (each decoded as UTF-8, parsed by :func:`parse_fortunes`), the
    categories in the order given.

    Only plain file names are accepted as categories, so the offensive set (``off/`` in
    fortune-mod's layout, Debian's ``fortunes-off``) and anything outside ``directory`` cannot be
    named, nor can the ``.dat`` index files or the ``.u8`` links.

    Raises ValueError for an empty or repeated category list, a category that is not a plain name
    (letters, digits, ``-``, ``_``) or ends in ``.dat``/``.u8``, a symlink, a file that is not UTF-8
    (naming the file, line and byte offset) or holds no fortune; FileNotFoundError naming the path
    of a missing category.
    """
    directory = Path(directory)
    if not categories:
        raise ValueError("no fortune categories given")
    if len(set(categories)) != len(categories):
        raise ValueError(f"fortune categories repeated: {', '.join(categories)}")
    records: list[dict] = []
    for category in categories:
        if not _CATEGORY.fullmatch(category):
            raise ValueError(
                f"fortune category {category!r}: not a plain file name (letters, digits, '-', '_'); "
                "subdirectories such as the offensive off/ set are never read"
            )
        path = directory / category
        if path.is_symlink():
            raise ValueError(f"{path}: a symlink (fortune's .u8 links name the real files); give the file's name")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such fortune file (category {category!r})")
        text = read_utf8(path)
        fortunes = parse_fortunes(text, category)
        if not fortunes:
            raise ValueError(f"{path}: no fortune in the file (entries are separated by lines holding only '%')")
        records.extend({"id": f"{category}-{n}", "text": t, "label": category} for n, t in enumerate(fortunes, 1))
    return records


# --------------------------------------------------------------------------------------- python FAQ

# reStructuredText section adornment: one non-alphanumeric printable ASCII character repeated
# (docutils "Sections").
_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1*[ \t]*")
_EXPLICIT = re.compile(r"(?P<indent>[ \t]*)\.\.(?:[ \t]+(?P<rest>.*))?$")
_DIRECTIVE = re.compile(r"(?P<name>[A-Za-z0-9][\w.:+-]*?)[ \t]*::(?:[ \t].*)?$")
# Directives that render nothing of the answer in the HTML pages: navigation, source highlighting,
# index entries, doctest set-up (Sphinx: "testsetup ... is not shown in the output").
DROPPED_DIRECTIVES = frozenset(
    {"contents", "highlight", "index", "toctree", "sectionauthor", "tabularcolumns", "testsetup", "testcleanup"}
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _dropped_block(lines: list[str], i: int) -> int:
    """When ``lines[i]`` starts explicit markup that renders nothing (a hyperlink target
    ``.. _label:``, a comment, a directive of DROPPED_DIRECTIVES), the index just past the block:
    its indented continuation lines (docutils: an explicit markup block runs to the first line
    indented no deeper than its ``..``, across blank lines) and the blank lines after it. Else ``i``.
    An empty comment (``..`` alone) is its line alone (docutils: it "does not consume any
    indented text following")."""
    m = _EXPLICIT.fullmatch(lines[i])
    if not m:
        return i
    rest = m.group("rest") or ""
    if not rest.strip():
        j = i + 1
    else:
        directive = _DIRECTIVE.fullmatch(rest)
        if directive and directive.group("name") not in DROPPED_DIRECTIVES:
            return i
        if rest.startswith(("[", "|")) and not directive:
            return i  # footnote, citation or substitution definition: content
        indent = len(m.group("indent"))
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
            j += 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    return j


def _titles(lines: list[str]) -> list[tuple[int, int, tuple[str, bool], str]]:
    """(first line, line past the adornment, style, title text) of each section title: a line not
    indented (or, under an overline, any line) that is not itself an adornment, followed by an
    adornment line at least as long as the text or of 4 characters or more (docutils takes a
    shorter underline of 4 or more with a warning, a shorter one of under 4 for text); with an
    overline of the same character it is an overlined title, a style of its own (docutils)."""
    found = []
    i = 0
    while i + 1 < len(lines):
        text, under = lines[i], lines[i + 1]
        long_enough = len(under.rstrip()) >= min(4, len(text.strip()))
        if text.strip() and not _ADORNMENT.fullmatch(text) and _ADORNMENT.fullmatch(under) and long_enough:
            free = not found or found[-1][1] < i  # the line above is not the underline of the title before
            over = free and i > 0 and _ADORNMENT.fullmatch(lines[i - 1]) and lines[i - 1].rstrip()[0] == under[0]
            if over or _indent(text) == 0:
                start = i - 1 if over else i
                found.append((start, i + 2, (under[0], bool(over)), text.strip()))
                i += 2
                continue
        i += 1
    return found


def _render(lines: list[str]) -> str:
    """``lines`` with the markup that renders nothing dropped (:func:`_dropped_block`), leading and
    trailing blank lines removed, joined with newlines."""
    kept: list[str] = []
    i = 0
    while i < len(lines):
        j = _dropped_block(lines, i)
        if j == i:
            kept.append(lines[i].rstrip())
            i += 1
        else:
            i = j
    while kept and not kept[0]:
        kept.pop(0)
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept)


def parse_faq_rst(text: str, page: str) -> list[tuple[str, str]]:
    """(question, answer) pairs of one FAQ page's reStructuredText ``text``, in page order.

    Rules: section titles and their levels as docutils reads them (a title underlined, or over- and
    underlined, with one punctuation character; levels in the order the styles first appear). The
    page's first title is the page title: never a question, its introduction not part of any
    answer. Every other section whose own text (before its first subsection) is not empty is a
    question, its title the question and its whole text, subsections included with their titles,
    up to the next title of the same or a higher level, the answer; a section whose own text is
    empty (a group such as "General Information") is not a question, its subsections are looked at
    in turn. The rst text is kept as it is (markup, literal blocks, roles), except explicit markup
    that renders nothing (:func:`_dropped_block`: ``.. _label:`` targets, comments,
    ``.. contents::``, ``.. highlight::``, ``.. index::``, ...), trailing whitespace and leading and
    trailing blank lines. CRLF and CR line ends are read as LF.

    Raises ValueError naming ``page`` when the text has no section title at all.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    titles = _titles(lines)
    if not titles:
        raise ValueError(f"FAQ page {page!r}: no section title (a title is a line underlined with '-', '=', ...)")
    styles: list[tuple[str, bool]] = []
    for _, _, style, _ in titles:
        if style not in styles:
            styles.append(style)
    levels = [styles.index(style) for _, _, style, _ in titles]
    pairs: list[tuple[str, str]] = []
    k = 1  # titles[0] is the page title
    while k < len(titles):
        start, body, _, question = titles[k]
        following = [t for t in range(k + 1, len(titles)) if levels[t] <= levels[k]]
        after = following[0] if following else len(titles)
        end = titles[after][0] if after < len(titles) else len(lines)
        own_end = titles[k + 1][0] if k + 1 < len(titles) else len(lines)
        if _render(lines[body:own_end]):
            answer = _render(lines[body:end])
            pairs.append((question, answer))
            k = after
        else:
            k += 1
    return pairs


def faq_records(directory: str | Path) -> list[dict]:
    """Chat records ``{"id": "<page>-<n>", "messages": [user question, assistant answer]}`` of every
    ``<page>.rst.txt`` (Sphinx's copy of a page's source; ``<page>.rst`` too) in ``directory``,
    pages sorted by name, parsed by :func:`parse_faq_rst`; a page without questions (the index)
    adds none.

    Raises FileNotFoundError when ``directory`` holds no such file, ValueError naming the file for
    one that is not UTF-8 (with line and byte offset) or has no section title.
    """
    directory = Path(directory)
    pages = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith((".rst.txt", ".rst")))
    if not pages:
        raise FileNotFoundError(f"{directory}: no FAQ page (<page>.rst.txt)")
    records: list[dict] = []
    for path in pages:
        page = path.name.removesuffix(".txt").removesuffix(".rst")
        text = read_utf8(path)
        try:
            pairs = parse_faq_rst(text, page)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        records.extend(
            {
                "id": f"{page}-{n}",
                "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
            }
            for n, (q, a) in enumerate(pairs, 1)
        )
    return records


# ----------------------------------------------------------------------------------- command line


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """``records`` as JSON lines (UTF-8, non-ASCII kept, keys in the records' order), written
    atomically (a temporary file renamed into place)."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    fs.write_atomic(str(path), data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m largetrain_core.recipe_corpora",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=("fortunes", "faq"))
    p.add_argument("src_dir", help="usr/share/games/fortunes/ (fortunes) or html/_sources/faq/ (faq)")
    p.add_argument("out_file", help="the JSONL file to write")
    p.add_argument(
        "--categories",
        default=",".join(DEFAULT_CATEGORIES),
        help="fortunes only: comma-separated fortune files to read (default: %(default)s)",
    )
    args = p.parse_args(argv)
    try:
        if args.kind == "fortunes":
            records = fortune_records(args.src_dir, [c for c in args.categories.split(",") if c])
        else:
            records = faq_records(args.src_dir)
    except (OSError, ValueError) as e:
        print(f"recipe_corpora {args.kind}: {e}", file=sys.stderr)
        return 1
    write_jsonl(args.out_file, records)
    if args.kind == "fortunes":
        counts: dict[str, int] = {}
        for r in records:
            counts[r["label"]] = counts.get(r["label"], 0) + 1
        shown = ", ".join(f"{k} {v}" for k, v in counts.items())
        print(f"{args.out_file}: {len(records)} fortunes in {len(counts)} categories ({shown})")
    else:
        pages: dict[str, int] = {}
        for r in records:
            page = r["id"].rsplit("-", 1)[0]
            pages[page] = pages.get(page, 0) + 1
        shown = ", ".join(f"{k} {v}" for k, v in pages.items())
        print(f"{args.out_file}: {len(records)} question-answer pairs ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
