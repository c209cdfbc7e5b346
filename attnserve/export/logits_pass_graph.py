"""The batched logits pass as ONNX graphs: built here with onnx, checked into the package as
runtime/logits_pass.<width>.<dtype>.onnx (a serving host has ONNX Runtime, not onnx), run by
runtime/logits_pass.py on the model's own provider, fed the decode step's logits where they are.

One run over the rows that ask for it: each row's penalties (repetition at its seen ids, presence
and frequency at its completion's, sparse), its bias (sparse; a banned id's is -inf), its
temperature and its log-softmax over the whole row; then, without sorting the row, the candidates:
the ids of the groups of ROW_ALIGN ids with the largest maxima (every id above the last such group's
maximum, the floor, is one); the head, the candidates' most likely ids (TopK: the sizes are fixed in
the graph, no host-side k); min-p, top-k and top-p over the head; then greedy or one draw by inverse
CDF over the kept ids in id order with the row's own uniform number. What comes back is small: each
row's token, its log-probability under the processed distribution (after the penalties, the bias
and the temperature; before min-p, top-k and top-p, as vLLM's processed logprobs), the TOP most
likely ids with theirs, and whether all of that is the whole row's (`exact`: every id it kept or
reported is above the floor, and the head held every id the filters kept).

The widths (WIDTHS): the narrow graph looks at 64 groups, the wide one at 256; a row the narrow
pass cannot pick exactly goes through the wide one (unless the narrow one proves that futile:
`widen`); a sampling row with no top-k that neither can pick (its min-p or top-p keep more ids than
they look at: a flat distribution) goes through the nucleus graph, which finds top-p's edge over the
whole row by buckets of value (nucleus); one that none can is picked again on the host by the same
steps over the whole row (the engine's sampling.pick_row). A vocabulary of at most 256 groups goes
through the row graph instead of the narrow and wide ones, whose candidates are the whole row. A row
that samples with no top-k, top-p or min-p goes through the whole graph, which draws over every id in
two levels (groups, then ids; whole_draw, which the nucleus graph's draw is too). The same steps in
numpy, in float64, are sampling.pick_row: the oracle the tests hold these graphs to (the whole and
nucleus graphs' draws to within their float32 weights). A row under a grammar's mask goes through the
mask graph first (build_mask), whose output the others then read as their logits.
`python -m attnserve.export.logits_pass_graph` writes the files.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOP = 20  # top log-probabilities a row may ask for (the request table's logprobs bound)
BUCKETS = 8192  # the nucleus pass's buckets of value (nucleus)
CROSSING = 64  # the most ids the nucleus pass sorts: those of the bucket where top-p's mass crosses
DEEPEST = 64.0  # the nucleus pass's buckets reach this far below a row's best log-weight (e^-64: nothing)
QUANTUM_BITS = 34  # the nucleus pass sums weights (at most 1) in whole 2^-34s: exact in float64 to 2^19 ids
ROW_ALIGN = 16  # float32 columns: 64 bytes, a cache line and an AVX-512 register; also a group's ids
OPSET = 18
DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
HERE = Path(__file__).resolve().parent.parent / "runtime"
MASK = "mask"  # the graph that masks a grammar's rows before the passes (build_mask)


@dataclass(frozen=True)
class Width:
    """How much of a row a pass looks at: the ids of its `groups` groups of ROW_ALIGN ids with the largest
    maxima (the candidates; no groups: the whole row), of which it keeps the `head` most likely; a `whole`
    pass draws over every id (its head only reports the top ids)."""

    name: str
    groups: int
    head: int
    whole: bool = False
    nucleus: bool = False


# a row that filters (top-k, top-p, min-p) or is greedy first goes through the narrow pass, and one it
# cannot pick exactly through the wide one; a row that draws from its whole distribution, the whole pass.
# A vocabulary of at most `wide`'s groups goes through `row` instead: its head over the whole row, no groups.
# A sampling row none of those picks, through `nucleus` (its head only reports the top ids)
WIDTHS = (
    Width("narrow", 64, 128),
    Width("wide", 256, 256),
    Width("whole", 64, 128, whole=True),
    Width("row", 0, 256),
    Width("nucleus", 64, 128, whole=True, nucleus=True),
)


def graph_path(dtype: str, width: str = "narrow") -> Path:
    return HERE / f"logits_pass.{width}.{dtype}.onnx"


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


def at(b: Builder, table: str, index: str, out: str) -> None:
    """`out` (R,): each row's element of `table` (R, K) at its `index` (R,)."""
    b.op("Unsqueeze", [index, "axis1"], f"{out}_index")
    b.op("GatherElements", [table, f"{out}_index"], f"{out}_col", axis=1)
    b.op("Squeeze", [f"{out}_col", "axis1"], out)


def ordered_top(b: Builder, values: str, k: str, out_values: str, out_places: str) -> None:
    """`out_values` and `out_places` (R, K): TopK of `values` (R, W) at `k`, descending and, of equal values,
    the lower place first. ONNX's TopK promises that order and the CPU provider keeps it; CUDA's does not
    (an H200 gave tied log-probabilities higher id first), so tie_order puts the K it gives in that order
    again. Which ids of a tie at the K-th value are among the K stays the provider's: the callers count a
    tie there as unknown, or need more than K - N ids tied with the N-th."""
    b.op("TopK", [values, k], [f"{out_values}_any", f"{out_places}_any"], axis=1, largest=1, sorted=1)
    tie_order(b, f"{out_values}_any", f"{out_places}_any", k, out_values, out_places)


