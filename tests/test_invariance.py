"""Batch invariance (export/invariance.py, export/int8_rows.py) on the trained tiny model: a row's
logits are the same bits alone, in a batch and prefilled in chunks, for the float32 export and the
row-quantized int8 export, where ONNX Runtime's per-tensor dynamic int8 of the same graph changes
them; every export's manifest holds its invariance gate; and the gate names the cases of a graph
whose tokens depend on the batch or on the chunking, and refuses it."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from attnserve.export.invariance import CASES, invariance_failure, invariance_line, invariance_report
from attnserve.runtime import contract
from attnserve.runtime.ort_decoder import OrtDecoder

PROMPTS = [[5, 17, 3, 99, 41, 7, 12, 60, 2], [88, 4], [31, 9, 70, 11, 6, 54]]
CHUNK = 3


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

    from attnserve.export.quantize import fold_weight_transposes

    fold_weight_transposes(model.graph)
    with tempfile.TemporaryDirectory() as tmp:
        quantize_dynamic(model, f"{tmp}/q.onnx", weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        quantized = onnx.load(f"{tmp}/q.onnx")
    model.CopyFrom(quantized)


def logits_three_ways(model_dir) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each prompt's last logits prefilled alone, prefilled together in one batch, and prefilled alone
    CHUNK ids at a time."""
    runtime = OrtDecoder(model_dir)
    decoder = runtime.arena(len(PROMPTS), 64)
    alone = []
    for prompt in PROMPTS:
        decoder.arena.lengths[:] = 0
        alone.append(decoder.prefill(0, [prompt])[0].copy())
    decoder.arena.lengths[:] = 0
    together = decoder.prefill(0, PROMPTS).copy()
    chunked = []
    for prompt in PROMPTS:
        decoder.arena.lengths[:] = 0
        for start in range(0, len(prompt), CHUNK):
            logits = decoder.extend(0, prompt[start : start + CHUNK])
        chunked.append(logits.copy())
    return np.array(alone), together, np.array(chunked)


def test_row_int8_logits_are_the_same_bits_alone_batched_and_chunked_unlike_per_tensor_int8(
    tiny_model_dir, tiny_int8_model_dir, tmp_path
):
    per_tensor = with_graph(tiny_model_dir, tmp_path / "per-tensor", per_tensor_int8, "int8")
    for model_dir in (tiny_model_dir, tiny_int8_model_dir):
        alone, together, chunked = logits_three_ways(model_dir)
        assert np.array_equal(alone, together) and np.array_equal(alone, chunked), model_dir
    alone, together, chunked = logits_three_ways(per_tensor)
    assert not np.array_equal(alone, together) and not np.array_equal(alone, chunked)


def test_row_int8_quantizes_every_weight_matmul_once_per_activation(tiny_int8_model_dir):
    graph = onnx.load(str(tiny_int8_model_dir / contract.MODEL_FILE)).graph
    ops = [node.op_type for node in graph.node]
    n_layers = contract.read_manifest(tiny_int8_model_dir).n_layers
    assert ops.count("MatMulIntegerToFloat") == 4 * n_layers + 1 and "MatMul" not in ops
    assert ops.count("QuantizeLinear") == 4 * n_layers + 1  # q/k/v share one: fusions.py packs them
    assert not any("DynamicQuantize" in op for op in ops)
    int8 = [numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith(".int8")]
    assert int8 and all(w.dtype == np.int8 and np.abs(w).max() == 127 for w in int8)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_int8_model_dir", "tiny_int4_model_dir"])
def test_every_export_records_its_invariance_gate(fixture, request):
    model_dir = request.getfixturevalue(fixture)
    parity = contract.read_manifest(model_dir).parity
    gate = parity[parity_key(model_dir)]["invariance"] if "float32_gate" in parity else parity["invariance"]
    assert gate["ok"] and gate["enforced"] and gate["passed"]
    assert set(gate["differing"]) == set(CASES) and not any(gate["differing"].values())
    assert gate["steps"] > 0 and gate["prompts"] == 5


def parity_key(model_dir) -> str:
    return contract.read_manifest(model_dir).quantization


def batch_and_length_dependent(model) -> None:
    """The logits plus 100 for id 0 per extra row in the batch, and 100 for id 1 per extra position in
    the step: a graph whose tokens depend on what shares the batch and on how a prompt is chunked."""
    graph = model.graph
    (producer,) = [n for n in graph.node if contract.LOGITS in n.output]
    raw = contract.LOGITS + ".raw"
    producer.output[list(producer.output).index(contract.LOGITS)] = raw
    v = next(o for o in graph.output if o.name == contract.LOGITS).type.tensor_type.shape.dim[2].dim_value
    bonus = np.zeros((2, v), np.float32)
    bonus[0, 0] = bonus[1, 1] = 100.0
    graph.initializer.extend(
        [
            numpy_helper.from_array(bonus, "bonus"),
            numpy_helper.from_array(np.array([0], np.int64), "first"),
            numpy_helper.from_array(np.array([2], np.int64), "second"),
            numpy_helper.from_array(np.array(1, np.float32), "one_row"),
        ]
    )
    added = [
        helper.make_node("Shape", [raw], ["shape"]),
        helper.make_node("Slice", ["shape", "first", "second"], ["batch_and_steps"]),
        helper.make_node("Cast", ["batch_and_steps"], ["sizes"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Sub", ["sizes", "one_row"], ["extra"]),
        helper.make_node("Unsqueeze", ["extra", "first"], ["extra_row"]),
        helper.make_node("MatMul", ["extra_row", "bonus"], ["shift"]),
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
