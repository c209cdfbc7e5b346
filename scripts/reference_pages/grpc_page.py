"""docs/reference/grpc-api.md: every service, rpc, message, field and enum value of the .proto files
under protos/ (the ones `make protos` compiles), each with the text of its comment.

protoc parses the files (grpc_tools, with source info) and the page reads the comments from the
FileDescriptorSet it writes, so no regular expression reads a .proto. Knows nothing of the servers.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
    FileDescriptorSet,
    ServiceDescriptorProto,
    SourceCodeInfo,
)

from .markdown import code, page, paragraphs, table, text

ROOT = Path(__file__).resolve().parents[2]
INTRO = (
    "The services and messages of the gRPC protocols `attnserve serve` speaks, from the .proto files "
    "under `protos/` and their comments: attnserve's own (`attnserve.v1`), the Open Inference Protocol "
    "(`inference`) and gRPC health checking (`grpc.health.v1`). Proto3: a field left unset reads as its "
    "zero value unless it is `optional`."
)
FIRST = ("attnserve.v1", "inference")  # the packages whose sections come first, in this order; then the others
# Field numbers of descriptor.proto, the steps of a SourceCodeInfo location's path.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE, FILE_SYNTAX = 4, 5, 6, 12
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM = 2, 3, 4
ENUM_VALUE, SERVICE_METHOD = 2, 2

Path_ = tuple[int, ...]
Comments = dict[Path_, str]


def render() -> str:
    files = sorted(
        descriptor_set().file, key=lambda f: (FIRST.index(f.package) if f.package in FIRST else len(FIRST), f.name)
    )
    return page("gRPC API", INTRO, [proto_file(f) for f in files])


def descriptor_set() -> FileDescriptorSet:
    """Every .proto under protos/, parsed by protoc with its comments (source info) kept."""
    import grpc_tools
    from grpc_tools import protoc

    generator = load_protos_generator()
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "protos.pb"
        args = ["grpc_tools.protoc", f"-I{generator.PROTO_ROOT}", f"-I{include}", "--include_source_info"]
        protos = generator.proto_files()
        if protoc.main([*args, f"--descriptor_set_out={out}", *protos]) != 0:
            raise RuntimeError(f"protoc failed on {protos}")
        return FileDescriptorSet.FromString(out.read_bytes())


def load_protos_generator():
    """protos/generate.py, which names the .proto files `make protos` compiles."""
    spec = importlib.util.spec_from_file_location("protos_generate", ROOT / "protos" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proto_file(f: FileDescriptorProto) -> str:
    """One file's section: its comment, then its services, messages and enums in the file's order."""
    comments = {tuple(loc.path): comment(loc) for loc in f.source_code_info.location}
    lines = {tuple(loc.path): loc.span[0] for loc in f.source_code_info.location}
    blocks = [f"## {f.package}", f"From {code('protos/' + f.name)}.", paragraphs(comments.get((FILE_SYNTAX,), ""))]
    blocks += [block for path, block in sorted(declarations(f, comments), key=lambda item: lines[item[0]])]
    return "\n\n".join(b for b in blocks if b)


def declarations(f: FileDescriptorProto, comments: Comments) -> list[tuple[Path_, str]]:
    """(source path, section) of every service, message and enum of `f`, nested ones included."""
    messages = {f".{f.package}.{name}": m for name, m, _ in walk_messages(f.message_type, (FILE_MESSAGE,))}
    found: list[tuple[Path_, str]] = [
        ((FILE_SERVICE, i), service(s, f.package, comments, (FILE_SERVICE, i))) for i, s in enumerate(f.service)
    ]
    for name, m, path in walk_messages(f.message_type, (FILE_MESSAGE,)):
        if not m.options.map_entry:  # a map field's entry type: the field's type says map<K, V>
            found.append((path, message(name, m, f.package, messages, comments, path)))
        nested = enums(m.enum_type, (*path, MESSAGE_ENUM))
        found += [(p, enum(f"{name}.{e.name}", e, f.package, comments, p)) for e, p in nested]
    return found + [(p, enum(e.name, e, f.package, comments, p)) for e, p in enums(f.enum_type, (FILE_ENUM,))]


def walk_messages(
    messages: Sequence[DescriptorProto], path: Path_, prefix: str = ""
) -> Iterator[tuple[str, DescriptorProto, Path_]]:
    """Every message, nested ones included, as (Outer.Inner name, message, source path)."""
    for i, m in enumerate(messages):
        name, here = f"{prefix}{m.name}", (*path, i)
        yield name, m, here
        yield from walk_messages(m.nested_type, (*here, MESSAGE_NESTED), f"{name}.")


def enums(found: Sequence[EnumDescriptorProto], path: Path_) -> Iterator[tuple[EnumDescriptorProto, Path_]]:
    for i, e in enumerate(found):
        yield e, (*path, i)


def service(s: ServiceDescriptorProto, package: str, comments: Comments, path: Path_) -> str:
    rows = [
        [
            code(m.name),
            code(("stream " if m.client_streaming else "") + local(m.input_type, package)),
            code(("stream " if m.server_streaming else "") + local(m.output_type, package)),
            text(comments.get((*path, SERVICE_METHOD, i), "")),
        ]
        for i, m in enumerate(s.method)
    ]
    return section(
        f"service {s.name}",
        f"{package}.{s.name}",
        comments.get(path, ""),
        ["rpc", "request", "response", "description"],
        rows,
    )


def message(
    name: str, m: DescriptorProto, package: str, messages: dict[str, DescriptorProto], comments: Comments, path: Path_
) -> str:
    rows = [
        [
            code(fd.name),
            code(field_type(fd, package, messages)),
            str(fd.number),
            field_text(fd, m, comments, (*path, MESSAGE_FIELD, i)),
        ]
        for i, fd in enumerate(m.field)
    ]
    return section(
        f"message {name}", f"{package}.{name}", comments.get(path, ""), ["field", "type", "number", "description"], rows
    )


def enum(name: str, e: EnumDescriptorProto, package: str, comments: Comments, path: Path_) -> str:
    rows = [
        [code(v.name), str(v.number), text(comments.get((*path, ENUM_VALUE, i), ""))] for i, v in enumerate(e.value)
    ]
    return section(
        f"enum {name}", f"{package}.{name}", comments.get(path, ""), ["value", "number", "description"], rows
    )


def section(heading: str, full_name: str, about: str, header: list[str], rows: list[list[str]]) -> str:
    """A heading, the declaration's comment, then its table (none for a message without fields)."""
    blocks = [f"### {heading}", f"Full name {code(full_name)}.", paragraphs(about)]
    blocks.append(table(header, rows) if rows else "No fields.")
    return "\n\n".join(b for b in blocks if b)


