"""What an ONNX graph holds beyond its declared I/O, read from its protobuf without onnx (no serving
dependency) and without reading a weight: the rows of the positional table that position_ids index (a
manifest's context cannot exceed them) and the files its initializers' external data name (they must stay
inside the model directory and be checksummed). model_sessions.py checks a manifest against them.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import contract

INDEX_OPS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Cast", "Identity", "Expand", "Add"})
TABLE_OPS = frozenset({"Cast", "Identity", "DequantizeLinear"})  # a table passes through them, its shape kept
MAX_HOPS = 32


@dataclass(frozen=True)
class GraphFacts:
    positions: int | None  # rows of the smallest table that position_ids index (None: none, e.g. rotary)
    external: tuple[str, ...]  # the files its initializers' external data name, relative to the graph


@dataclass
class Node:
    op: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    ints: dict[str, int] = field(default_factory=dict)  # integer attributes (axis, batch_dims)
    value: list[int] | None = None  # a Constant's dims


def varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of one protobuf message: an int for a varint, a view of its bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
            yield key >> 3, value
            continue
        if wire == 2:
            size, pos = varint(buf, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos}")
        if pos + size > len(buf):
            raise ValueError("truncated protobuf")
        yield key >> 3, buf[pos : pos + size]
        pos += size


def text(value: int | memoryview) -> str:
    return bytes(value).decode("utf-8", "replace") if isinstance(value, memoryview) else ""


def varints(value: int | memoryview) -> list[int]:
    """A repeated int64 field's values (signed): one varint, or a packed run of them."""
    if isinstance(value, int):
        return [value - (1 << 64) if value >= 1 << 63 else value]
    values, pos = [], 0
    while pos < len(value):
        one, pos = varint(value, pos)
        values += varints(one)
    return values


def tensor_of(buf: memoryview) -> tuple[str, list[int], list[str]]:
    """A TensorProto's name, dims and external data location (fields 8, 1 and 13), never its data."""
    name, dims, location = "", [], []
    for number, value in fields(buf):
        if number == 1:
            dims += varints(value)
        elif number == 8:
            name = text(value)
        elif number == 13 and isinstance(value, memoryview):
            entry = dict(fields(value))  # StringStringEntryProto: key 1, value 2
            if text(entry.get(1, 0)) == "location":
                location.append(text(entry.get(2, 0)))
    return name, dims, location


def node_of(buf: memoryview) -> Node:
    """A NodeProto's op, inputs, outputs (fields 4, 1, 2) and integer or tensor attributes (field 5)."""
    node = Node()
    for number, value in fields(buf):
        if number in (1, 2):
            (node.inputs if number == 1 else node.outputs).append(text(value))
        elif number == 4:
            node.op = text(value)
        elif number == 5 and isinstance(value, memoryview):
            attribute = dict(fields(value))  # AttributeProto: name 1, i 3, t 5
            i, t = attribute.get(3), attribute.get(5)
            if isinstance(i, int):
                node.ints[text(attribute.get(1, 0))] = varints(i)[0]
            if isinstance(t, memoryview):
                node.value = tensor_of(t)[1]
    return node


def read_graph(path: Path) -> GraphFacts:
    """The positional table and external data of the ONNX graph at `path`, from its protobuf
    (ModelProto.graph, field 7: nodes 1, initializers 5), without onnx and without reading a weight."""
    with open(path, "rb") as f:
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    nodes: list[Node] = []
    tables: dict[str, list[int]] = {}
    external: list[str] = []
    for number, graph in fields(data):
        for kind, value in fields(graph) if number == 7 and isinstance(graph, memoryview) else ():
            if kind == 1 and isinstance(value, memoryview):
                nodes.append(node_of(value))
            elif kind == 5 and isinstance(value, memoryview):
                name, tables[name], location = tensor_of(value)
                external += location
    tables.update({node.outputs[0]: node.value for node in nodes if node.value is not None and node.outputs})
    return GraphFacts(positional_rows(nodes, tables), tuple(dict.fromkeys(external)))


def positional_rows(nodes: list[Node], tables: dict[str, list[int]]) -> int | None:
    """The fewest rows of a table (learned, sinusoid, rotary cache) that a Gather indexes by position_ids."""
    producer = {out: node for node in nodes for out in node.outputs}

    def source(name: str, ops: frozenset[str]) -> str:
        for _ in range(MAX_HOPS):
            node = producer.get(name)
            if node is None or node.op not in ops or not node.inputs:
                break
            name = node.inputs[0]
        return name

    rows = []
    for node in nodes:
        if node.op not in ("Gather", "GatherND") or len(node.inputs) < 2 or node.ints.get("batch_dims", 0):
            continue
        if source(node.inputs[1], INDEX_OPS) != contract.POSITION_IDS:
            continue
        dims = tables.get(source(node.inputs[0], TABLE_OPS), [])
        axis = node.ints.get("axis", 0) if node.op == "Gather" else 0
        if -len(dims) <= axis < len(dims):
            rows.append(dims[axis])
    return min(rows, default=None)