def tie_order(b: Builder, values: str, places: str, k: str, out_values: str, out_places: str) -> None:
    """`values` (R, K), descending, and their `places`, with each run of equal values sorted by place:
    each run is a group (numbered from 0 down the values), and a TopK over group * 2^32 + place, keys that
    never tie, sorts them."""
    b.op("Slice", [values, "axis1", "end", "axis1"], f"{out_values}_next")  # [:, 1:]
    b.op("Slice", [values, "zero_1d", "minus1", "axis1"], f"{out_values}_prev")  # [:, :-1]
    b.op("Equal", [f"{out_values}_next", f"{out_values}_prev"], f"{out_values}_same")
    b.op("Not", [f"{out_values}_same"], f"{out_values}_new")
    b.op("Cast", [f"{out_values}_new"], f"{out_values}_starts", to=TensorProto.INT64)
    b.op("Slice", [places, "zero_1d", "axis1", "axis1"], f"{out_places}_first")
    b.op("Sub", [f"{out_places}_first", f"{out_places}_first"], f"{out_values}_group0")  # (R, 1) zeros
    b.op("Concat", [f"{out_values}_group0", f"{out_values}_starts"], f"{out_values}_steps", axis=1)
    b.op("CumSum", [f"{out_values}_steps", "axis1_s"], f"{out_values}_group")
    b.op("Mul", [f"{out_values}_group", "group_stride"], f"{out_values}_group_key")
    b.op("Add", [f"{out_values}_group_key", places], f"{out_values}_key")
    b.op("TopK", [f"{out_values}_key", k], [f"{out_values}_key_sorted", f"{out_values}_order"], axis=1, largest=0)
    b.op("GatherElements", [values, f"{out_values}_order"], out_values, axis=1)
    b.op("GatherElements", [places, f"{out_values}_order"], out_places, axis=1)


def count(b: Builder, mask: str, out: str) -> None:
    """`out` (R,): how many of each row's `mask` (R, K) are true."""
    b.op("Cast", [mask], f"{mask}_i", to=TensorProto.INT64)
    b.op("ReduceSum", [f"{mask}_i", "axis1"], out, keepdims=0)


def constants(b: Builder, width: Width) -> None:
    i64 = lambda name, *v: b.const(name, np.array(v, np.int64))
    scalar = lambda name, v: b.const(name, np.array(v, np.int64))
    f32 = lambda name, v: b.const(name, np.array(v, np.float32))
    i64("axis1", 1)  # 1-D: axes, shapes, slices
    i64("axis2", 2)
    i64("minus1", -1)
    i64("zero_1d", 0)
    i64("end", np.iinfo(np.int64).max)
    i64("groups_cap", width.groups)
    i64("head_cap", width.head)
    i64("top_cap", TOP)
    i64("row_align", ROW_ALIGN)
    i64("align_repeats", 1, ROW_ALIGN)
    i64("group_shape", 0, -1, ROW_ALIGN)  # (R, G, ROW_ALIGN)
    i64("row_shape", 0, -1)
    b.const("group_offsets", np.arange(ROW_ALIGN, dtype=np.int64))
    scalar("past_ids", np.iinfo(np.int64).max)  # after every id, in an id sort
    scalar("axis1_s", 1)  # 0-D: CumSum's axis, Clip's bounds, indices
    scalar("zero_i", 0)
    scalar("one_i", 1)
    scalar("align_i", ROW_ALIGN)
    scalar("group_stride", 2**32)  # ordered_top's keys: a group's places (< 2^32) apart from the next's
    f32("zero_f", 0.0)
    f32("one_f", 1.0)
    f32("minus_inf", -np.inf)


def penalties(b: Builder, raw: str) -> None:
    """`penalized` (R, V): the rows with CTRL's repetition penalty at their `seen` ids (a positive logit
    divided by it, a negative one multiplied; an id twice writes the same value twice, so the padding
    repeats one), then OpenAI's at their `occurred` ids (frequency times the count, and presence once;
    a count of 0, the padding's, subtracts nothing)."""
    b.op("GatherElements", [raw, "seen_ids"], "seen_logits", axis=1)
    b.op("Unsqueeze", ["repetition", "axis1"], "repetition_col")
    b.op("Div", ["seen_logits", "repetition_col"], "seen_divided")
    b.op("Mul", ["seen_logits", "repetition_col"], "seen_multiplied")
    b.op("Greater", ["seen_logits", "zero_f"], "seen_positive")
    b.op("Where", ["seen_positive", "seen_divided", "seen_multiplied"], "seen_penalized")
    b.op("ScatterElements", [raw, "seen_ids", "seen_penalized"], "repeated", axis=1)
    b.op("Unsqueeze", ["frequency", "axis1"], "frequency_col")
    b.op("Unsqueeze", ["presence", "axis1"], "presence_col")
    b.op("Mul", ["occurred_counts", "frequency_col"], "by_count")
    b.op("Greater", ["occurred_counts", "zero_f"], "occurred_once")
    b.op("Where", ["occurred_once", "presence_col", "zero_f"], "by_presence")
    b.op("Add", ["by_count", "by_presence"], "occurrence_penalty")
    b.op("Neg", ["occurrence_penalty"], "occurrence_delta")
    b.op("ScatterElements", ["repeated", "occurred_ids", "occurrence_delta"], "penalized", axis=1, reduction="add")


def processed(b: Builder, dtype: str) -> None:
    """`logprobs` (R, V padded): each asked row's processed distribution, as log-probabilities: the row
    (float32), its penalties applied (penalties), its bias added (duplicates add; a banned id's -inf),
    -inf columns up to a multiple of ROW_ALIGN (every row starts aligned, so a row's sums, vectorized
    from its first aligned element, add in the same order whichever rows share its batch; and it splits
    into groups), over its temperature (greedy rows: 1), log-softmaxed."""
    b.op("Gather", ["logits", "rows"], "gathered", axis=0)
    b.op("Shape", ["logits"], "logits_shape")
    b.op("Slice", ["logits_shape", "minus1", "end"], "vocab")  # [V]
    b.op("Squeeze", ["gathered", "axis1"], "raw")
    if dtype != "float32":
        b.op("Cast", ["raw"], "raw32", to=TensorProto.FLOAT)
    raw = "raw32" if dtype != "float32" else "raw"
    penalties(b, raw)
    b.op("ScatterElements", ["penalized", "bias_ids", "bias_values"], "unpadded", axis=1, reduction="add")
    b.op("Sub", ["row_align", "vocab"], "short")
    b.op("Mod", ["short", "row_align"], "pad_width")
    b.op("Concat", ["zero_1d", "zero_1d", "zero_1d", "pad_width"], "pads", axis=0)
    b.op("Pad", ["unpadded", "pads", "minus_inf"], "biased", mode="constant")
    b.op("Greater", ["temperature", "zero_f"], "sampling")
    b.op("Where", ["sampling", "temperature", "one_f"], "divisor")
    b.op("Unsqueeze", ["divisor", "axis1"], "divisor_col")
    b.op("Div", ["biased", "divisor_col"], "scaled")
    log_softmax(b, "scaled", "logprobs")


