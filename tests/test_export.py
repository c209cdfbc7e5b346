"""The export contract and the parity gate, on a real trained tiny model and ONNX Runtime."""

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_driver import run_in_one_process

from attnserve.export.onnx_export import export_checkpoint
from attnserve.export.parity import run_decoder_gate
from attnserve.export.parity_arena import run_arena_gate
from attnserve.model.checkpoint import load_checkpoint
from attnserve.model.generate import generate
from attnserve.runtime import contract
from attnserve.runtime.ort_decoder import OrtDecoder
from attnserve.tokenizer.utf8 import PAD_ID, encode


def test_graph_passes_onnx_checker_and_has_the_contract_io(tiny_model_dir):
    proto = onnx.load(str(tiny_model_dir / contract.MODEL_FILE))
    onnx.checker.check_model(proto)
    n_layers = json.loads((tiny_model_dir / contract.MANIFEST_FILE).read_text())["config"]["n_layers"]
    assert [i.name for i in proto.graph.input] == contract.decoder_inputs(n_layers)
    assert [o.name for o in proto.graph.output] == contract.arena_decoder_outputs(n_layers)
    assert max(op.version for op in proto.opset_import if op.domain in ("", "ai.onnx")) >= 18
    past = next(i for i in proto.graph.input if i.name == "past_key_values.0.key")
    assert [d.dim_param or d.dim_value for d in past.type.tensor_type.shape.dim][::2] == ["batch", "max_sequence"]
    ops = [node.op_type for node in proto.graph.node]
    assert ops.count("GroupQueryAttention") == n_layers and "Concat" not in ops  # in place: nothing concatenated


def test_each_attention_takes_its_query_key_and_value_packed_from_one_projection(tiny_model_dir):
    """export/fusions.py: one MatMul and one Add of the three weights and biases side by side feed each
    GroupQueryAttention, its key and value inputs empty (the parity gate ran on this graph)."""
    proto = onnx.load(str(tiny_model_dir / contract.MODEL_FILE))
    producer = {output: node for node in proto.graph.node for output in node.output}
    weights = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in proto.graph.initializer}
    d_model = json.loads((tiny_model_dir / contract.MANIFEST_FILE).read_text())["config"]["d_model"]
    for node in (n for n in proto.graph.node if n.op_type == "GroupQueryAttention"):
        assert list(node.input[1:3]) == ["", ""]
        add = producer[node.input[0]]
        matmul = producer[add.input[0]]
        assert (add.op_type, matmul.op_type) == ("Add", "MatMul")
        assert weights[matmul.input[1]].shape == (d_model, 3 * d_model)
        assert weights[add.input[1]].shape == (3 * d_model,)


def test_concat_export_keeps_the_concat_graph_and_its_gate(tiny_concat_model_dir):
    manifest = contract.read_manifest(tiny_concat_model_dir)
    assert manifest.kv_cache == "concat" and manifest.parity["passed"] is True
    cases = {c["case"] for c in manifest.parity["checks"]}
    assert {"B1 T1 P0", "B3 T13 P0 left-padded", "B3 T1 P17 left-padded"} <= cases
    genai = json.loads((tiny_concat_model_dir / contract.GENAI_CONFIG_FILE).read_text())
    assert genai["search"]["past_present_share_buffer"] is False
    proto = onnx.load(str(tiny_concat_model_dir / contract.MODEL_FILE))
    assert "GroupQueryAttention" not in {node.op_type for node in proto.graph.node}


def test_manifest_records_parity_and_hashes_verify(tiny_model_dir, tiny_checkpoint):
    manifest = contract.read_manifest(tiny_model_dir)  # verifies every sha256
    assert manifest.parity["passed"] is True
    assert manifest.parity["greedy"]["steps"] == 64
    assert all(c["ok"] and c["max_abs_diff"] <= 1e-4 for c in manifest.parity["checks"])
    cases = {c["case"] for c in manifest.parity["checks"]}
    assert manifest.kv_cache == "arena"
    assert {"prefill B3 right-padded slot 2", "admit into slot 3 slot 3", "decode B3 after refill slot 1"} <= cases
    assert any(case.startswith("chunked prefill") for case in cases)
    assert len(manifest.parity["greedy"]["rows"]) == 5  # requests arriving at different steps
    assert manifest.source_checkpoint["sha256"] == contract.sha256_file(tiny_checkpoint)
    assert manifest.tokenizer == {
        "kind": "bytes",
        "vocab_size": 259,
        "bos_id": 256,
        "eos_id": 257,
        "pad_id": 258,
        "add_bos": True,
    }
    assert set(manifest.files) == {contract.MODEL_FILE, contract.GENAI_CONFIG_FILE}


