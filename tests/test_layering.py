"""The one-way flow of DESIGN.md, enforced on the source: model -> export -> runtime <- engine <-
server -> clients, with the torch-free tokenizer package below them all. The runtime implements
the engine's seam (it may import engine/slot_runner.py and nothing else of the engine).

Checked statically (every import statement of every file), and dynamically for the two
promises users rely on: a serving host needs no torch, a client host needs only grpcio.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package folder -> top-level modules (or attnserve subpackages) it must never import
NO_GRPC = {"grpc", "google.protobuf", "attnserve.protos", "attnserve.server", "attnserve.clients"}
FORBIDDEN = {
    "ray_serve": {"torch", "onnx", "onnxscript", "attnserve.model", "attnserve.clients"},
    "tokenizer": {
        "torch",
        "numpy",
        "onnx",
        "onnxruntime",
        *NO_GRPC,
        "attnserve.model",
        "attnserve.export",
        "attnserve.runtime",
        "attnserve.engine",
    },
    "model": {
        "onnx",
        "onnxruntime",
        "onnxscript",
        *NO_GRPC,
        "attnserve.export",
        "attnserve.runtime",
        "attnserve.engine",
    },
    "export": {*NO_GRPC, "attnserve.engine.engine", "attnserve.engine.sequence"},
    # ONNX Runtime, numpy and the tokenizer; of the engine, only its seam (ModelSpec)
    "runtime": {
        "torch",
        "onnx",
        "onnxscript",
        *NO_GRPC,
        "attnserve.model",
        "attnserve.export",
        "attnserve.engine.engine",
        "attnserve.engine.sequence",
        "attnserve.engine.sampling",
        "attnserve.engine.streaming",
        "attnserve.engine.domain",
    },
    # scheduling sees a model only through its seam: numpy and the tokenizer
    "engine": {"torch", "onnx", "onnxruntime", *NO_GRPC, "attnserve.model", "attnserve.export", "attnserve.runtime"},
    "server": {"torch", "onnx", "onnxscript", "attnserve.model", "attnserve.clients"},
    "clients": {
        "torch",
        "numpy",
        "onnx",
        "onnxruntime",
        "attnserve.model",
        "attnserve.export",
        "attnserve.runtime",
        "attnserve.engine",
        "attnserve.server",
    },
    "protos": {"torch", "numpy", "onnxruntime", "attnserve.model", "attnserve.export", "attnserve.server"},
}
# export's modules that a host without torch may import
TORCH_FREE_EXPORT_MODULES = ["genai.py"]
# load drivers run a server process from outside: gRPC, /metrics, /proc (and the leak switch's name)
LOAD_DRIVERS_NEVER = {"torch", "numpy", "onnx", "onnxruntime", "attnserve.model", "attnserve.export"}


def imported_modules(path: Path) -> set[str]:
    """Absolute names of everything a file imports (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(ROOT).parent.parts
                base = ".".join(parts[: len(parts) - node.level + 1])
                names.add(f"{base}.{node.module}" if node.module else base)
            else:
                names.add(node.module)
    return names


def violates(name: str, forbidden: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def offences(folder: Path, forbidden: set[str]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in sorted(imported_modules(path))
        if violates(name, forbidden)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_flow(package):
    problems = offences(ROOT / "attnserve" / package, FORBIDDEN[package])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", TORCH_FREE_EXPORT_MODULES)
def test_export_torch_free_modules_stay_so(module):
    names = imported_modules(ROOT / "attnserve" / "export" / module)
    assert not any(violates(n, {"torch", "onnx", "attnserve.model"}) for n in names), names


def test_the_package_never_imports_the_benchmarks():
    """benchmarks/ measures attnserve from outside and is left out of the wheel."""
    assert not offences(ROOT / "attnserve", {"benchmarks"})


def test_load_drivers_are_clients_of_a_server_process():
    problems = offences(ROOT / "benchmarks" / "loadtest", LOAD_DRIVERS_NEVER)
    assert not problems, "\n".join(problems)


def assert_runs(code: str) -> None:
    """`code` passes in a fresh interpreter (sys.modules starts empty there)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_engine_imports_no_runtime_and_no_grpc():
    assert_runs(
        "import sys, attnserve.engine.engine\n"
        "loaded = [m for m in ('onnxruntime', 'grpc', 'google.protobuf', 'torch') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )


def test_serving_imports_load_no_torch():
    assert_runs(
        "import sys, importlib, pkgutil, attnserve.server, attnserve.runtime, attnserve.engine\n"
        "for p in (attnserve.server, attnserve.runtime, attnserve.engine):\n"
        "    for m in pkgutil.iter_modules(p.__path__): importlib.import_module(p.__name__ + '.' + m.name)\n"
        "import attnserve.cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