def log_softmax(b: Builder, x: str, out: str) -> None:
    """`out`: the log-softmax of `x` (R, V padded to groups of ROW_ALIGN) over its last axis, its sum of exps
    added in float64. ONNX Runtime's float32 LogSoftmax adds a row's exps in float32 lanes (8 of them on a CPU
    with AVX2 alone), and over 20,011 ids its log-probabilities were off by up to 1.05e-5 there (the float64
    oracle's, at a row's likeliest ids); each group's ROW_ALIGN exps added in float32 and the groups' sums in
    float64, they are off by a few float32 ulps (the float64 copy a sixteenth of the row)."""
    b.op("ReduceMax", [x, "axis1"], f"{out}_best", keepdims=1)
    b.op("Sub", [x, f"{out}_best"], f"{out}_shifted")
    b.op("Exp", [f"{out}_shifted"], f"{out}_exps")
    b.op("Reshape", [f"{out}_exps", "group_shape"], f"{out}_group_exps")  # (R, G, ROW_ALIGN)
    b.op("ReduceSum", [f"{out}_group_exps", "axis2"], f"{out}_group_sums", keepdims=0)  # (R, G)
    b.op("Cast", [f"{out}_group_sums"], f"{out}_group_sums64", to=TensorProto.DOUBLE)
    b.op("ReduceSum", [f"{out}_group_sums64", "axis1"], f"{out}_total64", keepdims=1)
    b.op("Cast", [f"{out}_total64"], f"{out}_total", to=TensorProto.FLOAT)
    aligned_log(b, f"{out}_total", f"{out}_log_total")
    b.op("Sub", [f"{out}_shifted", f"{out}_log_total"], out)


def candidates(b: Builder, width: Width) -> None:
    """The ids of the KG groups (ROW_ALIGN ids each) with the largest maxima, KG = min(G, width's groups),
    in id order (`candidates`, their ids `candidate_ids`), and `floor`: the KG-th group's maximum where a
    group was left out (-inf where none was). Every id above the floor is a candidate (the group that
    holds it has a larger maximum). A width of no groups takes the whole row, with no floor."""
    if not width.groups:
        b.op("Identity", ["logprobs"], "candidates")
        b.op("Shape", ["rows"], "row_count")
        b.op("Expand", ["minus_inf", "row_count"], "floor")
        return
    b.op("Reshape", ["logprobs", "group_shape"], "groups")
    b.op("ReduceMax", ["groups", "axis2"], "group_max", keepdims=0)  # (R, G)
    b.op("Shape", ["group_max"], "group_max_shape")
    b.op("Slice", ["group_max_shape", "minus1", "end"], "group_count")
    b.op("Min", ["group_count", "groups_cap"], "kg")
    b.op("TopK", ["group_max", "kg"], ["best_groups", "best_group_ids"], axis=1, largest=1, sorted=1)
    b.op("TopK", ["best_group_ids", "kg"], ["candidate_groups", "candidate_group_order"], axis=1, largest=0, sorted=1)
    b.op("Unsqueeze", ["candidate_groups", "axis2"], "candidate_index")  # (R, KG, 1)
    b.op("GatherND", ["groups", "candidate_index"], "candidate_rows", batch_dims=1)  # (R, KG, ROW_ALIGN)
    b.op("Reshape", ["candidate_rows", "row_shape"], "candidates")
    b.op("Mul", ["candidate_index", "align_i"], "candidate_firsts")
    b.op("Add", ["candidate_firsts", "group_offsets"], "candidate_id_rows")
    b.op("Reshape", ["candidate_id_rows", "row_shape"], "candidate_ids")
    b.op("Squeeze", ["kg"], "kg_s")
    b.op("Sub", ["kg_s", "one_i"], "kg_last")
    b.op("Gather", ["best_groups", "kg_last"], "last_group_max", axis=1)  # (R,)
    b.op("Less", ["kg", "group_count"], "groups_left_out")
    b.op("Where", ["groups_left_out", "last_group_max", "minus_inf"], "floor")


def head(b: Builder, whole_row: bool) -> None:
    """The head: the K most likely candidates (K = min(candidates, width's head)), descending, lower id
    first on ties: `head_logprobs`, `head_ids`, and `head`, their log-weights below the row's best (<= 0;
    the pad's -inf columns come last and are never kept). `whole_row`: the candidates are the row."""
    b.op("Shape", ["candidates"], "candidates_shape")
    b.op("Slice", ["candidates_shape", "minus1", "end"], "candidate_count")
    b.op("Min", ["candidate_count", "head_cap"], "k")
    ordered_top(b, "candidates", "k", "head_logprobs", "head_places")
    if whole_row:  # the candidates are the row: a place is an id
        b.op("Identity", ["head_places"], "head_ids")
    else:
        b.op("GatherElements", ["candidate_ids", "head_places"], "head_ids", axis=1)
    b.op("Slice", ["head_logprobs", "zero_1d", "axis1", "axis1"], "row_max")  # (R, 1)
    b.op("Sub", ["head_logprobs", "row_max"], "head")
    b.op("Squeeze", ["k"], "k_s")
    b.op("Sub", ["k_s", "one_i"], "k_last")


