"""The user's manual as the tests read it: README.md and every Markdown page under docs/, by path.
The tests that hold the manual to the code (tests/test_docs.py, the curl examples in
tests/test_openai_http.py) read it from here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
}
# Pages that may carry dates and commit ids: the measured reports and the decision records.
STAMPED = ("docs/reports/", "docs/design/decisions/")


def text() -> str:
    """Every page, one after another."""
    return "\n".join(PAGES.values())


def indented_lines(prefix: str) -> list[str]:
    """Lines of every page's indented code that start with `    PREFIX`, without the indent."""
    return [line[4:] for page in PAGES.values() for line in page.splitlines() if line.startswith("    " + prefix)]


def fenced(language: str) -> list[str]:
    """Every ```LANGUAGE block of every page."""
    return [
        code
        for page in PAGES.values()
        for code in re.findall(rf"^```{language}\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    ]
