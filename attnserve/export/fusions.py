"""Export-time graph fusions: what ONNX Runtime's own optimizer does not do to our graphs, kept only
where the graph gets faster (issue 22, "the graph's own speed").

Packed QKV: each GroupQueryAttention whose query, key and value are three projections of one
input (MatMul by a weight, then Add of a bias, or the MatMul alone where none has a bias) gets them
from one MatMul by the three weights side by side (and one Add of the three biases), and takes them
packed (its key and value inputs empty),
as onnxruntime-genai's model builder writes it. Four fewer nodes a layer, and a faster decode step,
most at batch 1; the weights stay bit for bit what they were, and the parity gate runs on the fused
graph. SkipLayerNormalization for every residual Add and LayerNormalization was measured slower at
batch 16 and not kept (docs/design/decisions/graph-fusions.md).

Packed siblings: MatMuls by a weight that read one activation (a Llama MLP's gate and up
projections) become one MatMul by their weights side by side and a Split, so that the quantized
graphs read one larger matrix (one MatMulNBits, or one int8 product) instead of two.
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

    def projection(name: str) -> Projection | None:
        """(MatMul, Add) when `name` is MatMul(x, W) + b with W and b weights, used only there;
        (MatMul, None) when it is MatMul(x, W) alone (projections without a bias: the Llama family)."""
        node = producer.get(name)
        if node is not None and node.op_type == "MatMul" and node.input[1] in weights and users.get(name) == 1:
            return node, None
        if node is None or node.op_type != "Add" or node.input[1] not in weights or users.get(name) != 1:
            return None
        matmul = producer.get(node.input[0])
        if matmul is None or matmul.op_type != "MatMul" or matmul.input[1] not in weights:
            return None
        return (matmul, node) if users.get(matmul.output[0]) == 1 else None

    packed = 0
    dropped: set[int] = set()  # ids of the projections' nodes
    inserted: dict[int, list[onnx.NodeProto]] = {}  # id of an attention node -> the nodes that go before it
    for node in graph.node:
        if node.op_type != GQA or len(node.input) < 3 or not all(node.input[:3]):
            continue
        parts = [projection(name) for name in node.input[:3]]
        fused = packed_projection(f"{node.name or node.output[0]}/qkv", parts, weights)
        if fused is None:
            continue
        nodes, tensors = fused
        inserted[id(node)] = nodes
        graph.initializer.extend(tensors)
        dropped.update(id(each) for part in parts if part for each in part if each is not None)
        node.input[0], node.input[1], node.input[2] = nodes[-1].output[0], "", ""
        packed += 1
    if not packed:
        return 0
    nodes = [each for node in graph.node for each in [*inserted.get(id(node), []), node] if id(each) not in dropped]
    save_rewritten(model, nodes, path)
    return packed


def save_rewritten(model: onnx.ModelProto, nodes: list[onnx.NodeProto], path: Path) -> None:
    """`model` with `nodes` as its graph's nodes and only the weights they read, saved at `path`."""
    graph = model.graph
    graph.ClearField("node")
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    onnx.save(model, str(path))


def pack_siblings(path: Path) -> int:
    """Every set of MatMuls by a 2-D weight that read the same activation (a Llama MLP's gate and up
    projections) becomes one MatMul by their weights side by side and a Split back into their outputs,
    in the graph at `path` (rewritten in place); the number of sets packed. Their biases, if any, stay
    where they are, on the Split's outputs."""
    model = onnx.load(str(path))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    siblings: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is not None and len(weight.dims) == 2:
            siblings.setdefault(node.input[0], []).append(node)
    inserted: dict[int, list[onnx.NodeProto]] = {}  # id of a set's first MatMul -> what replaces the set
    dropped: set[int] = set()
    for activation, matmuls in siblings.items():
        if len(matmuls) < 2 or len({weights[m.input[1]].dims[0] for m in matmuls}) != 1:
            continue
        stem = f"{matmuls[0].name or matmuls[0].output[0]}/packed"
        weight = side_by_side([weights[m.input[1]] for m in matmuls], f"{stem}.weight", axis=1)
        if weight is None:
            continue
        sizes = helper.make_tensor(
            f"{stem}.sizes",
            TensorProto.INT64,
            [len(matmuls)],
            [w.dims[1] for w in (weights[m.input[1]] for m in matmuls)],
        )
        graph.initializer.extend([weight, sizes])
        inserted[id(matmuls[0])] = [
            helper.make_node("MatMul", [activation, weight.name], [stem], name=stem),
            helper.make_node(
                "Split", [stem, sizes.name], [m.output[0] for m in matmuls], name=f"{stem}.split", axis=-1
            ),
        ]
        dropped.update(id(m) for m in matmuls)
    if not inserted:
        return 0
    nodes = [each for node in graph.node for each in inserted.get(id(node), [node] if id(node) not in dropped else [])]
    save_rewritten(model, nodes, path)
    return len(inserted)


Projection = tuple[onnx.NodeProto, onnx.NodeProto | None]  # (MatMul, its bias Add or None)


def packed_projection(
    stem: str, parts: list[Projection | None], weights: dict[str, TensorProto]
) -> tuple[list[onnx.NodeProto], list[TensorProto]] | None:
    """The nodes (MatMul, and Add where the three have biases) and weights computing three projections
    of one input as one, named from `stem`; None unless all three are projections of the same input,
    all with a bias or all without, of a type side_by_side joins."""
    found = [part for part in parts if part is not None]
    if len(found) != 3 or len({matmul.input[0] for matmul, _ in found}) != 1:
        return None
    adds = [add for _, add in found if add is not None]
    if len(adds) not in (0, 3):
        return None
    weight = side_by_side([weights[matmul.input[1]] for matmul, _ in found], f"{stem}.weight", axis=1)
    if weight is None:
        return None
    if not adds:
        return [helper.make_node("MatMul", [found[0][0].input[0], weight.name], [stem])], [weight]
    bias = side_by_side([weights[add.input[1]] for add in adds], f"{stem}.bias", axis=0)
    if bias is None:
        return None
    projected = f"{stem}.projected"
    matmul = helper.make_node("MatMul", [found[0][0].input[0], weight.name], [projected])
    return [matmul, helper.make_node("Add", [projected, bias.name], [stem])], [weight, bias]


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