def filters(b: Builder) -> None:
    """`kept` (R, K): what min-p (log(min_p) below the best; log 0 = -inf), top-k (the k-th value, ties
    kept) and then top-p keep of the head. Top-p keeps while the mass before an id is below p times the
    mass min-p and top-k keep over the whole row: with neither, the row's; else the candidates' (exact
    where their edge is above the floor)."""
    b.op("Unsqueeze", ["min_p", "axis1"], "min_p_col")
    aligned_log(b, "min_p_col", "min_p_edge")
    b.op("Sub", ["top_k", "one_i"], "kth_rank")
    b.op("Clip", ["kth_rank", "zero_i", "k_last"], "kth_clipped")
    at(b, "head", "kth_clipped", "kth_value")
    b.op("Greater", ["top_k", "zero_i"], "top_k_on")
    b.op("Where", ["top_k_on", "kth_value", "minus_inf"], "top_k_edge")
    b.op("Unsqueeze", ["top_k_edge", "axis1"], "top_k_edge_col")
    b.op("Max", ["min_p_edge", "top_k_edge_col"], "edge")  # (R, 1), below the best
    b.op("Neg", ["row_max"], "log_mass")  # the row's mass in weights below its best: exp(-best log-probability)
    b.op("Exp", ["log_mass"], "mass")
    b.op("Sub", ["candidates", "row_max"], "candidates_shifted")
    b.op("GreaterOrEqual", ["candidates_shifted", "edge"], "candidates_kept")
    b.op("Exp", ["candidates_shifted"], "candidate_weights")
    b.op("Where", ["candidates_kept", "candidate_weights", "zero_f"], "candidate_kept_weights")
    b.op("ReduceSum", ["candidate_kept_weights", "axis1"], "candidate_kept_mass", keepdims=1)
    b.op("Equal", ["edge", "minus_inf"], "no_edge")
    b.op("Where", ["no_edge", "mass", "candidate_kept_mass"], "kept_mass")
    b.op("GreaterOrEqual", ["head", "edge"], "head_above")
    b.op("Greater", ["head", "minus_inf"], "head_finite")  # a banned id is never kept
    b.op("And", ["head_above", "head_finite"], "head_kept")
    b.op("Exp", ["head"], "head_weights")
    b.op("Where", ["head_kept", "head_weights", "zero_f"], "head_kept_weights")
    b.op("CumSum", ["head_kept_weights", "axis1_s"], "head_cum")
    b.op("Sub", ["head_cum", "head_kept_weights"], "mass_before")
    b.op("Unsqueeze", ["top_p", "axis1"], "top_p_col")
    b.op("Mul", ["top_p_col", "kept_mass"], "p_mass")
    b.op("Less", ["mass_before", "p_mass"], "under_p")
    b.op("GreaterOrEqual", ["top_p_col", "one_f"], "top_p_off")
    b.op("Or", ["under_p", "top_p_off"], "p_kept")
    b.op("And", ["head_kept", "p_kept"], "kept")
    count(b, "kept", "kept_count")
    b.op("Sub", ["kept_count", "one_i"], "last_kept")


def top_ids(b: Builder, floored: bool) -> None:
    """`top_ids` and `top_logprobs` (R, N): the head's first N; `top_exact` (R,): they are the row's as far
    as the row asks (each of its `top` above the floor, or it asks none; with no floor, always)."""
    b.op("Min", ["vocab", "top_cap"], "n")
    b.op("Slice", ["head_ids", "zero_1d", "n", "axis1"], "top_ids")
    b.op("Slice", ["head_logprobs", "zero_1d", "n", "axis1"], "top_logprobs")
    if not floored:
        b.op("Equal", ["top", "top"], "top_exact")
        return
    b.op("Sub", ["top", "one_i"], "top_last")
    b.op("Clip", ["top_last", "zero_i", "k_last"], "top_last_clipped")
    at(b, "head_logprobs", "top_last_clipped", "top_last_value")
    b.op("Greater", ["top_last_value", "floor"], "top_above_floor")
    b.op("LessOrEqual", ["top", "zero_i"], "no_top")
    b.op("Or", ["top_above_floor", "no_top"], "top_exact")


def exactness(b: Builder, floored: bool) -> None:
    """`head_exact` (R,): the row's pick is the one over the whole row. Its top ids are the row's
    (top_exact); and a sampling row's kept ids are above the floor, the head's last is not kept (or the
    head is the row), top-p's mass is known (top-p off, no edge, or the edge above the floor) and top-k's
    edge is in the head. With no floor (the candidates are the row), only the head's and top-k's count."""
    b.op("Shape", ["biased"], "padded_shape")
    b.op("Slice", ["padded_shape", "minus1", "end"], "padded_vocab")
    b.op("Equal", ["k", "padded_vocab"], "whole_row")
    b.op("Less", ["kept_count", "k"], "head_holds")
    b.op("Or", ["head_holds", "whole_row"], "held")
    b.op("Greater", ["top_k", "k"], "top_k_past_head")
    b.op("Less", ["top_k", "vocab"], "top_k_short")
    b.op("And", ["top_k_past_head", "top_k_short"], "top_k_unknown")
    b.op("Not", ["top_k_unknown"], "top_k_known")
    b.op("Not", ["sampling"], "greedy")
    if not floored:
        b.op("And", ["held", "top_k_known"], "draw_exact")
        b.op("Or", ["draw_exact", "greedy"], "head_exact")
        return
    at(b, "head_logprobs", "last_kept", "last_kept_value")
    b.op("Greater", ["last_kept_value", "floor"], "kept_above_floor")
    b.op("Squeeze", ["edge", "axis1"], "edge_row")
    b.op("Squeeze", ["row_max", "axis1"], "row_max_row")
    b.op("Add", ["edge_row", "row_max_row"], "edge_logprob")
    b.op("Greater", ["edge_logprob", "floor"], "edge_above_floor")
    b.op("Squeeze", ["top_p_off", "axis1"], "top_p_off_row")
    b.op("Squeeze", ["no_edge", "axis1"], "no_edge_row")
    b.op("Or", ["edge_above_floor", "no_edge_row"], "edge_known")
    b.op("Or", ["edge_known", "top_p_off_row"], "p_known")
    b.op("And", ["held", "kept_above_floor"], "kept_exact")
    b.op("And", ["kept_exact", "p_known"], "kept_known")
    b.op("And", ["kept_known", "top_k_known"], "draw_exact")
    b.op("Or", ["draw_exact", "greedy"], "pick_exact")
    b.op("And", ["pick_exact", "top_exact"], "head_exact")


