"""The maps stay whole: each package's __init__.py docstring names every module and subpackage of the
package, and the architecture page (docs/design/index.md) names every top-level package and module.

A map names a module as `sampling.py` and a subpackage as `session/`, each with a line on what it holds.
A name inside a path (core/client.py, attnserve/core/) points at another package and does not count.
Generated code (`*_pb2*.py`, written by `make protos`) needs no line: the protocol packages v1/,
inference/ and health/ map only their subpackages.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attnserve"
ARCHITECTURE = ROOT / "docs" / "design" / "index.md"
PACKAGES = sorted(init.parent for init in PACKAGE.rglob("__init__.py"))
MODULE_NAME = re.compile(r"(?<![\w/.])(\w+\.py)(?![\w/])")  # a bare file name, not part of a path


def parts(package: Path) -> list[str]:
    """What the package's map must name: its modules as `name.py`, its subpackages as `name/`."""
    modules = [path.name for path in package.glob("*.py") if path.name != "__init__.py" and "_pb2" not in path.name]
    subpackages = [f"{path.name}/" for path in package.iterdir() if (path / "__init__.py").is_file()]
    return sorted(modules + subpackages)


def names(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w/])", text) is not None


def map_of(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def where(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("package", PACKAGES, ids=where)
def test_every_module_and_subpackage_is_on_its_package_map(package):
    text = map_of(package)
    missing = [name for name in parts(package) if not names(text, name)]
    assert not missing, (
        f"{where(package / '__init__.py')}: its docstring (the package's map) does not name "
        f"{', '.join(missing)}; add a line on what each holds, as the map names the others"
    )


@pytest.mark.parametrize("package", PACKAGES, ids=where)
def test_every_module_a_map_names_exists(package):
    """A module moved or removed leaves no line behind (other packages' files are named by their path)."""
    stale = sorted(set(MODULE_NAME.findall(map_of(package))) - set(parts(package)) - {"__init__.py"})
    assert not stale, (
        f"{where(package / '__init__.py')}: its docstring (the package's map) names {', '.join(stale)}, "
        f"which {where(package)}/ does not hold; remove the line, or name the file by its path (core/client.py)"
    )


def test_the_architecture_page_names_every_top_level_package_and_module():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = [name for name in parts(PACKAGE) if not names(text, name)]
    assert not missing, (
        f"{where(ARCHITECTURE)} does not name {', '.join(missing)} of attnserve/; add a line on each, "
        "in the page's style (a bullet of what it holds and what it may import)"
    )
