"""What each install needs, and one install on two protobuf runtimes.

The generated code comes from grpcio-tools 1.80.1 (protobuf 6.31.1 gencode), so it runs on
protobuf 6 and 7 (pyproject.toml says why). .venv holds 6 (tritonclient[grpc] needs < 7) and
.venv-pb7 the newest 7: a server in each answers a client in the other, real processes on both
sides, and the greedy text must not change. A client host runs on the base install alone, and
`attnserve serve` without a runtime names the extras that bring one.
"""

import inspect
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import google.protobuf
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PB7_PYTHON = ROOT / ".venv-pb7" / "bin" / "python"
PROMPT = "def parse_args("
NEW_TOKENS = 24
TIMEOUT = 120

# `make test` always builds .venv-pb7 first; a bare `pytest` without it skips, saying how to get it.
needs_pb7 = pytest.mark.skipif(
    not PB7_PYTHON.exists(), reason="needs the protobuf 7 environment .venv-pb7 (`make test` builds it)"
)


def converse(target: str) -> dict:
    """Health, model info, a unary and a streamed greedy generation; runs here and in .venv-pb7."""
    import google.protobuf

    from attnserve.clients import Client

    with Client(target, timeout=60) as client:
        healthy, info = client.health(), client.model_info()
        whole = client.generate("def parse_args(", max_new_tokens=24)
        with client.stream("def parse_args(", max_new_tokens=24) as stream:
            streamed = "".join(delta.text for delta in stream)
    return {
        "protobuf": google.protobuf.__version__,
        "healthy": healthy,
        "vocab_size": info.vocab_size,
        "text": whole.text,
        "streamed": streamed,
    }


CLIENT_SCRIPT = "import json, sys\n" + inspect.getsource(converse) + "print(json.dumps(converse(sys.argv[1])))\n"

# `attnserve serve` that first prints the protobuf runtime of its own process.
SERVER_SCRIPT = (
    "import sys, google.protobuf\n"
    "print('protobuf', google.protobuf.__version__, flush=True)\n"
    "from attnserve.cli import main\n"
    "sys.exit(main())\n"
)


def major(version: str) -> int:
    return int(version.split(".")[0])


@pytest.fixture(scope="module")
def here(server) -> dict:
    """The reference: this process's client (protobuf 6) against the in-process server."""
    return converse(server.target)


@pytest.fixture(scope="module")
def pb7_server(tiny_model_dir):
    """`attnserve serve` run by .venv-pb7's python: (its protobuf version, its target)."""
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--provider", "cpu", "--threads", "1"]
    proc = subprocess.Popen(
        [str(PB7_PYTHON), "-c", SERVER_SCRIPT, *args, "--max-batch", "8", "--reflection"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, version, port = [], None, None
    for line in iter(proc.stdout.readline, ""):  # ends early if the server exits
        lines.append(line)
        if line.startswith("protobuf "):
            version = line.split()[1]
        if match := re.search(r"listening on \S+:(\d+)", line):
            port = int(match.group(1))
            break
    try:
        assert port and version, "the protobuf 7 server did not start:\n" + "".join(lines)
        yield version, f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@needs_pb7
def test_a_protobuf_7_client_reads_a_protobuf_6_server(server, here):
    proc = subprocess.run(
        [str(PB7_PYTHON), "-c", CLIENT_SCRIPT, server.target], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout)
    assert major(there["protobuf"]) != major(google.protobuf.__version__), (there["protobuf"], "server in .venv")
    assert there["healthy"] and there["text"] and there["text"] == there["streamed"]
    assert {**there, "protobuf": None} == {**here, "protobuf": None}


@needs_pb7
def test_a_protobuf_6_client_reads_a_protobuf_7_server(pb7_server, here):
    server_protobuf, target = pb7_server
    there = converse(target)
    assert major(server_protobuf) != major(there["protobuf"]), (server_protobuf, "client in .venv")
    assert there == here


def base_modules() -> set[str]:
    """Top-level modules of attnserve's base dependencies and of theirs, no extras, as installed here."""
    provides: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            provides.setdefault(canonicalize_name(dist), set()).add(module)
    seen, todo = set(), ["attnserve"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return {"attnserve"}.union(*(provides.get(dist, set()) for dist in seen))


# `attnserve ARGS...` on a host where modules are missing: "only:a,b" has just those (and the
# standard library), "without:a,b" lacks those; an import of a missing one fails as if uninstalled.
HOST_SCRIPT = """
import importlib.abc, sys
mode, _, names = sys.argv.pop(1).partition(":")
names = set(names.split(","))

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if (top not in names | set(sys.stdlib_module_names)) if mode == "only" else (top in names):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Missing())
from attnserve.cli import main
sys.exit(main())
"""


def on_host(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HOST_SCRIPT, modules, *args], capture_output=True, text=True, timeout=TIMEOUT
    )


def test_a_client_host_runs_on_the_base_install(server, here):
    """`attnserve generate` and `attnserve bench` against a real server, everything else missing."""
    client_host = "only:" + ",".join(sorted(base_modules()))
    assert "onnxruntime" not in client_host and "numpy" not in client_host, client_host
    proc = on_host(client_host, "generate", PROMPT, "--target", server.target, "--max-new-tokens", str(NEW_TOKENS))
    assert proc.returncode == 0 and proc.stdout.strip() == here["text"].strip(), proc.stderr
    bench = ["--concurrency", "1", "--requests", "2", "--warmup", "0", "--max-new-tokens", "4"]
    proc = on_host(client_host, "bench", "--target", server.target, *bench)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])


SERVING_EXTRAS = "pip install 'attnserve[cpu]' (or 'attnserve[gpu]' for CUDA)"


@pytest.mark.parametrize("host", ["without:onnxruntime", "client"])
def test_serve_without_a_runtime_names_the_extras_in_one_line(host, tmp_path):
    modules = "only:" + ",".join(sorted(base_modules())) if host == "client" else host
    proc = on_host(modules, "serve", "--model", str(tmp_path), "--port", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip()
    assert re.fullmatch(r"attnserve serve: error: \w+ is not installed; " + re.escape(SERVING_EXTRAS), line), line
    if host == "without:onnxruntime":
        assert "onnxruntime is not installed" in line