def widening(b: Builder, wider: int) -> None:
    """`widen` (R,): a row not picked exactly that a pass with a head of `wider` ids might pick. Not where
    top-k asks past that head, nor where top-p's prefix provably outgrows it: the head kept whole, and
    its weights (each at least the floor's, as an id left out might be) and `wider - K` more at its
    last's still short of p times the mass min-p and top-k keep (when that mass is known)."""
    b.const("wider", np.array(wider, np.int64))
    b.op("Greater", ["top_k", "wider"], "top_k_past_wider")
    b.op("And", ["top_k_past_wider", "top_k_short"], "top_k_past")
    b.op("Sub", ["floor", "row_max_row"], "floor_shifted")
    b.op("Unsqueeze", ["floor_shifted", "axis1"], "floor_col")
    b.op("Max", ["head", "floor_col"], "head_at_least")
    b.op("Exp", ["head_at_least"], "head_bound_weights")
    b.op("ReduceSum", ["head_bound_weights", "axis1"], "head_bound", keepdims=0)
    b.op("Gather", ["head_bound_weights", "k_last"], "last_bound_weight", axis=1)
    b.op("Sub", ["wider", "k_s"], "more")
    b.op("Cast", ["more"], "more_f", to=TensorProto.FLOAT)
    b.op("Mul", ["last_bound_weight", "more_f"], "more_bound")
    b.op("Add", ["head_bound", "more_bound"], "wider_bound")
    b.op("Squeeze", ["p_mass", "axis1"], "p_mass_row")
    b.op("Less", ["wider_bound", "p_mass_row"], "outgrows")
    b.op("Not", ["head_holds"], "head_kept_whole")
    b.op("Not", ["top_p_off_row"], "top_p_on_row")
    b.op("And", ["head_kept_whole", "top_p_on_row"], "p_crosses_later")
    b.op("And", ["p_crosses_later", "edge_known"], "p_judged")
    b.op("And", ["p_judged", "outgrows"], "top_p_past")
    b.op("Or", ["top_k_past", "top_p_past"], "past_wider")
    b.op("And", ["past_wider", "sampling"], "hopeless")
    b.op("Or", ["head_exact", "hopeless"], "settled")
    b.op("Not", ["settled"], "widen")


def draw(b: Builder) -> None:
    """`token` and its `logprob`: greedy takes the head's first; a draw, of the kept ids in id order (the
    others after them), the first whose cumulative weight passes uniform * total (numpy's searchsorted,
    right)."""
    b.op("Where", ["kept", "head_ids", "past_ids"], "kept_ids_first")
    b.op("TopK", ["kept_ids_first", "k"], ["by_id", "by_id_rank"], axis=1, largest=0, sorted=1)
    b.op("Where", ["kept", "head_weights", "zero_f"], "head_draw_weights")
    b.op("GatherElements", ["head_draw_weights", "by_id_rank"], "draw_weights", axis=1)
    b.op("CumSum", ["draw_weights", "axis1_s"], "draw_cum")
    b.op("ReduceMax", ["draw_cum", "axis1"], "draw_total", keepdims=1)
    b.op("Unsqueeze", ["uniform", "axis1"], "uniform_col")
    b.op("Mul", ["uniform_col", "draw_total"], "target")
    b.op("LessOrEqual", ["draw_cum", "target"], "passed")
    count(b, "passed", "drawn")
    b.op("Min", ["drawn", "last_kept"], "drawn_clipped")
    at(b, "by_id_rank", "drawn_clipped", "drawn_head")  # its place in the head
    b.op("Where", ["sampling", "drawn_head", "zero_i"], "rank")
    at(b, "head_ids", "rank", "head_token")
    at(b, "head_logprobs", "rank", "head_logprob")


