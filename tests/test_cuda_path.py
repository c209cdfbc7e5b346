"""The CUDA path's rules, proven where they can be without a GPU (issue 23): which provider runs
which export, the refusal and the auto fallback with their exact lines, a run's inputs written in
place, bfloat16's host view, and a float16 directory served end to end. tests/test_gpu.py proves
the rest on a CUDA host (`make gpu-check`)."""

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from fixtures_server import start_server
from fixtures_train import BYTE_IDS

from attnserve.export.onnx_export import ExportError, export_checkpoint
from attnserve.runtime import contract, model_sessions
from attnserve.runtime.arena import Device
from attnserve.runtime.arena_decoder import MASK_COLUMNS, ArenaDecoder
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.runtime.ort_decoder import OrtDecoder, continuous_greedy
from attnserve.runtime.ort_session import ProviderError, cuda_available, resolve_provider, to_float32
from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

FLOAT32_ARENA = "models/x is a float32 arena export"
HINT = "export it again: attnserve export runs/x/checkpoint.pt --out models/x-float16 --dtype float16"


def test_each_export_names_the_providers_that_run_it():
    assert contract.providers_for("float32", contract.KV_ARENA) == ("cpu",)  # CUDA's GQA has no float32
    assert contract.providers_for("float16", contract.KV_ARENA) == ("cuda", "cpu")
    assert contract.providers_for("bfloat16", contract.KV_ARENA) == ("cuda",)  # no bfloat16 kernels on the CPU
    assert contract.providers_for("float32", contract.KV_CONCAT) == ("cuda", "cpu")  # no GQA in the concat graph


def test_the_manifest_records_them_and_older_manifests_get_them(tiny_model_dir):
    manifest = contract.read_manifest(tiny_model_dir)
    assert manifest.providers == ("cpu",)
    raw = json.loads((tiny_model_dir / contract.MANIFEST_FILE).read_text())
    assert raw["providers"] == ["cpu"]
    del raw["providers"]  # a directory exported before the field
    assert contract.Manifest.from_dict(raw).providers == ("cpu",)


@pytest.mark.parametrize(
    ("asked", "suits", "cuda", "expected"),
    [
        ("auto", ("cpu",), False, ("cpu", "")),
        ("auto", ("cpu",), True, ("cpu", f"{FLOAT32_ARENA}, which CUDA cannot run; serving on the CPU ({HINT})")),
        ("auto", ("cuda", "cpu"), True, ("auto", "")),  # create_session still falls back if CUDA fails to start
        ("auto", ("cuda", "cpu"), False, ("cpu", "")),
        ("cpu", ("cuda", "cpu"), True, ("cpu", "")),
        ("cuda", ("cuda", "cpu"), False, ("cuda", "")),  # create_session says this onnxruntime has no CUDA
    ],
)
def test_the_provider_each_request_gets(asked, suits, cuda, expected):
    assert resolve_provider(asked, suits, FLOAT32_ARENA, HINT, cuda) == expected


@pytest.mark.parametrize(
    ("asked", "suits", "cuda", "message"),
    [
        (
            "cuda",
            ("cpu",),
            True,
            f"--provider cuda: {FLOAT32_ARENA}, which ONNX Runtime's CUDA provider cannot run (its "
            f"GroupQueryAttention is float16/bfloat16 only); {HINT}",
        ),
        (
            "cpu",
            ("cuda",),
            True,
            f"--provider cpu: {FLOAT32_ARENA}, which only ONNX Runtime's CUDA provider runs; {HINT}",
        ),
        (
            "auto",
            ("cuda",),
            False,
            f"--provider auto: {FLOAT32_ARENA}, which only ONNX Runtime's CUDA provider runs, and this onnxruntime "
            "has none (install onnxruntime-gpu on a CUDA host)",
        ),
    ],
)
def test_a_provider_that_cannot_run_the_export_is_refused(asked, suits, cuda, message):
    with pytest.raises(ProviderError) as refused:
        resolve_provider(asked, suits, FLOAT32_ARENA, HINT, cuda)
    assert str(refused.value) == message


