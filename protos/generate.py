"""Generate the Python code of attnserve's protocols: `make protos` runs this file.

Runs grpc_tools.protoc on every .proto under protos/ (this folder) with the checkout's root as the
output: `protos/attnserve/v1/generation.proto` becomes the module `attnserve.v1.generation_pb2`
in `attnserve/v1/`, the very name protoc records in the generated code, so its imports, pickling
and reflection need no rewriting. The output is committed; a test regenerates it into a temporary
folder and fails if the committed files differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
OUT_ROOT = PROTO_ROOT.parent  # the checkout: the generated modules land in attnserve/

# Protocols whose message names other installed packages also register: tritonclient's generated
# code puts the Open Inference Protocol's `inference.*` messages in protobuf's default descriptor
# pool, grpcio-health-checking puts grpc.health.v1's there, and a second file defining the same
# names there fails to import. Our copies of those protocols build their descriptors in a pool of
# their own, so both import into one process (the wire format does not depend on the pool).
PRIVATE_POOL = ("attnserve/inference/", "attnserve/health/")
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "POOL = _descriptor_pool.DescriptorPool()  # not the default pool: see protos/generate.py\n"


def proto_files(root: Path = PROTO_ROOT) -> list[str]:
    """Every .proto under `root`, as paths relative to it (the names protoc records)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.proto"))


def use_own_pool(source: str) -> str:
    """Build a generated *_pb2.py's descriptors in a pool of its own instead of the default one."""
    if _DEFAULT_POOL not in source:
        raise RuntimeError("protoc's output changed: no default-pool AddSerializedFile to replace")
    return source.replace(_DEFAULT_POOL, _OWN_POOL + "DESCRIPTOR = POOL.AddSerializedFile(")


def generate(out_dir: Path = OUT_ROOT, root: Path = PROTO_ROOT) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto under `out_dir`; returns them."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = proto_files(root)
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
        written += [Path(f"{stem}{suffix}") for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
        if proto.startswith(PRIVATE_POOL):
            module = Path(f"{stem}_pb2.py")
            module.write_text(use_own_pool(module.read_text()))
    return written


def main() -> int:
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_ROOT):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
