"""The batched logits pass as an ONNX graph: built here with onnx, checked into the package as
runtime/logits_pass.<dtype>.onnx (a serving host has ONNX Runtime, not onnx), run by
runtime/logits_pass.py on the model's own provider, fed the decode step's logits where they are.

One run over the rows that ask for it: each row's bias (sparse; a banned id's is -inf), its
temperature, then its min-p, top-k and top-p over the row's HEAD most likely ids (TopK, fixed
in the graph: no host-side k), then greedy or one draw by inverse CDF over the kept ids in
id order with the row's own uniform number. What comes back is
small: each row's token, its log-probability under the processed distribution (after the bias
and the temperature; before min-p, top-k and top-p, as vLLM's processed logprobs), the TOP most
likely ids with theirs, and whether the head held every id the filters kept (`exact`; a row
that is not is picked again on the host by the same steps over the whole row, the engine's
sampling.pick_row). The same steps in numpy, in float64, are sampling.pick_row: the oracle the
tests hold this graph to. `python -m attnserve.export.logits_pass_graph` writes the files.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEAD = 256  # the most likely ids a row's filters and draw look at; a row that keeps more is picked on the host
TOP = 20  # top log-probabilities a row may ask for (the request table's logprobs bound)
ROW_ALIGN = 16  # float32 columns: 64 bytes, a cache line and an AVX-512 register
OPSET = 18
DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
HERE = Path(__file__).resolve().parent.parent / "runtime"


def graph_path(dtype: str) -> Path:
    return HERE / f"logits_pass.{dtype}.onnx"


class Builder:
    """Nodes appended in order, each output named after its step."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.constants.append(numpy_helper.from_array(value, name))
        return name

    def op(self, kind: str, inputs: list[str], output: str | list[str], **attrs: Any) -> str:
        outputs = [output] if isinstance(output, str) else output
        self.nodes.append(helper.make_node(kind, inputs, outputs, name=outputs[0], **attrs))
        return outputs[0]


def aligned_log(b: Builder, column: str, out: str) -> None:
    """Log of a (R, 1) column, each row's value computed in a full vector of ROW_ALIGN copies: ONNX
    Runtime's Log takes a scalar path for a tensor's last elements, whose results differ in the last
    bit, so that a lone row's would differ from the same row's in a batch."""
    b.op("Tile", [column, "align_repeats"], f"{out}_tiled")
    b.op("Log", [f"{out}_tiled"], f"{out}_wide")
    b.op("Slice", [f"{out}_wide", "zero_1d", "axis1", "axis1"], out)