def serve_on_cuda(model_dir) -> subprocess.CompletedProcess:
    """`attnserve serve --provider cuda` on `model_dir`, to its exit."""
    command = [sys.executable, "-m", "attnserve.cli", "serve", "--model", str(model_dir), "--provider", "cuda"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_serve_refuses_cuda_for_a_float32_arena_in_one_line_naming_the_export(tiny_model_dir):
    done = serve_on_cuda(tiny_model_dir)
    checkpoint = contract.read_manifest(tiny_model_dir).source_checkpoint["path"]
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"attnserve serve: error: --provider cuda: {tiny_model_dir} is a float32 arena export, which ONNX "
        "Runtime's CUDA provider cannot run (its GroupQueryAttention is float16/bfloat16 only); export it again: "
        f"attnserve export {checkpoint} --out {tiny_model_dir}-float16 --dtype float16"
    ]


def test_auto_on_a_cuda_host_serves_a_float32_arena_on_the_cpu_and_says_why(tiny_model_dir, monkeypatch, caplog):
    """This onnxruntime is told it has CUDA: auto must not open the float32 arena there."""
    monkeypatch.setattr(model_sessions, "cuda_available", lambda: True)
    runner = ModelSessions(tiny_model_dir, "auto", threads=1)
    assert runner.provider == "CPUExecutionProvider"
    note = runner.provider_note
    assert note.startswith(f"{tiny_model_dir} is a float32 arena export, which CUDA cannot run; serving on the CPU")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [f"--provider auto: {note}"]
    running = start_server(tiny_model_dir, provider="auto")
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
        assert info.execution_provider == f"CPUExecutionProvider ({note})"
    finally:
        running.stop()


@pytest.mark.skipif(cuda_available(), reason="a CUDA host exports bfloat16 (tests/test_gpu.py)")
def test_bfloat16_export_without_cuda_is_refused_before_any_work(tiny_checkpoint, tmp_path):
    with pytest.raises(ExportError) as refused:
        export_checkpoint(tiny_checkpoint, tmp_path / "bf16", dtype="bfloat16")
    assert str(refused.value) == (
        "--dtype bfloat16 runs only on ONNX Runtime's CUDA provider, which this onnxruntime lacks, so its parity "
        "gate cannot run here (install onnxruntime-gpu on a CUDA host; float16 runs on both)"
    )
    assert not (tmp_path / "bf16").exists()


def test_bfloat16_host_values_are_read_as_pytorch_reads_them():
    values = torch.tensor([0.0, -1.5, 3.140625, 1e-3, -65280.0, float("inf")]).bfloat16()
    bits = values.view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_float32(bits, "bfloat16"), values.float().numpy())


class BoundArrays:
    """A spy on IO binding's host inputs: every array bound must lie in the decoder's own buffers."""

    def __init__(self, monkeypatch, decoder: ArenaDecoder):
        self.bound: list[str] = []
        original = ort.IOBinding.bind_cpu_input

        def checked(binding, name, array):
            assert np.shares_memory(array, decoder.inputs.host[name]), f"{name}: a fresh array bound"
            self.bound.append(name)
            original(binding, name, array)

        monkeypatch.setattr(ort.IOBinding, "bind_cpu_input", checked)