def test_tampered_model_is_detected(tiny_model_dir, tmp_path):
    copy = tmp_path / "tampered"
    shutil.copytree(tiny_model_dir, copy)
    data = bytearray((copy / contract.MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / contract.MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(contract.ModelDirError, match=r"model\.onnx does not match the sha256"):
        contract.read_manifest(copy)
    (copy / contract.MODEL_FILE).unlink()
    with pytest.raises(contract.ModelDirError, match="missing"):
        contract.read_manifest(copy)


def test_genai_config_describes_the_graph(tiny_model_dir):
    genai = json.loads((tiny_model_dir / contract.GENAI_CONFIG_FILE).read_text())
    manifest = contract.read_manifest(tiny_model_dir)
    decoder = genai["model"]["decoder"]
    assert genai["model"]["type"] == "decoder" and genai["search"]["past_present_share_buffer"] is True
    assert decoder["filename"] == contract.MODEL_FILE
    assert decoder["inputs"]["past_key_names"] % 1 == "past_key_values.1.key"
    assert decoder["outputs"]["present_value_names"] % 0 == "present.0.value"
    assert decoder["num_hidden_layers"] == manifest.n_layers
    assert decoder["head_size"] * decoder["num_attention_heads"] == decoder["hidden_size"]
    assert genai["model"]["eos_token_id"] == manifest.tokenizer["eos_id"]


def test_onnx_greedy_equals_pytorch_generate(tiny_model_dir, tiny_checkpoint):
    model = load_checkpoint(tiny_checkpoint)
    runtime = OrtDecoder(tiny_model_dir)
    prompts = [encode("def main():"), encode("The "), encode("import os\nimport sys\n")]
    reference = generate(model, prompts, 40, eos_id=-1, pad_id=PAD_ID)
    assert runtime.greedy(prompts, 40).tolist() == reference
    assert runtime.greedy(prompts, 12, recompute=True).tolist() == [r[:12] for r in reference]


def perturb(path, scale=0.05, seed=0):
    """Add noise to the largest float initializer of an ONNX file: a deliberately wrong graph."""
    proto = onnx.load(str(path))
    init = max(proto.graph.initializer, key=lambda t: np.prod(t.dims) if t.data_type == 1 else 0)
    array = onnx.numpy_helper.to_array(init)
    noisy = array + np.random.default_rng(seed).normal(0, scale, array.shape).astype(array.dtype)
    init.CopyFrom(onnx.numpy_helper.from_array(noisy, init.name))
    onnx.save(proto, str(path))


@pytest.mark.parametrize("layout", ["arena", "concat"])
def test_gate_fails_with_numbers_on_a_perturbed_graph(
    tiny_model_dir, tiny_concat_model_dir, tiny_checkpoint, tmp_path, layout
):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir if layout == "arena" else tiny_concat_model_dir, bad)
    perturb(bad / contract.MODEL_FILE)
    gate = run_arena_gate if layout == "arena" else run_decoder_gate
    report = gate(load_checkpoint(tiny_checkpoint), OrtDecoder(bad, verify=False), steps=64)
    assert not report["passed"]
    failing = [c for c in report["checks"] if not c["ok"]]
    assert failing and all(c["max_abs_diff"] > c["tolerance"] for c in failing)


PERTURBED_EXPORT = """
import sys
sys.path.insert(0, "tests")  # this module's own imports (cli_driver)
import attnserve.export.onnx_export as ex
from tests.test_export import perturb
real = ex.export_graphs
def export_then_perturb(model, staging, dtype, kv_cache):
    real(model, staging, dtype, kv_cache)
    perturb(staging / "model.onnx")
ex.export_graphs = export_then_perturb
from attnserve.cli import main
sys.exit(main(["export", sys.argv[1], "--out", sys.argv[2]]))
"""


def test_cli_exits_nonzero_and_leaves_nothing_on_parity_failure(tiny_checkpoint, tmp_path, request):
    out = tmp_path / "models" / "bad"
    proc = subprocess.run(
        [sys.executable, "-c", PERTURBED_EXPORT, str(tiny_checkpoint), str(out)],
        capture_output=True,
        text=True,
        cwd=request.config.rootpath,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr
    assert "parity gate failed" in proc.stderr and "max abs diff" in proc.stderr
    assert "FAIL" in proc.stdout  # the report table was printed
    assert not out.exists() and list((tmp_path / "models").iterdir()) == []


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "export", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cli_errors_are_one_line(tmp_path, tiny_checkpoint):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00garbage")
    blocker = tmp_path / "file"
    blocker.write_text("a regular file")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("not a model")
    cases = [
        ((tmp_path / "missing.pt", "--out", tmp_path / "m"), "checkpoint not found"),
        ((corrupt, "--out", tmp_path / "m"), "corrupt or unreadable"),
        ((tiny_checkpoint, "--out", blocker / "m"), f"--out {blocker / 'm'}: {blocker} is a file, not a directory"),
        ((tiny_checkpoint, "--out", precious), "refusing to replace it"),
        ((tiny_checkpoint, "--out", tmp_path / "m", "--parity-steps", "0"), "--parity-steps must be at least 1, got 0"),
        ((tiny_checkpoint, "--out", tmp_path / "m", "--parity-steps", "-3"), "--parity-steps must be at least 1"),
    ]
    got = run_in_one_process([["export", *args] for args, _ in cases], tmp_path)
    for (args, expected), result in zip(cases, got):
        assert result["rc"] == 2, (args, result["stderr"])
        assert expected in result["stderr"] and "Traceback" not in result["stderr"]
        assert len(result["stderr"].strip().splitlines()) == 1
    assert (precious / "notes.txt").read_text() == "not a model"


def test_the_float16_export_passes_its_gate(tiny_checkpoint, tmp_path):
    heldout = "\n".join(["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x + 1"] * 40)
    manifest = export_checkpoint(tiny_checkpoint, tmp_path / "m", heldout=heldout.encode(), dtype="float16")
    assert manifest.parity["passed"] is True
    assert OrtDecoder(tmp_path / "m").session.get_outputs()[0].type == "tensor(float16)"
    assert all(row["agreeing_steps"] == 64 or row["excused_near_tie"] for row in manifest.parity["greedy"]["rows"])
    assert argmax_reads(tmp_path / "m", tmp_path / "optimized.onnx") == contract.LOGITS


def argmax_reads(model_dir, optimized) -> str:
    """The tensor NEXT_TOKEN's ArgMax takes its values from in the graph ONNX Runtime runs, through the
    Reshapes and Casts in front of it: on a CPU without float16 arithmetic ONNX Runtime computes a
    float16 graph in float32 and removes a Cast pair of its own and ours, and an ArgMax right behind
    the last MatMul saw its unrounded values (the float16 gate then failed on a tie, 4.953125 twice)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(optimized)).graph
    producers = {output: node for node in graph.node for output in node.output}
    (argmax,) = [node for node in graph.node if node.op_type == "ArgMax"]
    tensor = argmax.input[0]
    while tensor != contract.LOGITS and producers[tensor].op_type in ("Reshape", "Cast"):
        tensor = producers[tensor].input[0]
    return tensor


def test_the_int8_export_passes_its_gate_from_the_command_line(tiny_checkpoint, tmp_path):
    """As the README runs it: its gate on the default corpus's held-out text, no traceback after it
    (the int8 report nests the float32 gate's) and no quantizer advice on stderr; every MatMul by a
    weight is quantized, the tied head's included."""
    proc = run_cli(tiny_checkpoint, "--out", tmp_path / "m", "--quantize", "int8")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "pre-processing" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"wrote {tmp_path / 'm'} (float32, int8, arena KV cache, parity passed)"
    manifest = contract.read_manifest(tmp_path / "m")
    assert manifest.quantization == "int8" and manifest.parity["passed"] is True
    assert manifest.parity["int8"]["loss_ratio"] <= 1.02
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m" / contract.MODEL_FILE)).graph.node}
    assert any("MatMulInteger" in op or "DynamicQuantize" in op for op in ops)
    assert "MatMul" not in ops and "Transpose" not in ops  # the tied head is quantized too


def test_the_int4_export_quantizes_every_weight_and_passes_its_gate(tiny_checkpoint, tmp_path):
    """--quantize int4 from the command line with its flags: every MatMul by a weight (the tied head
    included) is MatMulNBits with the chosen blocks (the head's its own) and accuracy level, the embedding
    GatherBlockQuantized with no float copy left, and the held-out loss gate's result and settings are in
    the manifest."""
    args = ("--out", tmp_path / "m", "--quantize", "int4", "--int4-block-size", "16", "--int4-accuracy-level", "0")
    args += ("--int4-head-block-size", "64")
    proc = run_cli(tiny_checkpoint, *args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("INFO") == 0 and "pre-processing" not in proc.stderr, proc.stderr
    assert "may not be a valid model" not in proc.stderr, proc.stderr  # the gates judge the graph instead
    assert proc.stdout.splitlines()[-1] == f"wrote {tmp_path / 'm'} (float32, int4, arena KV cache, parity passed)"
    manifest = contract.read_manifest(tmp_path / "m")
    gate = manifest.parity["int4"]
    assert manifest.quantization == "int4" and manifest.parity["passed"] is True
    assert gate["loss_ratio"] <= gate["max_loss_ratio"] == 1.05
    assert (gate["block_size"], gate["accuracy_level"], gate["head_block_size"]) == (16, 0, 64)
    graph = onnx.load(str(tmp_path / "m" / contract.MODEL_FILE)).graph
    ops = [node.op_type for node in graph.node]
    n_layers = manifest.n_layers
    assert ops.count("MatMulNBits") == 4 * n_layers + 1 and "MatMul" not in ops and "Transpose" not in ops
    assert ops.count("GatherBlockQuantized") == 1
    for node in (n for n in graph.node if n.op_type == "MatMulNBits"):
        attributes = {a.name: a.i for a in node.attribute}
        blocks = 64 if node.output[0] == contract.LOGITS else 16
        assert (attributes["bits"], attributes["block_size"], attributes.get("accuracy_level", 0)) == (4, blocks, 0)
    assert sum(node.output[0] == contract.LOGITS for node in graph.node if node.op_type == "MatMulNBits") == 1
    assert "model.embedding.embed.weight" not in {t.name for t in graph.initializer}  # no float copy left


def test_the_int4_export_is_smaller_and_decodes_as_its_gate_says(tiny_int4_model_dir, tiny_model_dir):
    """The default int4 directory (blocks of 32, accuracy level 4) holds a quarter of the float32
    bytes or less plus its scales, and its greedy agreement is what the manifest reports."""
    sizes = [(d / contract.MODEL_FILE).stat().st_size for d in (tiny_int4_model_dir, tiny_model_dir)]
    assert sizes[0] < 0.4 * sizes[1]
    gate = contract.read_manifest(tiny_int4_model_dir).parity["int4"]
    assert (gate["block_size"], gate["accuracy_level"]) == (32, 4)
    prompts = [list(range(97, 97 + n)) for n in (1, 13, 5)]
    steps = gate["greedy_steps"]
    agreement = OrtDecoder(tiny_int4_model_dir).greedy(prompts, steps) == OrtDecoder(tiny_model_dir).greedy(
        prompts, steps
    )
    assert float(agreement.mean()) == gate["greedy_token_agreement"]


def test_the_manifest_spells_the_architectures_as_the_model_does():
    """model/ sits below export/ and may not import the contract, so the two spellings are checked here."""
    from attnserve.model import config

    assert contract.ARCHITECTURES == config.ARCHITECTURES
    assert (contract.DECODER_ONLY, contract.ENCODER_DECODER) == (config.DECODER, config.ENCODER_DECODER)