def nucleus(b: Builder) -> None:
    """`nucleus_weights` (R, V padded): the weights (below the row's best) of the ids min-p and top-p keep
    of the whole row, found without sorting it, and `nucleus_exact` (R,): they are host_draw.kept's.
    Min-p keeps the ids at least min_p times as likely as the best, and no id is kept more than DEEPEST
    below it (e^-64 of the best: a weight float32's exp makes a denormal, and no draw could reach it).
    Top-p, as host_draw.top_p_edge: the kept ids' weights add up into buckets by value (BUCKETS, or
    one an id for fewer ids; of equal widths from the lowest kept value to the best), the buckets' sums
    find the bucket where the mass crosses p times the total, and only that bucket's ids are sorted (its
    CROSSING likeliest; a row whose crossing is past them is not exact). Its last taken id's value is
    the last kept; of the ids tied at it, the lower ones as many as were taken. The sums are of weights
    rounded to multiples of 2^-QUANTUM_BITS in float64: exact, so that they come out the same in any
    order (CUDA's scatter adds atomically, in no set order). Top-k is not applied: a row that asks for
    it is not exact here (the narrow and wide passes hold top-k)."""
    b.const("buckets_cap", np.array([BUCKETS], np.int64))
    b.const("deepest", np.array(-DEEPEST, np.float32))
    b.const("lowest_float", np.array(np.finfo(np.float32).min, np.float32))
    b.const("minus_one_f", np.array(-1.0, np.float32))
    b.const("quantum", np.array(2.0**QUANTUM_BITS, np.float64))
    b.const("crossing_cap", np.array([CROSSING], np.int64))
    b.op("Sub", ["logprobs", "row_max"], "row_shifted")  # (R, V padded), the best at 0
    # as many buckets as ids, up to BUCKETS (a small vocabulary's would be mostly empty): B, the last B - 1
    # (and a bucket's width in value: 1 / (B - 1) of the range), the trash for ids in none B
    b.op("Shape", ["row_shifted"], "values_shape")
    b.op("Slice", ["values_shape", "minus1", "end"], "values_width")
    b.op("Min", ["values_width", "buckets_cap"], "real_buckets")  # [B]
    b.op("Add", ["real_buckets", "axis1"], "mass_columns")  # [B + 1]: axis1 is [1]
    b.op("Squeeze", ["real_buckets"], "bucket_count")
    b.op("Sub", ["bucket_count", "one_i"], "bucket_last")
    b.op("Cast", ["bucket_last"], "bucket_scale", to=TensorProto.FLOAT)
    b.op("Cast", ["bucket_count"], "trash", to=TensorProto.FLOAT)
    # the candidates: min-p's, never a banned id or a pad (-inf), nor one DEEPEST below the best
    b.op("Unsqueeze", ["min_p", "axis1"], "min_p_col")
    aligned_log(b, "min_p_col", "min_p_edge")
    b.op("Max", ["min_p_edge", "deepest"], "candidate_edge")
    b.op("GreaterOrEqual", ["row_shifted", "candidate_edge"], "candidate")
    b.op("Where", ["candidate", "row_shifted", "minus_inf"], "values")
    b.op("Exp", ["values"], "weights")  # 0 where not a candidate
    b.op("Cast", ["weights"], "weights_d", to=TensorProto.DOUBLE)
    b.op("Mul", ["weights_d", "quantum"], "weights_scaled")
    b.op("Floor", ["weights_scaled"], "weights_q")  # whole quanta
    # the buckets: equal widths of value from the lowest candidate (at most DEEPEST down) to the best
    b.op("Where", ["candidate", "row_shifted", "zero_f"], "candidate_values")
    b.op("ReduceMin", ["candidate_values", "axis1"], "low", keepdims=1)  # (R, 1)
    b.op("Less", ["low", "zero_f"], "spread")
    b.op("Div", ["bucket_scale", "low"], "per_value")
    b.op("Where", ["spread", "per_value", "minus_one_f"], "scale")  # negative: the best value in bucket 0
    b.op("Mul", ["values", "scale"], "bucket_f")  # a non-candidate's +inf
    b.op("Floor", ["bucket_f"], "bucket_floor")
    b.op("Min", ["bucket_floor", "trash"], "bucket_or_trash")  # BUCKETS: not a candidate
    b.op("Cast", ["bucket_or_trash"], "bucket", to=TensorProto.INT64)
    b.op("Shape", ["rows"], "row_count_1d")
    b.op("Concat", ["row_count_1d", "mass_columns"], "mass_shape", axis=0)
    zero = helper.make_tensor("", TensorProto.DOUBLE, [1], [0.0])
    b.op("ConstantOfShape", ["mass_shape"], "no_mass", value=zero)
    b.op("ScatterElements", ["no_mass", "bucket", "weights_q"], "bucket_mass_all", axis=1, reduction="add")
    b.op("Slice", ["bucket_mass_all", "zero_1d", "real_buckets", "axis1"], "bucket_mass")
    b.op("CumSum", ["bucket_mass", "axis1_s"], "bucket_cum")
    b.op("Sub", ["bucket_cum", "bucket_mass"], "bucket_before")  # the mass of the buckets above each
    b.op("ReduceSum", ["bucket_mass", "axis1"], "nucleus_total", keepdims=1)
    b.op("Unsqueeze", ["top_p", "axis1"], "top_p_col")
    b.op("Cast", ["top_p_col"], "top_p_d", to=TensorProto.DOUBLE)
    b.op("Mul", ["top_p_d", "nucleus_total"], "nucleus_target")  # (R, 1)
    b.op("Less", ["bucket_before", "nucleus_target"], "bucket_under")
    count(b, "bucket_under", "buckets_under")
    b.op("Sub", ["buckets_under", "one_i"], "crossing_unclipped")
    b.op("Clip", ["crossing_unclipped", "zero_i", "bucket_last"], "crossing")  # (R,)
    at(b, "bucket_before", "crossing", "crossing_before")
    # the crossing bucket's likeliest ids, sorted: how many the mass takes, and the last one's value
    b.op("Cast", ["crossing"], "crossing_f", to=TensorProto.FLOAT)
    b.op("Unsqueeze", ["crossing_f", "axis1"], "crossing_col")
    b.op("Equal", ["bucket_or_trash", "crossing_col"], "in_crossing")
    b.op("Where", ["in_crossing", "values", "minus_inf"], "crossing_values")
    b.op("Min", ["values_width", "crossing_cap"], "crossing_k")
    ordered_top(b, "crossing_values", "crossing_k", "inside", "inside_places")
    b.op("GatherElements", ["weights_q", "inside_places"], "inside_weights", axis=1)  # the quanta summed
    b.op("CumSum", ["inside_weights", "axis1_s"], "inside_cum")
    b.op("Sub", ["inside_cum", "inside_weights"], "inside_before")
    b.op("Unsqueeze", ["crossing_before", "axis1"], "crossing_before_wide")
    b.op("Add", ["inside_before", "crossing_before_wide"], "mass_before_inside")
    b.op("Less", ["mass_before_inside", "nucleus_target"], "inside_under")
    b.op("Greater", ["inside", "minus_inf"], "inside_member")
    b.op("And", ["inside_under", "inside_member"], "inside_taken")
    count(b, "inside_taken", "taken")
    b.op("Squeeze", ["crossing_k"], "crossing_k_s")
    b.op("Sub", ["crossing_k_s", "one_i"], "inside_last")
    b.op("Sub", ["taken", "one_i"], "taken_last_unclipped")
    b.op("Clip", ["taken_last_unclipped", "zero_i", "inside_last"], "taken_last")
    at(b, "inside", "taken_last", "last_value")
    # kept: every candidate at least at the last value (top-p off: every candidate), less the ids tied at
    # it that were not taken (the higher ones: ordered_top puts the lower id first among ties)
    b.op("GreaterOrEqual", ["top_p", "one_f"], "top_p_off")
    b.op("Where", ["top_p_off", "lowest_float", "last_value"], "threshold")
    b.op("Unsqueeze", ["threshold", "axis1"], "threshold_col")
    b.op("GreaterOrEqual", ["values", "threshold_col"], "at_least_last")
    b.op("Where", ["at_least_last", "weights", "zero_f"], "weights_at_least")
    b.op("Unsqueeze", ["last_value", "axis1"], "last_col")
    b.op("Equal", ["inside", "last_col"], "inside_at_last")
    b.op("Not", ["inside_taken"], "inside_left")
    b.op("And", ["inside_at_last", "inside_left"], "tie_left")
    b.op("Not", ["top_p_off"], "top_p_on")
    b.op("Unsqueeze", ["top_p_on", "axis1"], "top_p_on_col")
    b.op("And", ["tie_left", "top_p_on_col"], "tie_dropped")
    b.op("Slice", ["inside_places", "zero_1d", "axis1", "axis1"], "first_place")  # kept whenever one is
    b.op("Where", ["tie_dropped", "inside_places", "first_place"], "drop_places")
    b.op("GatherElements", ["weights_at_least", "first_place"], "first_weight", axis=1)
    b.op("Where", ["tie_dropped", "zero_f", "first_weight"], "drop_weights")
    b.op("ScatterElements", ["weights_at_least", "drop_places", "drop_weights"], "nucleus_weights", axis=1)
    # exact: a sampling row with no top-k, and top-p off or its crossing among the sorted ids (not at
    # the last of CROSSING of them, and no tie at the last left out of them)
    b.op("Greater", ["taken", "zero_i"], "some_taken")
    b.op("Less", ["taken", "crossing_k_s"], "crossing_inside")
    b.op("Less", ["crossing_k_s", "crossing_cap"], "all_sorted_1d")
    b.op("Squeeze", ["all_sorted_1d"], "all_sorted")
    b.op("Or", ["crossing_inside", "all_sorted"], "crossing_known")
    b.op("Gather", ["inside", "inside_last"], "inside_last_value", axis=1)
    b.op("Equal", ["inside_last_value", "last_value"], "tie_at_end")
    b.op("And", ["tie_at_end", "crossing_inside"], "ties_past_end_maybe")
    b.op("Not", ["all_sorted"], "some_unsorted")
    b.op("And", ["ties_past_end_maybe", "some_unsorted"], "ties_past_end")
    b.op("Not", ["ties_past_end"], "ties_known")
    b.op("And", ["some_taken", "crossing_known"], "p_taken")
    b.op("And", ["p_taken", "ties_known"], "p_exact")
    b.op("Or", ["p_exact", "top_p_off"], "p_known")
    b.op("Greater", ["top_k", "zero_i"], "top_k_on")
    b.op("Less", ["top_k", "vocab"], "top_k_short")
    b.op("And", ["top_k_on", "top_k_short"], "top_k_filters")
    b.op("Not", ["top_k_filters"], "top_k_off")
    b.op("Greater", ["temperature", "zero_f"], "draws")
    b.op("And", ["p_known", "top_k_off"], "filters_known")
    b.op("And", ["filters_known", "draws"], "nucleus_exact")


