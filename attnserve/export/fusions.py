"""Export-time graph fusions: what ONNX Runtime's own optimizer does not do to our graphs, kept only
where the graph gets faster (issue 22, "the graph's own speed").

Packed QKV: each GroupQueryAttention whose query, key and value are three projections of one
input (MatMul by a weight, then Add of a bias) gets them from one MatMul by the three weights side
by side and one Add of the three biases, and takes them packed (its key and value inputs empty),
as onnxruntime-genai's model builder writes it. Four fewer nodes a layer, and a faster decode step,
most at batch 1; the weights stay bit for bit what they were, and the parity gate runs on the fused
graph. SkipLayerNormalization for every residual Add and LayerNormalization was measured slower at
batch 16 and not kept (docs/design/decisions/graph-fusions.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

GQA = "GroupQueryAttention"
RAW_DTYPES: dict[int, type] = {  # element type -> a numpy type of its size (bfloat16 travels as its raw 16 bits)
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.BFLOAT16: np.uint16,
}


def pack_qkv(path: Path) -> int:
    """Pack the query, key and value projections of every GroupQueryAttention in the graph at `path`
    that has three of them over one input (rewritten in place); the number packed."""
    model = onnx.load(str(path))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1

    def projection(name: str) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
        """(MatMul, Add) when `name` is MatMul(x, W) + b with W and b weights, used only there."""
        add = producer.get(name)
        if add is None or add.op_type != "Add" or add.input[1] not in weights or users.get(name) != 1:
            return None
        matmul = producer.get(add.input[0])
        if matmul is None or matmul.op_type != "MatMul" or matmul.input[1] not in weights:
            return None
        return (matmul, add) if users.get(matmul.output[0]) == 1 else None

    packed = 0
    dropped: set[int] = set()  # ids of the projections' nodes
    inserted: dict[int, list[onnx.NodeProto]] = {}  # id of an attention node -> the nodes that go before it
    for node in graph.node:
        if node.op_type != GQA or len(node.input) < 3 or not all(node.input[:3]):
            continue
        found = [projection(name) for name in node.input[:3]]
        parts = [part for part in found if part is not None]
        if len(parts) != 3 or len({matmul.input[0] for matmul, _ in parts}) != 1:
            continue
        stem = f"{node.name or node.output[0]}/qkv"
        weight = side_by_side([weights[matmul.input[1]] for matmul, _ in parts], f"{stem}.weight", axis=1)
        bias = side_by_side([weights[add.input[1]] for _, add in parts], f"{stem}.bias", axis=0)
        if weight is None or bias is None:
            continue
        graph.initializer.extend([weight, bias])
        inserted[id(node)] = [
            helper.make_node("MatMul", [parts[0][0].input[0], weight.name], [f"{stem}.projected"]),
            helper.make_node("Add", [f"{stem}.projected", bias.name], [stem]),
        ]
        dropped.update(id(each) for part in parts for each in part)
        node.input[0], node.input[1], node.input[2] = stem, "", ""
        packed += 1
    if not packed:
        return 0
    nodes = [each for node in graph.node for each in [*inserted.get(id(node), []), node] if id(each) not in dropped]
    graph.ClearField("node")
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    onnx.save(model, str(path))
    return packed


def side_by_side(tensors: list[TensorProto], name: str, axis: int) -> TensorProto | None:
    """The tensors joined along `axis`, in their own element type; None for a type not handled here."""
    kind = tensors[0].data_type
    if kind not in RAW_DTYPES or any(tensor.data_type != kind for tensor in tensors):
        return None
    arrays = [raw(tensor) for tensor in tensors]
    joined = np.ascontiguousarray(np.concatenate(arrays, axis=axis))
    return helper.make_tensor(name, kind, joined.shape, joined.tobytes(), raw=True)


def raw(tensor: TensorProto) -> np.ndarray:
    """A weight's values as a numpy array of its element size, read from its raw bytes."""
    dtype = RAW_DTYPES[tensor.data_type]
    values: np.ndarray
    if tensor.raw_data:
        values = np.frombuffer(tensor.raw_data, dtype=dtype)
    elif tensor.data_type == TensorProto.FLOAT:
        values = np.array(tensor.float_data, dtype=np.float32)
    else:  # float16 and bfloat16 kept in int32_data, one value each
        values = np.array(tensor.int32_data, dtype=np.uint16).view(dtype)
    return values.reshape(tuple(tensor.dims))