def field_type(fd: FieldDescriptorProto, package: str, messages: dict[str, DescriptorProto]) -> str:
    """The type as the .proto writes it: `repeated int32`, `optional float`, `map<int32, float>`."""
    entry = messages.get(fd.type_name)
    if entry is not None and entry.options.map_entry:
        key, value = entry.field
        return f"map<{field_type(key, package, messages)}, {field_type(value, package, messages)}>"
    name = local(fd.type_name, package) if fd.type_name else FieldDescriptorProto.Type.Name(fd.type)[5:].lower()
    if fd.label == FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {name}"
    return f"optional {name}" if fd.proto3_optional else name


def field_text(fd: FieldDescriptorProto, m: DescriptorProto, comments: Comments, path: Path_) -> str:
    """A field's comment; for a member of a oneof, which oneof first."""
    about = text(comments.get(path, ""))
    if fd.HasField("oneof_index") and not fd.proto3_optional:
        return f"One of {code(m.oneof_decl[fd.oneof_index].name)}. {about}"
    return about


def local(type_name: str, package: str) -> str:
    """`.attnserve.v1.Usage` -> `Usage` within attnserve.v1; a type of another package keeps its full name."""
    return type_name.removeprefix(f".{package}.").lstrip(".")


def comment(location: SourceCodeInfo.Location) -> str:
    """A declaration's leading and trailing comments, with the space after each `//` removed."""
    parts = [location.leading_comments, location.trailing_comments]
    return "\n\n".join("\n".join(line.strip() for line in p.strip("\n").splitlines()) for p in parts if p.strip())
