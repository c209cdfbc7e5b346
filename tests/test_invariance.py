"""Batch invariance (export/invariance.py, export/int8_rows.py): the row-quantized int8 MatMul gives a
row the same bits alone, in a batch and in chunks, where ONNX Runtime's per-tensor dynamic int8
does not; a long prompt is split without a run of one token; on the trained tiny model, the int8
export's graph is what int8_rows.py writes, every export's manifest holds its passed invariance gate,
and the gate names the cases of a graph whose tokens depend on the batch or on the chunking, and
refuses it."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from attnserve.export.int8_rows import WEIGHT_MAX, quantize_rows
from attnserve.export.invariance import CASES, invariance_failure, invariance_line, invariance_report
from attnserve.runtime import contract
from attnserve.runtime.arena_decoder import next_run
from attnserve.runtime.ort_decoder import OrtDecoder

CHUNK = 5


def with_graph(model_dir, out, edit, quantization=None):
    """A copy of `model_dir` at `out` with its graph changed by `edit(model)`, the manifest's hashes
    rewritten."""
    shutil.copytree(model_dir, out)
    model = onnx.load(str(out / contract.MODEL_FILE))
    edit(model)
    onnx.save(model, str(out / contract.MODEL_FILE))
    manifest = contract.read_manifest(out, verify=False)
    manifest = replace(manifest, quantization=quantization or manifest.quantization)
    contract.write_manifest(out, contract.with_files(out, manifest, list(manifest.files)))
    return out


def per_tensor_int8(model) -> None:
    """ONNX Runtime's dynamic quantization, one activation scale per tensor (what --quantize int8 was)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        quantize_dynamic(model, f"{tmp}/q.onnx", weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        model.CopyFrom(onnx.load(f"{tmp}/q.onnx"))


def one_matmul(weight: np.ndarray):
    """A graph of one MatMul of x (B, T, K) by `weight` (K, N)."""
    k, n = weight.shape
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "t", k])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", "t", n])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", contract.OPSET)])