def whole_draw(b: Builder, weights: str) -> None:
    """`whole_token` and `whole_logprob`: a draw over every id of the row in id order by `weights` (R, V
    padded; 0 where an id is not kept), the first whose cumulative weight passes uniform * total (numpy's
    searchsorted, right), in two levels: the groups' weights, then the chosen group's ids. Each level's
    last id with a weight is the most it takes (where rounding leaves the target at the total). The groups'
    sums (of ROW_ALIGN float32 weights) add up in float64, and so do the chosen group's weights."""
    b.op("Reshape", [weights, "group_shape"], "group_weights")  # (R, G, ROW_ALIGN)
    b.op("ReduceSum", ["group_weights", "axis2"], "group_mass32", keepdims=0)
    b.op("Cast", ["group_mass32"], "group_mass", to=TensorProto.DOUBLE)
    b.op("CumSum", ["group_mass", "axis1_s"], "group_cum")
    b.op("ArgMax", ["group_cum"], "last_group", axis=1, keepdims=0)  # the first at the total
    at(b, "group_cum", "last_group", "whole_total")
    b.op("Cast", ["uniform"], "uniform_d", to=TensorProto.DOUBLE)
    b.op("Mul", ["uniform_d", "whole_total"], "whole_target")
    b.op("Unsqueeze", ["whole_target", "axis1"], "whole_target_col")
    b.op("LessOrEqual", ["group_cum", "whole_target_col"], "groups_passed")
    count(b, "groups_passed", "groups_before")
    b.op("Min", ["groups_before", "last_group"], "drawn_group")
    at(b, "group_cum", "drawn_group", "drawn_group_cum")
    at(b, "group_mass", "drawn_group", "drawn_group_mass")
    b.op("Sub", ["drawn_group_cum", "drawn_group_mass"], "mass_before_group")
    b.op("Unsqueeze", ["drawn_group", "axis1"], "drawn_group_index")
    b.op("GatherND", ["group_weights", "drawn_group_index"], "in_group32", batch_dims=1)  # (R, ROW_ALIGN)
    b.op("Cast", ["in_group32"], "in_group", to=TensorProto.DOUBLE)
    b.op("CumSum", ["in_group", "axis1_s"], "in_group_cum")
    b.op("Unsqueeze", ["mass_before_group", "axis1"], "mass_before_group_col")
    b.op("Add", ["in_group_cum", "mass_before_group_col"], "id_cum")
    b.op("LessOrEqual", ["id_cum", "whole_target_col"], "ids_passed")
    count(b, "ids_passed", "ids_before")
    b.op("ArgMax", ["in_group_cum"], "last_in_group", axis=1, keepdims=0)
    b.op("Min", ["ids_before", "last_in_group"], "drawn_offset")
    b.op("Mul", ["drawn_group", "align_i"], "drawn_first")
    b.op("Add", ["drawn_first", "drawn_offset"], "whole_token")
    at(b, "logprobs", "whole_token", "whole_logprob")


