"""The CUDA path on a CUDA host (issue 23; `make gpu-check` runs these): the session really on
CUDAExecutionProvider, the arena and a run's inputs on the device and staying there, no Memcpy
node in ONNX Runtime's profile of prefill and decode, float16 and bfloat16 exports gated on the
GPU, and a float16 directory served through gRPC decoding what the arena's own greedy loop
decodes. Skipped without onnxruntime-gpu and a device; tests/test_cuda_path.py proves on the CPU
what can be proven there."""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fixtures_server import request, start_server

from attnserve.export.onnx_export import export_checkpoint
from attnserve.runtime import contract
from attnserve.runtime.arena import Device
from attnserve.runtime.arena_decoder import ArenaDecoder
from attnserve.runtime.cuda_runtime import CudaRuntime
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.runtime.ort_decoder import OrtDecoder, continuous_greedy
from attnserve.runtime.ort_session import CUDA, cuda_available, session_options
from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs onnxruntime-gpu and a CUDA device"),
]
TIMEOUT = 120
COMPUTE_OPS = ("GroupQueryAttention", "MatMul", "Gemm", "Softmax", "LayerNormalization", "Gelu", "Add", "Mul", "ArgMax")


@pytest.fixture(scope="module")
def bfloat16_dir(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "tiny-bfloat16"
    export_checkpoint(tiny_checkpoint, out, dtype="bfloat16")
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_exports_pass_their_gate_on_the_gpu(dtype, tiny_float16_model_dir, bfloat16_dir):
    manifest = contract.read_manifest(tiny_float16_model_dir if dtype == "float16" else bfloat16_dir)
    report = manifest.parity
    assert (manifest.dtype, report["provider"], report["passed"]) == (dtype, CUDA, True)
    assert all(row["agreeing_steps"] == 64 or row["excused_near_tie"] for row in report["greedy"]["rows"])


@pytest.mark.parametrize("provider", ["cuda", "auto"])
def test_the_session_really_runs_on_cuda(tiny_float16_model_dir, provider):
    runner = ModelSessions(tiny_float16_model_dir, provider, threads=1)
    assert (runner.provider, runner.provider_note) == (CUDA, "")


def test_a_float32_arena_never_runs_on_cuda(tiny_model_dir):
    runner = ModelSessions(tiny_model_dir, "auto", threads=1)
    assert runner.provider == "CPUExecutionProvider"
    assert "float32 arena export, which CUDA cannot run" in runner.provider_note


def profiled_decoder(model_dir, tmp_path):
    """An ArenaDecoder over a CUDA session that writes ONNX Runtime's profile."""
    runtime = OrtDecoder(model_dir, provider="cuda")
    options = session_options(1)
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    stream = CudaRuntime().create_stream()
    session = ort.InferenceSession(
        str(model_dir / contract.MODEL_FILE),
        options,
        providers=[(CUDA, {"device_id": "0", "user_compute_stream": str(stream)}), "CPUExecutionProvider"],
    )
    return session, ArenaDecoder(session, runtime.manifest, capacity=4, max_tokens=64), runtime


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_and_decode_run_every_node_with_no_memcpy(dtype, tiny_float16_model_dir, bfloat16_dir, tmp_path):
    model_dir = tiny_float16_model_dir if dtype == "float16" else bfloat16_dir
    session, decoder, runtime = profiled_decoder(model_dir, tmp_path)
    prompts = [[72, 101, 108, 108, 111], [87, 111, 114]]
    tokens = decoder.prefill(0, prompts).argmax(-1)
    got = []
    for step in range(16):  # steps with logits, then steps bringing back only the graph's greedy tokens
        got.append(tokens)
        tokens = decoder.decode(tokens).argmax(-1) if step < 8 else decoder.decode_greedy(tokens)
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    assert nodes, "the profile recorded no node"
    copies = sorted({e["name"] for e in nodes if "Memcpy" in e["name"] or "Memcpy" in e["args"].get("op_name", "")})
    assert copies == [], f"Memcpy nodes on the decode path: {copies}"
    on_cpu = sorted({e["args"]["op_name"] for e in nodes if e["args"].get("provider") == "CPUExecutionProvider"})
    heavy = [op for op in on_cpu if op in COMPUTE_OPS]
    assert heavy == [], f"compute placed on the CPU: {on_cpu}"
    assert np.array_equal(np.stack(got, 1), runtime.greedy(prompts, 16))


class CacheReadSpy:
    """Counts device-to-host reads (Device.read is the only one) of addresses inside the arenas'
    buffers; a CUDA-graph step's logits are read too, and are not the cache."""

    def __init__(self, monkeypatch):
        self.arenas: list = []
        self.cache_reads = self.other_reads = 0
        original = Device.read

        def counting(device, address, out):
            inside = any(
                b.data_ptr() <= address < b.data_ptr() + a.capacity * a.slot_bytes
                for a in self.arenas
                for b in a.buffers
            )
            self.cache_reads += inside
            self.other_reads += not inside
            return original(device, address, out)

        monkeypatch.setattr(Device, "read", counting)


def test_a_float16_directory_served_on_cuda_keeps_its_cache_on_the_device(tiny_float16_model_dir, monkeypatch):
    spy = CacheReadSpy(monkeypatch)
    prompts = ["def main(", "The quick brown fox", "import os"]
    running = start_server(
        tiny_float16_model_dir, provider="cuda", max_batch=2
    )  # three requests through two slots: a move
    try:
        slots = running.engine.slots
        arena = slots.decoder.arena
        spy.arenas.append(arena)
        assert slots.decoder.fixed is not None, "decode steps replayed as CUDA graphs by default"
        assert arena.device.kind == "cuda" and arena.device.stream
        on_gpu = lambda values: all(v.device_name().lower() == "cuda" for v in values)
        assert on_gpu(arena.buffers) and on_gpu(slots.decoder.inputs.buffers.values())
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
        assert (info.execution_provider, info.dtype) == (CUDA, "float16")
        replies = [running.stub.Generate.future(request(p, max_new_tokens=64), timeout=TIMEOUT) for p in prompts]
        got = [list(r.result().token_ids) for r in replies]
    finally:
        running.stop()
    assert spy.cache_reads == 0 and spy.other_reads > 0, "the server read the cache back to the host"
    want = OrtDecoder(tiny_float16_model_dir, provider="cuda").greedy([encode(p) for p in prompts], 64).tolist()
    for tokens, reference in zip(got, want):
        assert tokens == reference[: len(tokens)] and len(tokens) > 1


def test_an_encoder_decoder_keeps_both_arenas_on_the_device(tiny_seq2seq_checkpoint, tmp_path):
    export_checkpoint(tiny_seq2seq_checkpoint, tmp_path / "s2s", dtype="float16")
    running = start_server(tmp_path / "s2s", provider="cuda")
    try:
        decoder = running.engine.slots.decoder  # self-attention arena and cross segment
        on_gpu = lambda values: values and all(v.device_name().lower() == "cuda" for v in values)
        assert on_gpu(decoder.arena.buffers) and on_gpu(decoder.cross.buffers)
        reply = running.stub.Generate(request("98765", max_new_tokens=20), timeout=TIMEOUT)
        assert reply.finish_reason != pb.FINISH_REASON_UNSPECIFIED and reply.usage.completion_tokens > 0
    finally:
        running.stop()


@pytest.mark.parametrize("graphs", [True, False])
def test_decode_steps_replayed_as_cuda_graphs_decode_what_the_plain_steps_decode(tiny_float16_model_dir, graphs):
    """Requests joining and leaving a continuous batch (every batch size its own graph, slots refilled
    by moves): the tokens of the plain decode path, with --no-cuda-graphs as the control."""
    runner = ModelSessions(tiny_float16_model_dir, "cuda", threads=1, cuda_graphs=graphs)
    assert (runner.graph_session is not None) == graphs
    decoder = ArenaDecoder(runner.session, runner.manifest, 6, 64, graph_session=runner.graph_session)
    prompts = [encode(p) for p in ("def main(", "import os", "The quick", "x = 1", "for i in", "class A:")]
    arrivals = [0, 0, 2, 5, 9, 9]
    plain = OrtDecoder(tiny_float16_model_dir, provider="cuda")
    want = continuous_greedy(plain.arena(6, 64), prompts, arrivals, 48)
    assert np.array_equal(continuous_greedy(decoder, prompts, arrivals, 48), want)
    fresh = ArenaDecoder(runner.session, runner.manifest, 6, 64, graph_session=runner.graph_session)
    assert np.array_equal(continuous_greedy(fresh, prompts, arrivals, 48, ids_only=True), want)  # only ids back


@pytest.mark.parametrize("graphs", [True, False])
def test_run_ahead_on_cuda_decodes_the_steps_without(tiny_float16_model_dir, graphs):
    """A burst's steps on the run-ahead thread (CUDA graphs replayed from it, or node by node): each
    step's tokens those of a twin runner without run-ahead, and the slots where they should be."""
    from test_run_ahead import bursts_both_ways

    seen = bursts_both_ways(ModelSessions(tiny_float16_model_dir, "cuda", threads=1, cuda_graphs=graphs))
    assert seen[True] == seen[False] and len(seen[True]) == 9


def test_a_mixed_step_on_cuda_reads_the_sampling_rows_logits_exactly(tiny_float16_model_dir):
    """Two servers' decoders (CUDA graphs on): decode_picked(rows=[1]) gives every row's greedy token
    and row 1's logits equal to a full decode's from the same state."""
    a, b = (open_slot_runner(ModelSessions(tiny_float16_model_dir, "cuda", threads=1), 3, 64).decoder for _ in "ab")
    prompts = [encode(p) for p in ("def main(", "import os", "The quick")]
    tokens = a.prefill(0, prompts).argmax(-1)
    assert np.array_equal(b.prefill(0, prompts).argmax(-1), tokens)
    for _ in range(8):
        full = a.decode(tokens).copy()
        picked, logits = b.decode_picked(tokens, [1])
        assert np.array_equal(picked, full.argmax(-1)) and np.array_equal(logits[1], full[1])
        tokens = picked


def test_the_logits_pass_on_cuda_picks_as_the_oracle_whatever_its_batch():
    """The batched logits pass on CUDA, the step's logits bound on the device: peaked rows through the
    narrow and wide graphs (some masked by a grammar first) and flat ones through the nucleus graph,
    each drawn where the oracle's kept distribution puts its uniform number, with the oracle's top ids;
    each row's pick the same alone as among the others (the nucleus's sums are exact, whatever order
    CUDA's atomic adds take)."""
    from test_logits_pass import assert_drawn_at, flat_plans, plans, random_rows

    from attnserve.engine.sampling import log_softmax, processed_row
    from attnserve.runtime.logits_pass import LogitsPass

    rng = np.random.default_rng(21)
    vocab = 50_257
    peaked = random_rows(rng, 16, vocab)
    flat, flat_plan = flat_plans(rng, rng.normal(0, 1, (16, vocab)))
    rows, plan = np.concatenate([peaked, flat]), [*plans(rng, 16, vocab), *flat_plan]
    device = Device("cuda", 0, CudaRuntime().create_stream())
    cuda_pass = LogitsPass("float32", device, threads=1, mode="auto")
    on_device = lambda chosen: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(rows[chosen, None, :]), "cuda", 0)
    together = cuda_pass.run(on_device(list(range(32))), list(range(32)), plan)
    assert sum(pick is not None for pick in together) >= 28
    for i, pick in enumerate(together):
        assert cuda_pass.run(on_device([i]), [0], [plan[i]])[0] == pick, i
        if pick is None:
            continue
        if plan[i].temperature > 0:
            assert_drawn_at(rows[i], plan[i], pick.token, tolerance=1e-5)
        else:
            assert pick.token == int(np.argmax(processed_row(rows[i], plan[i])))
        expected = log_softmax(processed_row(rows[i], plan[i]))
        assert [t for t, _ in pick.top] == [int(t) for t in np.argsort(-expected, kind="stable")[: plan[i].top]], i
