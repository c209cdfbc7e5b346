"""Write the reference pages of the documentation from the code: `make docs-reference` runs this file.

docs/reference/cli.md comes from the parsers of `attnserve` (attnserve/cli.py), metrics.md from a
server's Prometheus registry (attnserve/server/metrics.py), grpc-api.md from the .proto files under
protos/ and their comments, request-fields.md from the table of request fields
(attnserve/request_fields.py); scripts/reference_pages/ has a module per page. The pages are committed
and never edited by hand: `--check` (and tests/test_docs_reference.py) renders them again and names
each committed page that differs. Knows nothing of MkDocs, which only shows the pages.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from reference_pages import cli_page, grpc_page, metrics_page, request_fields_page

ROOT = Path(__file__).resolve().parents[1]
PAGES: dict[str, Callable[[], str]] = {  # path from the checkout's root -> its renderer
    "docs/reference/cli.md": cli_page.render,
    "docs/reference/grpc-api.md": grpc_page.render,
    "docs/reference/metrics.md": metrics_page.render,
    "docs/reference/request-fields.md": request_fields_page.render,
}


def render_all() -> dict[str, str]:
    return {path: render() for path, render in PAGES.items()}


def stale(pages: dict[str, str], root: Path = ROOT) -> list[str]:
    """The pages whose committed file under `root` is missing or differs from `pages`' text."""
    return [path for path, body in pages.items() if not (root / path).is_file() or (root / path).read_text() != body]


def write(pages: dict[str, str], root: Path = ROOT) -> None:
    for path, body in pages.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed page is stale")
    args = parser.parse_args(argv)
    pages = render_all()
    if not args.check:
        write(pages)
        return 0
    outdated = stale(pages)
    for path in outdated:
        print(f"{path} is stale: run make docs-reference", file=sys.stderr)
    return 1 if outdated else 0


if __name__ == "__main__":
    sys.exit(main())