def build(dtype: str, width: Width = WIDTHS[0], wider: int | None = None) -> onnx.ModelProto:
    """The pass for logits of `dtype`, any vocabulary size, looking at `width` of each row (N = min(V, TOP));
    `widen` says which rows a pass with a head of `wider` ids might pick (None: no row, there is none)."""
    b = Builder()
    constants(b, width)
    processed(b, dtype)
    candidates(b, width)
    head(b, whole_row=not width.groups)
    top_ids(b, floored=bool(width.groups))
    if width.nucleus:  # a draw over what min-p and top-p keep of the whole row
        nucleus(b)
        whole_draw(b, "nucleus_weights")
        b.op("And", ["nucleus_exact", "top_exact"], "exact")
        for name, source in (("token", "whole_token"), ("logprob", "whole_logprob")):
            b.op("Identity", [source], name)
    elif width.whole:  # a draw over the whole row (its rows all sample), exact where its top ids are
        b.op("Exp", ["logprobs"], "row_weights")
        whole_draw(b, "row_weights")
        for name, source in (("token", "whole_token"), ("logprob", "whole_logprob"), ("exact", "top_exact")):
            b.op("Identity", [source], name)
    else:
        filters(b)
        exactness(b, floored=bool(width.groups))
        draw(b)
        for name in ("token", "logprob", "exact"):
            b.op("Identity", [f"head_{name}"], name)
    if wider is not None:
        widening(b, wider)
    else:  # no wider pass
        b.op("Xor", ["top_exact", "top_exact"], "widen")
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
        rows("top", TensorProto.INT64),  # the top log-probabilities it asks for
        table("bias_ids", TensorProto.INT64, "M"),
        table("bias_values", TensorProto.FLOAT, "M"),
        rows("repetition", TensorProto.FLOAT),  # 1: off
        rows("presence", TensorProto.FLOAT),  # 0: off
        rows("frequency", TensorProto.FLOAT),  # 0: off
        table("seen_ids", TensorProto.INT64, "S"),
        table("occurred_ids", TensorProto.INT64, "C"),
        table("occurred_counts", TensorProto.FLOAT, "C"),
    ]
    outputs = [
        rows("token", TensorProto.INT64),
        rows("logprob", TensorProto.FLOAT),
        table("top_ids", TensorProto.INT64, "N"),
        table("top_logprobs", TensorProto.FLOAT, "N"),
        rows("exact", TensorProto.BOOL),
        rows("widen", TensorProto.BOOL),
    ]
    name = f"attnserve_logits_pass_{width.name}_{dtype}"
    used = {name for node in b.nodes for name in node.input}  # a width's unused constants, left out
    constants_used = [constant for constant in b.constants if constant.name in used]
    graph = helper.make_graph(b.nodes, name, inputs, outputs, constants_used)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="attnserve")
    model.ir_version = 8  # ONNX Runtime 1.20's oldest
    onnx.checker.check_model(model)
    return model


def build_mask(dtype: str) -> onnx.ModelProto:
    """The mask graph: rows `rows` of `logits` (slots, 1, V) of `dtype`, each with the ids its grammar does
    not allow (a 0 bit in `allowed_bits` (R, ceil(V / 32)) int32: bit i of word j for id 32j + i,
    llguidance's layout) at -inf, as `masked` (R, 1, V) of `dtype`: what the passes then take as their
    logits. The bits unpack by bytes through a table (no bitwise operators: plain arithmetic and a Gather
    run on every provider)."""
    b = Builder()
    i64 = lambda name, *v: b.const(name, np.array(v, np.int64))
    i64("axis1", 1)
    i64("axis2", 2)
    i64("minus1", -1)
    i64("zero_1d", 0)
    i64("end", np.iinfo(np.int64).max)
    i64("row_shape", 0, -1)
    b.const("word_range", np.array(1 << 32, np.int64))
    b.const("byte_range", np.array(256, np.int64))
    b.const("byte_scales", np.array([1, 1 << 8, 1 << 16, 1 << 24], np.int64))
    b.const("bit_table", ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool))  # (byte, bit)
    b.const("minus_inf", np.array(-np.inf, np.float32))
    b.op("Gather", ["logits", "rows"], "gathered", axis=0)  # (R, 1, V)
    b.op("Cast", ["allowed_bits"], "words", to=TensorProto.INT64)
    b.op("Mod", ["words", "word_range"], "unsigned_words", fmod=0)  # a negative word's bits, as 0..2^32-1
    b.op("Unsqueeze", ["unsigned_words", "axis2"], "word_columns")  # (R, W, 1)
    b.op("Div", ["word_columns", "byte_scales"], "shifted_words")  # (R, W, 4)
    b.op("Mod", ["shifted_words", "byte_range"], "word_bytes", fmod=0)
    b.op("Gather", ["bit_table", "word_bytes"], "byte_bits", axis=0)  # (R, W, 4, 8)
    b.op("Reshape", ["byte_bits", "row_shape"], "all_bits")  # (R, 32W): id order
    b.op("Shape", ["logits"], "logits_shape")
    b.op("Slice", ["logits_shape", "minus1", "end"], "vocab")
    b.op("Slice", ["all_bits", "zero_1d", "vocab", "axis1"], "allowed")  # (R, V)
    b.op("Unsqueeze", ["allowed", "axis1"], "allowed_rows")  # (R, 1, V)
    if dtype == "float32":
        b.op("Where", ["allowed_rows", "gathered", "minus_inf"], "masked")
    else:  # ONNX Runtime's CPU Where takes no float16 or bfloat16: in float32, exact both ways
        b.op("Cast", ["gathered"], "gathered32", to=TensorProto.FLOAT)
        b.op("Where", ["allowed_rows", "gathered32", "minus_inf"], "masked32")
        b.op("Cast", ["masked32"], "masked", to=DTYPES[dtype])
    inputs = [
        helper.make_tensor_value_info("logits", DTYPES[dtype], ["slots", 1, "V"]),
        helper.make_tensor_value_info("rows", TensorProto.INT64, ["R"]),
        helper.make_tensor_value_info("allowed_bits", TensorProto.INT32, ["R", "W"]),
    ]
    outputs = [helper.make_tensor_value_info("masked", DTYPES[dtype], ["R", 1, "V"])]
    graph = helper.make_graph(b.nodes, f"attnserve_logits_mask_{dtype}", inputs, outputs, b.constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="attnserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def serialized(dtype: str, width: Width) -> bytes:
    """The graph of `width` for `dtype`, whose `widen` looks ahead to the next width's head (the wide
    one's, from the narrow one)."""
    wider = WIDTHS[1].head if width == WIDTHS[0] else None
    return build(dtype, width, wider).SerializeToString(deterministic=True)


def main() -> int:
    for dtype in DTYPES:
        for width in WIDTHS:
            graph_path(dtype, width.name).write_bytes(serialized(dtype, width))
            print(graph_path(dtype, width.name))
        graph_path(dtype, MASK).write_bytes(build_mask(dtype).SerializeToString(deterministic=True))
        print(graph_path(dtype, MASK))
    return 0


if __name__ == "__main__":
    sys.exit(main())
