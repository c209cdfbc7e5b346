"""The package's structure from its source: each subpackage's files and lines, the imports between
subpackages, and any cycle among them. For the architecture page and reviews of a restructuring:

    python scripts/structure.py [--root DIR] [--json]

Counts .py files under attnserve/ that are not generated (the protocol code `make protos` writes).
Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

GENERATED = ("_pb2.py", "_pb2_grpc.py")


def package_of(module: str) -> str:
    """attnserve.server.grpc_v1.servicer -> server; attnserve.flags -> flags (a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path, root: Path) -> set[str]:
    """Absolute names of everything `path` imports (relative imports resolved against `root`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(root).parent.parts
                base = ".".join(parts[: len(parts) - node.level + 1])
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
    return names


def structure(root: Path) -> dict:
    files: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted((root / "attnserve").rglob("*.py")):
        if path.name.endswith(GENERATED):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        package = package_of(module)
        files[package] += 1
        lines[package] += len(path.read_text().splitlines())
        ours = {name for name in imports(path, root) if name.startswith("attnserve.")}
        edges[package] |= {package_of(name) for name in ours} - {package}
    return {
        "packages": {p: {"files": files[p], "lines": lines[p]} for p in sorted(files)},
        "imports": {p: sorted(edges[p]) for p in sorted(files)},
        "cycles": cycles(edges),
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle among the packages, as the path that closes it (depth-first)."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        for other in sorted(edges.get(node, ())):
            visit(other, [*path, node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout")
    p.add_argument("--json", action="store_true", help="print the JSON only")
    args = p.parse_args()
    found = structure(args.root)
    if not args.json:
        for package, counts in found["packages"].items():
            imported = ", ".join(found["imports"][package]) or "-"
            print(f"{package:14} {counts['files']:3} files {counts['lines']:6} lines  imports {imported}")
        print(f"cycles: {found['cycles'] or 'none'}")
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
