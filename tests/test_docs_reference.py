"""The committed reference pages (docs/reference/) are what `make docs-reference` writes today, and a
flag whose help changes without them being written again fails here."""

from __future__ import annotations

import argparse
import difflib
import importlib
import itertools
import sys
from pathlib import Path

import pytest

from attnserve.cli import subcommand_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"  # docs_reference.py and its package reference_pages/
PAGES = (
    "docs/reference/cli.md",
    "docs/reference/metrics.md",
    "docs/reference/grpc-api.md",
    "docs/reference/request-fields.md",
)


def first_difference(committed: str, generated: str, name: str, lines: int = 12) -> str:
    """The start of a unified diff from the committed page to the generated one ("" if equal)."""
    diff = difflib.unified_diff(
        committed.splitlines(), generated.splitlines(), f"{name} (committed)", f"{name} (generated)", lineterm=""
    )
    return "\n".join(itertools.islice(diff, lines))


def load_generator():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module("docs_reference")


@pytest.mark.parametrize("page", PAGES)
def test_committed_page_is_up_to_date(page):
    generator = load_generator()
    assert page in generator.PAGES
    committed = ROOT / page
    assert committed.is_file(), f"{page} is missing: run `make docs-reference`"
    diff = first_difference(committed.read_text(), generator.PAGES[page](), page)
    assert not diff, f"{page} is stale: run `make docs-reference`\n{diff}"


def test_every_page_is_tested():
    assert set(load_generator().PAGES) == set(PAGES)


def test_a_changed_flag_help_makes_the_cli_page_stale():
    """The page is rendered from the parser itself: change one flag's help there and the check names the page."""
    generator = load_generator()
    from reference_pages import cli_page

    def changed(name: str) -> argparse.ArgumentParser:
        parser = subcommand_parser(name)
        if name == "serve":
            port = next(a for a in parser._actions if "--port" in a.option_strings)
            port.help = "the port, changed without running make docs-reference"
        return parser

    page = "docs/reference/cli.md"
    text = cli_page.render(parser_of=changed)
    assert generator.stale({page: text}) == [page]
    assert "the port, changed without running make docs-reference" in text
    assert "the port, changed" not in (ROOT / page).read_text()