def test_a_runs_inputs_are_written_into_buffers_allocated_once(tiny_model_dir, monkeypatch):
    """Prefill, chunked extension and decode steps bind views of buffers allocated once (a decode
    step rebinds only the mask, and only when its width, the longest slot's positions rounded up to
    MASK_COLUMNS, grows), and decode exactly as the arena's own greedy loop does."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    prompts = [[72, 101, 108, 108, 111], [87, 111], [65] * 20]
    want = runtime.greedy(prompts, 24)
    decoder = ArenaDecoder(runtime.session, runtime.manifest, capacity=4, max_tokens=64, device=Device())
    addresses = {name: decoder.inputs.address(name) for name in decoder.inputs.sizes}
    spy = BoundArrays(monkeypatch, decoder)
    logits = decoder.prefill(0, prompts[:2])
    decoder.extend(2, prompts[2][:16])
    logits = np.concatenate([logits, decoder.extend(2, prompts[2][16:])[None]])
    spy.bound.clear()
    got, binds = [], []
    for _ in range(24):
        tokens = logits.argmax(-1)
        got.append(tokens)
        logits = decoder.decode(tokens)
        binds.append(len(spy.bound))
    assert np.array_equal(np.stack(got, 1), want)
    assert {name: decoder.inputs.address(name) for name in decoder.inputs.sizes} == addresses
    # the longest slot holds 20 positions after the extension: the mask is 32 wide for the steps whose
    # longest + 1 is 21..32, then 64 wide from the 13th step on: bound once more, at that step
    assert MASK_COLUMNS == 32
    assert set(spy.bound[:3]) == {contract.INPUT_IDS, contract.ATTENTION_MASK, contract.POSITION_IDS}
    assert spy.bound[3:] == [contract.ATTENTION_MASK]
    assert binds == [3] * 12 + [4] * 12
    assert np.array_equal(decoder.inputs.host[contract.INPUT_IDS][:3], got[-1])  # the last step's ids, in place


def test_fixed_shape_decode_steps_decode_what_the_plain_steps_decode(tiny_model_dir):
    """The CUDA-graph path's steps (fixed_steps.py: a context-wide mask, logits read back from a
    device buffer), driven on the CPU provider through a continuous batch with moves."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    prompts = [encode(p) for p in ("def main(", "import os", "The quick", "x = 1", "for i in")]
    arrivals = [0, 0, 2, 5, 9]
    want = continuous_greedy(runtime.arena(5, 64), prompts, arrivals, 40)
    fixed = ArenaDecoder(runtime.session, runtime.manifest, 5, 64, graph_session=runtime.session)
    assert np.array_equal(continuous_greedy(fixed, prompts, arrivals, 40), want)
    assert sorted(fixed.fixed.bindings) == [(b, False) for b in range(1, 6)]  # one binding (a graph on CUDA) per size


@pytest.mark.parametrize("fixed", [False, True], ids=["plain steps", "fixed steps"])
def test_a_banned_greedy_token_gives_way_to_the_best_other_id_of_its_own_row(tiny_model_dir, fixed):
    """A burst's row whose argmax is one of its bans (ignore_eos): greedy_without after decode_greedy
    reads that row's logits from where the step left them (the device buffer; the CUDA-graph path's,
    driven on the CPU provider) and takes the likeliest id not banned, lowest first on ties: what a
    twin decoder that brings every row's logits back gives, ranked by numpy."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    prompts = [encode(p) for p in ("def main(", "import os", "The quick")]
    twin = runtime.arena(3, 64)
    decoder = ArenaDecoder(runtime.session, runtime.manifest, 3, 64, graph_session=runtime.session if fixed else None)
    tokens = twin.prefill(0, prompts).argmax(axis=1)
    decoder.prefill(0, prompts)
    for _ in range(4):
        logits = np.array(twin.decode(tokens))
        picked = decoder.decode_greedy(tokens)
        assert np.array_equal(picked, logits.argmax(axis=1))
        for row in range(3):
            banned = (int(picked[row]), 7)
            ranked = np.argsort(-logits[row], kind="stable")
            assert decoder.greedy_without(3, row, banned) == next(i for i in ranked if i not in banned)
        tokens = picked


def test_a_runners_step_with_bans_gives_each_banned_key_its_best_other_id(tiny_model_dir):
    """ArenaRunner.decode with `bans` beside a key that samples (one step at a time): a key whose greedy
    token is banned gets the likeliest other id of its row (ranked by numpy from a twin runner that
    brings every row back), a key whose argmax is not banned keeps it, and the sampled key's row comes
    back as the twin's."""
    model = ModelSessions(tiny_model_dir, "cpu", threads=1)
    twin, runner = open_slot_runner(model, 3, 64), open_slot_runner(model, 3, 64)
    prompts = [encode(p) for p in ("def main(", "import os", "The quick")]
    for each in (twin, runner):
        for key, prompt in enumerate(prompts):
            each.start(key, tuple(prompt))
        first = each.prefill()
    next_ids = dict(zip(first.keys, first.rows.argmax(axis=1).tolist()))
    for _ in range(4):
        want = twin.decode(next_ids)
        rows = np.array(want.rows)
        bans = {0: (int(rows[0].argmax()), 7), 1: (int(rows[1].argsort()[0]),)}  # 0's argmax banned, 1's not
        got = runner.decode(next_ids, frozenset({2}), None, bans)
        assert got.keys == want.keys == [0, 1, 2]
        ranked = np.argsort(-rows[0], kind="stable")
        assert got.tokens[0] == next(i for i in ranked if i not in bans[0])
        assert got.tokens[1] == rows[1].argmax() and np.array_equal(got.rows[2], rows[2])
        next_ids = dict(zip(got.keys, got.tokens.tolist()))


def test_the_graphs_next_token_is_numpys_argmax_of_its_logits(tiny_model_dir):
    """Over a ragged batch at every position; and its ArgMax node, run alone on tied rows, picks the
    first of the tied indices, as numpy and torch do."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    names = [o.name for o in runtime.session.get_outputs()]
    assert names[-1] == contract.NEXT_TOKEN
    m, b, t = runtime.manifest, 3, 7
    ids = np.random.default_rng(0).integers(0, 256, (b, t))
    mask = np.ones((b, t), np.int64)
    mask[1, 5:] = mask[2, 2:] = 0  # right-padded rows of 7, 5 and 2 tokens
    past = [np.zeros((b, m.n_kv_heads, m.context_length, m.head_dim), np.float32) for _ in range(2 * m.n_layers)]
    feeds = dict(zip(m.graphs[contract.DECODER].inputs, [ids, mask, np.broadcast_to(np.arange(t), (b, t)), *past]))
    outputs = dict(zip(names, runtime.session.run(None, feeds)))
    assert np.array_equal(outputs[contract.NEXT_TOKEN], outputs[contract.LOGITS].argmax(-1))
    graph = onnx.load(str(tiny_model_dir / contract.MODEL_FILE)).graph
    (argmax,) = [node for node in graph.node if node.op_type == "ArgMax"]
    alone = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("ArgMax", ["x"], ["y"], **{a.name: a.i for a in argmax.attribute})],
            "argmax",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [2])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", contract.OPSET)],
    )
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
    session = ort.InferenceSession(alone.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": ties})[0].tolist() == ties.argmax(-1).tolist() == [1, 0]


class LogitReads:
    """A spy on Device.read (the only way rows leave the device buffer of a picked step's logits):
    how many logits rows were read back."""

    def __init__(self, monkeypatch):
        self.rows = 0
        original = Device.read

        def counting(device, address, out):
            self.rows += out.size // VOCAB if out.dtype.kind == "f" else 0  # logits; ids are int64
            return original(device, address, out)

        monkeypatch.setattr(Device, "read", counting)


VOCAB = 259  # the tiny byte model's ids


def test_an_all_greedy_step_brings_back_only_token_ids(tiny_model_dir, monkeypatch):
    """decode_greedy reads the graph's NEXT_TOKEN and not one row of logits, through a continuous
    batch, plain steps and fixed-shape ones alike, with the tokens of the logits path."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    assert runtime.manifest.vocab_size == VOCAB
    prompts = [encode(p) for p in ("def main(", "import os", "The quick", "x = 1")]
    arrivals = [0, 0, 3, 6]
    want = continuous_greedy(runtime.arena(4, 64), prompts, arrivals, 30)
    spy = LogitReads(monkeypatch)
    for graphs in (None, runtime.session):
        decoder = ArenaDecoder(runtime.session, runtime.manifest, 4, 64, graph_session=graphs)
        assert np.array_equal(continuous_greedy(decoder, prompts, arrivals, 30, ids_only=True), want)
    assert spy.rows == 0
    assert contract.read_manifest(tiny_model_dir).parity["problems"] == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("where", ["copied", "read in place"])
def test_a_mixed_step_reads_only_the_sampling_rows_logits(
    tiny_model_dir, tiny_float16_model_dir, monkeypatch, fixed, dtype, where
):
    """decode_picked(rows=[1]): every row's greedy token, and row 1's logits equal to what decode() gives
    from the same state: only that row read back where the step's buffer must be copied out (CUDA's way,
    the decoder's view of it taken away here), none on the host, where a float32 graph's rows are a
    read-only view of the step's own buffer."""
    runtime = OrtDecoder(tiny_model_dir if dtype == "float32" else tiny_float16_model_dir, threads=1)
    prompts = [encode(p) for p in ("def main(", "import os", "The quick")]
    a, b = (
        ArenaDecoder(runtime.session, runtime.manifest, 3, 64, graph_session=runtime.session if fixed else None)
        for _ in "ab"
    )
    if where == "copied":
        b.step_rows = None  # as on CUDA: Device.host_view has none
    tokens = a.prefill(0, prompts).argmax(-1)
    assert np.array_equal(b.prefill(0, prompts).argmax(-1), tokens)
    spy = LogitReads(monkeypatch)
    for _ in range(5):
        full = a.decode(tokens).copy()
        reads = spy.rows
        picked, logits = b.decode_picked(tokens, [1])
        assert spy.rows - reads == (1 if where == "copied" else 0)  # row 1 alone crossed, or none
        assert np.array_equal(picked, full.argmax(-1)) and np.array_equal(logits[1], full[1])
        in_place = logits.ctypes.data == b.step_logits.data_ptr()
        assert in_place == (where != "copied" and dtype == "float32") and logits.flags.writeable == (not in_place)
        tokens = picked


def test_a_run_larger_than_its_buffer_is_refused(tiny_model_dir):
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    decoder = ArenaDecoder(runtime.session, runtime.manifest, capacity=2, max_tokens=8)
    with pytest.raises(ValueError, match="exceeds the logits buffer"):
        decoder.prefill(0, [[1] * 9])


@pytest.mark.skipif(cuda_available(), reason="this onnxruntime has CUDA")
def test_cuda_without_a_cuda_onnxruntime_is_refused_in_one_line(tiny_float16_model_dir):
    """A float16 export may run on CUDA: what stops it here is this onnxruntime."""
    done = serve_on_cuda(tiny_float16_model_dir)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "attnserve serve: error: --provider cuda: this onnxruntime has no CUDAExecutionProvider "
        "(install onnxruntime-gpu)"
    ]


def test_a_float16_directory_is_served_end_to_end_on_the_cpu(tiny_float16_model_dir):
    manifest = contract.read_manifest(tiny_float16_model_dir)
    gated_on = "CUDAExecutionProvider" if cuda_available() else "CPUExecutionProvider"
    assert manifest.providers == ("cuda", "cpu") and manifest.parity["provider"] == gated_on
    prompts = ["def main(", "The quick brown fox"]
    want = OrtDecoder(tiny_float16_model_dir, threads=1).greedy([encode(p) for p in prompts], 40)  # EOS ignored
    running = start_server(tiny_float16_model_dir, provider="cpu")
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
        assert (info.dtype, info.execution_provider) == ("float16", "CPUExecutionProvider")
        for prompt, tokens in zip(prompts, want.tolist()):
            got = list(
                running.stub.Generate(pb.GenerateRequest(prompt=prompt, max_new_tokens=40), timeout=60).token_ids
            )
            assert got == tokens[: len(got)] and (len(got) == 40 or tokens[len(got)] == BYTE_IDS["eos_id"])
            assert len(got) > 1
    finally:
        running.stop()


def test_a_decode_step_binds_its_mask_again_after_a_one_token_run_used_its_binding(tiny_model_dir):
    """A one-token prompt prefilled into slot 0 has a one-slot decode step's shape, so it runs on that
    step's kept binding, with a mask one wide: the decode step after it must bind its own mask again
    though its width is the one it bound last."""
    runtime = OrtDecoder(tiny_model_dir, threads=1)
    prompts = [[72], [101]]
    alone = [continuous_greedy(runtime.arena(1, 64), [prompt], [0], 20)[0] for prompt in prompts]
    one_after_the_other = continuous_greedy(runtime.arena(1, 64), prompts, [0, 20], 20)
    assert np.array_equal(one_after_the_other, np.stack(alone))
