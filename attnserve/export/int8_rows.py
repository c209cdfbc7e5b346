"""int8 that does not depend on the batch: every MatMul by a weight rewritten to int8 weights (one
scale per output column) times int8 activations quantized row by row, one scale per token.

ONNX Runtime's dynamic quantization (quantize_dynamic) scales a MatMul's activations per tensor: one
scale over every row of the batch, so a request's logits, and its tokens, depend on what else is in
its batch and on how its prompt was chunked. Here each row (one token's activation vector) gets its
own scale from its own largest value, and the integer product is exact, so a row's result is the same
alone, in any batch and in any chunk, bit for bit:

    peak = ReduceMax(|x|, last axis) + tiny                   (..., 1)
    q    = QuantizeLinear(x / peak, 1/127, 128)               uint8: 128 + round(127 x / peak)
    y    = MatMulIntegerToFloat(q, W8, 1, w_scale / 127, 128) * peak

The activations are uint8 around a zero point of 128 (symmetric: 127 levels either side of zero), the
weights int8 and symmetric, so the product runs on MLAS's u8s8 kernels, the ones dynamic quantization
runs (VNNI where the CPU has it); MatMulIntegerToFloat applies the zero point and each column's scale
as it writes the float result. One quantization serves every MatMul that reads the same activation.

The weights take 7 bits (-63 to 63, WEIGHT_MAX), as ONNX Runtime's reduce_range does: on an x86-64 CPU
without VNNI (AVX2 alone: AMD's Zen 3, older Xeons) MLAS's u8s8 kernel adds two products of a uint8 and
an int8 into 16 bits with saturation (vpmaddubsw), and 2 * 255 * 127 is past 32,767; 2 * 255 * 63 is not.
With 8-bit weights a row's product on such a CPU was off by up to 22% of its largest value
(tests/test_invariance.py), and the trained tiny model's int8 export failed its gate there.
"""

from __future__ import annotations

import numpy as np

INT8_MAX = 127  # the activations' levels either side of zero
WEIGHT_MAX = 63  # the weights': 7 bits, so that no pair of u8 x s8 products saturates 16 bits (above)
ZERO_POINT = 128  # the activations' uint8 zero point: 128 + [-127, 127]
TINY = 1e-30  # added to each row's peak: an all-zero row quantizes to zeros instead of dividing by zero
MS_DOMAIN = "com.microsoft"  # MatMulIntegerToFloat's: a contrib op of every ONNX Runtime build


def quantized_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float weight -> (int8 (K, N) in [-WEIGHT_MAX, WEIGHT_MAX], float32 (N,) scales): symmetric, one
    scale per column."""
    peak = np.abs(weight).max(axis=0)
    scale = np.where(peak > 0, peak / WEIGHT_MAX, 1.0).astype(np.float32)
    return np.clip(np.rint(weight / scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8), scale


def quantize_rows(model) -> int:
    """Every MatMul of `model` (an onnx ModelProto) by a 2-D float32 weight becomes the row-quantized
    int8 product, in place; the number rewritten. The float weights it replaced are dropped."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    added = [
        numpy_helper.from_array(np.array([-1], np.int64), "rows.axis"),
        numpy_helper.from_array(np.array(1 / INT8_MAX, np.float32), "rows.step"),
        numpy_helper.from_array(np.array(TINY, np.float32), "rows.tiny"),
        numpy_helper.from_array(np.array(1, np.float32), "rows.one"),
        numpy_helper.from_array(np.array(ZERO_POINT, np.uint8), "rows.zero_point"),
    ]
    quantized: dict[str, str] = {}  # activation -> the prefix of its uint8 rows and their peaks
    int8_weights: set[str] = set()
    nodes, rewritten = [], 0
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT:
            nodes.append(node)
            continue
        if node.input[0] not in quantized:
            quantized[node.input[0]] = prefix = f"rows.{len(quantized)}"
            nodes += row_quantizer(helper, node.input[0], prefix)
        prefix, w8 = quantized[node.input[0]], f"{weight.name}.int8"
        if w8 not in int8_weights:
            values, scale = quantized_weight(numpy_helper.to_array(weight))
            added += [numpy_helper.from_array(values, w8), numpy_helper.from_array(scale / INT8_MAX, f"{w8}.scale")]
            int8_weights.add(w8)
        product = f"{node.output[0]}.unscaled"
        inputs = [f"{prefix}.q", w8, "rows.one", f"{w8}.scale", "rows.zero_point"]
        nodes += [
            helper.make_node("MatMulIntegerToFloat", inputs, [product], domain=MS_DOMAIN),
            helper.make_node("Mul", [product, f"{prefix}.peak"], [node.output[0]]),
        ]
        rewritten += 1
    read = {name for node in nodes for name in node.input}
    kept = [t for t in [*graph.initializer, *added] if t.name in read]
    del graph.node[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.initializer.extend(kept)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return rewritten


def row_quantizer(helper, x: str, prefix: str) -> list:
    """The nodes that quantize activation `x` row by row: `{prefix}.q` (uint8) and `{prefix}.peak`."""
    return [
        helper.make_node("Abs", [x], [f"{prefix}.abs"]),
        helper.make_node("ReduceMax", [f"{prefix}.abs", "rows.axis"], [f"{prefix}.max"], keepdims=1),
        helper.make_node("Add", [f"{prefix}.max", "rows.tiny"], [f"{prefix}.peak"]),
        helper.make_node("Div", [x, f"{prefix}.peak"], [f"{prefix}.unit"]),
        helper.make_node("QuantizeLinear", [f"{prefix}.unit", "rows.step", "rows.zero_point"], [f"{prefix}.q"]),
    ]
