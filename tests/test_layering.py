"""The one-way flow of DESIGN.md, enforced on the source: model -> export -> server -> clients,
with the torch-free tokenizer package below them all (training, export and serving share it).

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
FORBIDDEN = {
    "ray_serve": {"torch", "onnx", "onnxscript", "attnserve.model", "attnserve.clients"},
    # load tests drive a server process from outside: gRPC, /metrics, /proc (and the leak switch's name)
    "loadtest": {"torch", "numpy", "onnx", "onnxruntime", "attnserve.model", "attnserve.export"},
    "tokenizer": {
        "torch",
        "numpy",
        "onnx",
        "onnxruntime",
        "grpc",
        "google.protobuf",
        "attnserve.model",
        "attnserve.export",
        "attnserve.server",
        "attnserve.clients",
        "attnserve.protos",
    },
    "model": {
        "onnx",
        "onnxruntime",
        "onnxscript",
        "grpc",
        "google.protobuf",
        "attnserve.export",
        "attnserve.server",
        "attnserve.clients",
        "attnserve.protos",
    },
    "export": {"grpc", "google.protobuf", "attnserve.server", "attnserve.clients", "attnserve.protos"},
    "server": {"torch", "onnx", "onnxscript", "attnserve.model", "attnserve.clients"},
    "clients": {"torch", "numpy", "onnx", "onnxruntime", "attnserve.model", "attnserve.export", "attnserve.server"},
    "protos": {"torch", "numpy", "onnxruntime", "attnserve.model", "attnserve.export", "attnserve.server"},
}
# The scheduler inside server/ sees a model only through slot_runner.py's seam (a ModelSpec and a
# SlotRunner): numpy and the tokenizer, no runtime, no gRPC, no protobuf, none of the runners.
ENGINE_MODULES = ["engine.py", "sequence.py", "sampling.py", "streaming.py", "slot_runner.py", "domain.py"]
ENGINE_FORBIDDEN = {
    "onnxruntime",
    "grpc",
    "google.protobuf",
    "torch",
    "attnserve.export",
    "attnserve.protos",
    "attnserve.server.model_runner",
    "attnserve.server.arena_runner",
    "attnserve.server.concat_runner",
    "attnserve.server.runners",
    "attnserve.server.kv_cache",
}
# what the server reads: the contract, the ONNX Runtime helpers, the KV arena and its drivers
TORCH_FREE_EXPORT_MODULES = ["contract.py", "genai.py", "ort_session.py", "arena.py", "arena_decoder.py", "runtime.py"]


def imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of everything a file imports (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = ["attnserve", package, *path.relative_to(ROOT / "attnserve" / package).parent.parts]
                base = ".".join(parts[: len(parts) - node.level + 1])
                names.add(f"{base}.{node.module}" if node.module else base)
            else:
                names.add(node.module)
    return names


def violates(name: str, forbidden: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_flow(package):
    problems = []
    for path in sorted((ROOT / "attnserve" / package).rglob("*.py")):
        for name in imported_modules(path, package):
            if violates(name, FORBIDDEN[package]):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", TORCH_FREE_EXPORT_MODULES)
def test_export_contract_is_torch_free(module):
    names = imported_modules(ROOT / "attnserve" / "export" / module, "export")
    assert not any(violates(n, {"torch", "onnx", "attnserve.model"}) for n in names), names


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_the_scheduler_sees_a_model_only_through_its_seam(module):
    names = imported_modules(ROOT / "attnserve" / "server" / module, "server")
    assert not [n for n in names if violates(n, ENGINE_FORBIDDEN)], names


def assert_runs(code: str) -> None:
    """`code` passes in a fresh interpreter (sys.modules starts empty there)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_engine_imports_no_runtime_and_no_grpc():
    assert_runs(
        "import sys, attnserve.server.engine\n"
        "loaded = [m for m in ('onnxruntime', 'grpc', 'google.protobuf', 'torch') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )


def test_serving_imports_load_no_torch():
    assert_runs(
        "import sys, importlib, pkgutil, attnserve.server as s, attnserve.export.contract\n"
        "for m in pkgutil.iter_modules(s.__path__): importlib.import_module('attnserve.server.' + m.name)\n"
        "import attnserve.cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
