"""Markdown for the generated reference pages: the banner, escaped text, code spans, tables.

Knows nothing of what a page documents. What it writes renders alike in MkDocs (Python-Markdown,
the Material theme) and on GitHub, and holds no link, so no page can point at a missing file.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

BANNER = "<!-- Generated from the code by `make docs-reference` (scripts/docs_reference.py): do not edit by hand. -->"

_CODE_SPAN = re.compile(r"(`[^`]+`)")
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # emphasis; max_new_tokens is plain
_ESCAPES = str.maketrans({"\\": "\\\\", "*": "\\*", "`": "\\`", "|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def page(title: str, intro: str, body: Iterable[str]) -> str:
    """A whole page: the banner first, then its title, intro and body blocks, blank-line separated."""
    return "\n\n".join([BANNER, f"# {title}", intro, *body]) + "\n"


def text(source: str) -> str:
    """Prose as Markdown on one line: its `code spans` kept, whatever else Markdown would read escaped."""
    parts = _CODE_SPAN.split(" ".join(source.split()))
    return "".join(code(p[1:-1]) if i % 2 else _escape(p) for i, p in enumerate(parts))


def paragraphs(source: str) -> str:
    """Prose whose blank lines separate paragraphs, each escaped as text() does."""
    blocks = re.split(r"\n\s*\n", source.strip())
    return "\n\n".join(text(block) for block in blocks if block.strip())


def code(literal: str) -> str:
    """`literal` as inline code; as HTML where a `|` would end a table cell or a backtick the span."""
    if "|" in literal or "`" in literal or not literal.strip():
        return "<code>" + html.escape(literal).replace("|", "&#124;") + "</code>"
    return f"`{literal}`"


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A table whose cells are already Markdown (escaped with text() or code())."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cell or " " for cell in line) + " |" for line in lines)


def code_block(body: str) -> str:
    return f"```text\n{body.rstrip()}\n```"


def _escape(plain: str) -> str:
    return _LONE_UNDERSCORE.sub(r"\\_", plain.translate(_ESCAPES))
