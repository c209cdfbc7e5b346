"""Generate the Python code of the attnserve protocol: `make protos` runs this file.

Runs grpc_tools.protoc on every .proto under protos/ and rewrites the generated imports so the
code works inside the `attnserve.protos` namespace. The output is committed; a test regenerates
it into a temporary folder and fails if the committed files differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE = "attnserve.protos"  # where PROTO_ROOT is imported from once installed

# `from attnserve.v1 import generation_pb2 as ...` -> `from attnserve.protos.attnserve.v1 import ...`
_IMPORT = re.compile(r"^from ((?:attnserve|inference|health)(?:\.\w+)*) import (\w+_pb2)", re.MULTILINE)

# Protocols whose message names other installed packages also register: tritonclient's generated
# code puts the Open Inference Protocol's `inference.*` messages in protobuf's default descriptor
# pool, grpcio-health-checking puts grpc.health.v1's there, and a second file defining the same
# names there fails to import. Our copies of those protocols build their descriptors in a pool of
# their own, so both import into one process (the wire format does not depend on the pool).
PRIVATE_POOL = ("inference/", "health/")
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "POOL = _descriptor_pool.DescriptorPool()  # not the default pool: see attnserve/protos/generate.py\n"


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under `root`, as paths relative to it (the names protoc records)."""
    return sorted(p.relative_to(root) for p in root.rglob("*.proto"))


def fix_imports(source: str) -> str:
    """Point generated imports of sibling protos into the attnserve.protos namespace."""
    return _IMPORT.sub(rf"from {PACKAGE}.\1 import \2", source)


def use_own_pool(source: str) -> str:
    """Build a generated *_pb2.py's descriptors in a pool of its own instead of the default one."""
    if _DEFAULT_POOL not in source:
        raise RuntimeError("protoc's output changed: no default-pool AddSerializedFile to replace")
    return source.replace(_DEFAULT_POOL, _OWN_POOL + "DESCRIPTOR = POOL.AddSerializedFile(")


def generate(out_dir: Path = PROTO_ROOT, root: Path = PROTO_ROOT) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto into `out_dir`; returns them."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = [str(p) for p in proto_files(root)]
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    written = []
    for proto in protos:
        stem = out_dir / proto[: -len(".proto")]
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = Path(f"{stem}{suffix}")
            source = fix_imports(path.read_text())
            if suffix == "_pb2.py" and proto.startswith(PRIVATE_POOL):
                source = use_own_pool(source)
            path.write_text(source)
            written.append(path)
    return written


def main() -> int:
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