def rows_three_ways(model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The product of every row of x (1, T, K) computed in one run, each row alone, and in chunks of CHUNK."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    whole = session.run(None, {"x": x})[0][0]
    alone = np.concatenate([session.run(None, {"x": x[:, [t]]})[0][0] for t in range(x.shape[1])])
    chunks = [session.run(None, {"x": x[:, t : t + CHUNK]})[0][0] for t in range(0, x.shape[1], CHUNK)]
    return whole, alone, np.concatenate(chunks)


def test_row_int8_gives_a_row_the_same_bits_alone_batched_and_chunked_unlike_per_tensor_int8():
    """The MatMul int8_rows.py writes: every row's product is the same bits whatever rows share its run,
    and within 2% of float32's; ONNX Runtime's per-tensor form of the same weight changes with them."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 96)).astype(np.float32) * 0.1
    x = rng.standard_normal((1, 24, 64)).astype(np.float32) * rng.uniform(0.1, 10, (1, 24, 1)).astype(np.float32)
    rows, per_tensor = one_matmul(weight), one_matmul(weight)
    assert quantize_rows(rows) == 1
    per_tensor_int8(per_tensor)
    whole, alone, chunked = rows_three_ways(rows, x)
    assert np.array_equal(whole, alone) and np.array_equal(whole, chunked)
    exact = x[0] @ weight
    assert (np.abs(whole - exact).max(axis=1) / np.abs(exact).max(axis=1)).max() < 0.02
    whole, alone, chunked = rows_three_ways(per_tensor, x)
    assert not np.array_equal(whole, alone) and not np.array_equal(whole, chunked)


@pytest.mark.parametrize(
    ("length", "chunk", "runs"),
    [
        (8, 4, [4, 4]),
        (9, 4, [4, 3, 2]),
        (13, 4, [4, 4, 3, 2]),
        (5, 4, [3, 2]),
        (4, 4, [4]),
        (1, 4, [1]),
        (3, 2, [2, 1]),
    ],
)
def test_a_long_prompt_is_split_into_chunks_without_a_run_of_one_token(length, chunk, runs):
    """next_run, as the server splits a long prompt (one token alone takes another attention path);
    a chunk of 2 cannot avoid it."""
    done, got = 0, []
    while done < length:
        got.append(next_run(length - done, chunk))
        done += got[-1]
    assert got == runs


def test_row_int8_quantizes_every_weight_matmul_once_per_activation(tiny_int8_model_dir):
    graph = onnx.load(str(tiny_int8_model_dir / contract.MODEL_FILE)).graph
    ops = [node.op_type for node in graph.node]
    n_layers = contract.read_manifest(tiny_int8_model_dir).n_layers
    assert ops.count("MatMulIntegerToFloat") == 4 * n_layers + 1 and "MatMul" not in ops
    assert ops.count("QuantizeLinear") == 4 * n_layers + 1  # q/k/v share one: fusions.py packs them
    assert not any("DynamicQuantize" in op for op in ops)
    int8 = [numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith(".int8")]
    assert int8 and all(w.dtype == np.int8 and np.abs(w).max() == WEIGHT_MAX for w in int8)  # 7 bits, all used


@pytest.mark.parametrize(
    "fixture", ["tiny_model_dir", "tiny_float16_model_dir", "tiny_int8_model_dir", "tiny_int4_model_dir"]
)
def test_every_export_records_its_invariance_gate(fixture, request):
    manifest = contract.read_manifest(request.getfixturevalue(fixture))
    parity = manifest.parity
    gate = parity[manifest.quantization]["invariance"] if manifest.quantization else parity["invariance"]
    assert gate["ok"] and gate["enforced"] and gate["passed"]
    assert set(gate["differing"]) == set(CASES) and not any(gate["differing"].values())
    assert gate["steps"] > 0 and gate["prompts"] == 5


def batch_and_length_dependent(model) -> None:
    """The logits plus 100 for id 2 per extra row in the batch, and 50 for id 1 in a run of an odd
    number of positions, for id 0 in an even one: a graph whose tokens depend on what shares the
    batch and on how a prompt is split."""
    graph = model.graph
    (producer,) = [n for n in graph.node if contract.LOGITS in n.output]
    raw = contract.LOGITS + ".raw"
    producer.output[list(producer.output).index(contract.LOGITS)] = raw
    v = next(o for o in graph.output if o.name == contract.LOGITS).type.tensor_type.shape.dim[2].dim_value
    bonus = np.zeros((3, v), np.float32)
    bonus[0, 2], bonus[1, 1], bonus[2, 0] = 100.0, 50.0, 50.0
    graph.initializer.extend(
        [
            numpy_helper.from_array(bonus, "bonus"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ]
    )
    added = [
        helper.make_node("Shape", [raw], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["positions"]),
        helper.make_node("Sub", ["rows", "one"], ["extra_rows"]),
        helper.make_node("Mod", ["positions", "two"], ["odd"]),
        helper.make_node("Sub", ["one", "odd"], ["even"]),
        helper.make_node("Concat", ["extra_rows", "odd", "even"], ["terms"], axis=0),
        helper.make_node("Cast", ["terms"], ["weights"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["weights", "zero"], ["weights_row"]),
        helper.make_node("MatMul", ["weights_row", "bonus"], ["shift"]),
        helper.make_node("Add", [raw, "shift"], [contract.LOGITS]),
    ]
    at = list(graph.node).index(producer) + 1
    for offset, node in enumerate(added):
        graph.node.insert(at + offset, node)


def test_the_gate_names_and_refuses_a_graph_whose_tokens_depend_on_the_batch_or_the_chunks(tiny_model_dir, tmp_path):
    doctored = with_graph(tiny_model_dir, tmp_path / "doctored", batch_and_length_dependent)
    report = invariance_report(OrtDecoder(doctored), steps=8)
    assert not report["ok"] and report["enforced"] and not report["passed"]
    assert all(report["differing"][case] for case in CASES), report["differing"]
    assert "FAIL" in invariance_line(report) and "prefilled together:" in invariance_line(report)
    message = invariance_failure(report)
    assert message.startswith("batch invariance failed: prefilled together: row ") and "chunked: row" in message
    assert invariance_report(OrtDecoder(tiny_model_dir), steps=8)["ok"]