def build(dtype: str) -> onnx.ModelProto:
    """The pass for logits of `dtype`, any vocabulary size (K = min(V padded, HEAD), N = min(V, TOP))."""
    b = Builder()
    i64 = lambda name, *v: b.const(name, np.array(v, np.int64))
    f32 = lambda name, v: b.const(name, np.array(v, np.float32))
    scalar = lambda name, v: b.const(name, np.array(v, np.int64))
    i64("axis1", 1)  # 1-D: axes, shapes, slices
    i64("minus1", -1)
    i64("zero_1d", 0)
    i64("end", np.iinfo(np.int64).max)
    i64("head_cap", HEAD)
    i64("top_cap", TOP)
    i64("row_align", ROW_ALIGN)
    i64("align_repeats", 1, ROW_ALIGN)
    scalar("past_ids", np.iinfo(np.int64).max)  # after every id, in an id sort
    scalar("axis1_s", 1)  # 0-D: CumSum's axis, Clip's bounds, indices
    scalar("zero_i", 0)
    scalar("one_i", 1)
    f32("zero_f", 0.0)
    f32("one_f", 1.0)
    f32("minus_inf", -np.inf)

    # the rows asked for, float32, (R, V); bias added (duplicates add; a banned id's -inf)
    b.op("Gather", ["logits", "rows"], "gathered", axis=0)
    b.op("Shape", ["logits"], "logits_shape")
    b.op("Slice", ["logits_shape", "minus1", "end"], "vocab")  # [V]
    b.op("Squeeze", ["gathered", "axis1"], "raw")
    b.op("Cast", ["raw"], "raw32", to=TensorProto.FLOAT)
    b.op("ScatterElements", ["raw32", "bias_ids", "bias_values"], "unpadded", axis=1, reduction="add")
    # -inf columns up to a multiple of ROW_ALIGN: every row starts aligned, so a row's sums (vectorized from
    # its first aligned element) add in the same order whichever rows share its batch
    b.op("Sub", ["row_align", "vocab"], "short")
    b.op("Mod", ["short", "row_align"], "pad_width")
    b.op("Concat", ["zero_1d", "zero_1d", "zero_1d", "pad_width"], "pads", axis=0)
    b.op("Pad", ["unpadded", "pads", "minus_inf"], "biased", mode="constant")

    # temperature (greedy rows: 1), the processed distribution's log-normalizer
    b.op("Greater", ["temperature", "zero_f"], "sampling")
    b.op("Where", ["sampling", "temperature", "one_f"], "divisor")
    b.op("Unsqueeze", ["divisor", "axis1"], "divisor_col")
    b.op("Div", ["biased", "divisor_col"], "scaled")
    b.op("ReduceMax", ["scaled", "axis1"], "row_max", keepdims=1)
    b.op("Sub", ["scaled", "row_max"], "shifted")  # <= 0, the largest 0
    b.op("Exp", ["shifted"], "weights")
    b.op("ReduceSum", ["weights", "axis1"], "mass", keepdims=1)
    aligned_log(b, "mass", "log_mass")  # log-probability = shifted - log_mass

    # the head: K most likely, descending, lower id first on ties (K a multiple of ROW_ALIGN: the pad's
    # -inf columns come last and are never kept)
    b.op("Shape", ["biased"], "padded_shape")
    b.op("Slice", ["padded_shape", "minus1", "end"], "padded_vocab")
    b.op("Min", ["padded_vocab", "head_cap"], "k")
    b.op("TopK", ["shifted", "k"], ["head", "head_ids"], axis=1, largest=1, sorted=1)
    b.op("Squeeze", ["k"], "k_s")
    b.op("Sub", ["k_s", "one_i"], "k_last")

    # the keep threshold: min-p's (log(min_p) below the best; log 0 = -inf) and top-k's (the k-th value, ties kept)
    b.op("Unsqueeze", ["min_p", "axis1"], "min_p_col")
    aligned_log(b, "min_p_col", "min_p_edge")
    b.op("Sub", ["top_k", "one_i"], "kth_rank")
    b.op("Clip", ["kth_rank", "zero_i", "k_last"], "kth_clipped")
    b.op("Unsqueeze", ["kth_clipped", "axis1"], "kth_col")
    b.op("GatherElements", ["head", "kth_col"], "kth_value", axis=1)
    b.op("Greater", ["top_k", "zero_i"], "top_k_on")
    b.op("Unsqueeze", ["top_k_on", "axis1"], "top_k_on_col")
    b.op("Where", ["top_k_on_col", "kth_value", "minus_inf"], "top_k_edge")
    b.op("Max", ["min_p_edge", "top_k_edge"], "edge")  # (R, 1)

    # top-p over what min-p and top-k keep (its mass over the whole row): keep while the mass before is < p
    b.op("GreaterOrEqual", ["shifted", "edge"], "row_kept")
    b.op("Cast", ["row_kept"], "row_kept_f", to=TensorProto.FLOAT)
    b.op("Mul", ["weights", "row_kept_f"], "row_kept_weights")
    b.op("ReduceSum", ["row_kept_weights", "axis1"], "kept_mass", keepdims=1)
    b.op("GreaterOrEqual", ["head", "edge"], "head_above")
    b.op("Greater", ["head", "minus_inf"], "head_finite")  # a banned id is never kept
    b.op("And", ["head_above", "head_finite"], "head_kept")
    b.op("Exp", ["head"], "head_weights")
    b.op("Cast", ["head_kept"], "head_kept_f", to=TensorProto.FLOAT)
    b.op("Mul", ["head_weights", "head_kept_f"], "head_kept_weights")
    b.op("CumSum", ["head_kept_weights", "axis1_s"], "head_cum")
    b.op("Sub", ["head_cum", "head_kept_weights"], "mass_before")
    b.op("Unsqueeze", ["top_p", "axis1"], "top_p_col")
    b.op("Mul", ["top_p_col", "kept_mass"], "p_mass")
    b.op("Less", ["mass_before", "p_mass"], "under_p")
    b.op("GreaterOrEqual", ["top_p_col", "one_f"], "top_p_off")
    b.op("Or", ["under_p", "top_p_off"], "p_kept")
    b.op("And", ["head_kept", "p_kept"], "kept")

    # exact: the head's last id was not kept (every kept id is in the head), or the head is the row
    b.op("Gather", ["kept", "k_last"], "last_kept_row", axis=1)
    b.op("Not", ["last_kept_row"], "head_holds")
    b.op("Equal", ["k", "padded_vocab"], "whole_row")
    b.op("Not", ["sampling"], "greedy")
    b.op("Or", ["head_holds", "whole_row"], "held")
    b.op("Or", ["held", "greedy"], "exact")

    # the draw: the kept ids in id order (the others after them), then the first whose cumulative weight
    # passes uniform * total (numpy's searchsorted, right); greedy takes the head's first
    b.op("Where", ["kept", "head_ids", "past_ids"], "kept_ids_first")
    b.op("TopK", ["kept_ids_first", "k"], ["by_id", "by_id_rank"], axis=1, largest=0, sorted=1)
    b.op("Cast", ["kept"], "kept_f", to=TensorProto.FLOAT)
    b.op("Mul", ["head_weights", "kept_f"], "head_draw_weights")
    b.op("GatherElements", ["head_draw_weights", "by_id_rank"], "draw_weights", axis=1)
    b.op("CumSum", ["draw_weights", "axis1_s"], "draw_cum")
    b.op("ReduceMax", ["draw_cum", "axis1"], "draw_total", keepdims=1)
    b.op("Unsqueeze", ["uniform", "axis1"], "uniform_col")
    b.op("Mul", ["uniform_col", "draw_total"], "target")
    b.op("LessOrEqual", ["draw_cum", "target"], "passed")
    b.op("Cast", ["passed"], "passed_i", to=TensorProto.INT64)
    b.op("ReduceSum", ["passed_i", "axis1"], "drawn", keepdims=0)
    b.op("Cast", ["kept"], "kept_i", to=TensorProto.INT64)
    b.op("ReduceSum", ["kept_i", "axis1"], "kept_count", keepdims=0)
    b.op("Sub", ["kept_count", "one_i"], "last_kept")
    b.op("Min", ["drawn", "last_kept"], "drawn_clipped")
    b.op("Unsqueeze", ["drawn_clipped", "axis1"], "drawn_col")
    b.op("GatherElements", ["by_id_rank", "drawn_col"], "drawn_head_col", axis=1)  # its place in the head
    b.op("Squeeze", ["drawn_head_col", "axis1"], "drawn_head")
    b.op("Where", ["sampling", "drawn_head", "zero_i"], "rank")
    b.op("Unsqueeze", ["rank", "axis1"], "rank_col")
    b.op("GatherElements", ["head_ids", "rank_col"], "token_col", axis=1)
    b.op("Squeeze", ["token_col", "axis1"], "token")
    b.op("GatherElements", ["head", "rank_col"], "token_shifted", axis=1)
    b.op("Sub", ["token_shifted", "log_mass"], "logprob_col")
    b.op("Squeeze", ["logprob_col", "axis1"], "logprob")

    # the top ids and their log-probabilities
    b.op("Min", ["vocab", "top_cap"], "n")
    b.op("Slice", ["head_ids", "zero_1d", "n", "axis1"], "top_ids")
    b.op("Slice", ["head", "zero_1d", "n", "axis1"], "top_shifted")
    b.op("Sub", ["top_shifted", "log_mass"], "top_logprobs")

    rows = lambda name, kind: helper.make_tensor_value_info(name, kind, ["R"])
    table = lambda name, kind, width: helper.make_tensor_value_info(name, kind, ["R", width])
    inputs = [
        helper.make_tensor_value_info("logits", DTYPES[dtype], ["slots", 1, "V"]),  # a decode step's
        rows("rows", TensorProto.INT64),
        rows("temperature", TensorProto.FLOAT),  # 0: greedy
        rows("top_k", TensorProto.INT64),  # 0: off
        rows("top_p", TensorProto.FLOAT),  # 1: off
        rows("min_p", TensorProto.FLOAT),  # 0: off
        rows("uniform", TensorProto.FLOAT),  # the row's draw in [0, 1)
        table("bias_ids", TensorProto.INT64, "M"),
        table("bias_values", TensorProto.FLOAT, "M"),
    ]
    outputs = [
        rows("token", TensorProto.INT64),
        rows("logprob", TensorProto.FLOAT),
        table("top_ids", TensorProto.INT64, "N"),
        table("top_logprobs", TensorProto.FLOAT, "N"),
        rows("exact", TensorProto.BOOL),
    ]
    graph = helper.make_graph(b.nodes, f"attnserve_logits_pass_{dtype}", inputs, outputs, b.constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="attnserve")
    model.ir_version = 8  # ONNX Runtime 1.20's oldest
    onnx.checker.check_model(model)
    return model


def serialized(dtype: str) -> bytes:
    return build(dtype).SerializeToString(deterministic=True)


def main() -> int:
    for dtype in DTYPES:
        graph_path(dtype).write_bytes(serialized(dtype))
        print(graph_path(dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
