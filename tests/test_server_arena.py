"""The in-place KV arena under the real server: greedy equals PyTorch in a ragged continuous batch
of requests arriving at different steps, no slot's tokens change when others come and go, rows
that hold nothing are never read, no step or admission copies the whole cache, and a long prompt
prefilled in chunks decodes like one prefill."""

import ctypes
import itertools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from fixtures_server import idle, request, staggered, start_server, wait_until
from fixtures_train import BYTE_IDS

from attnserve.model.generate import generate
from attnserve.runtime.arena import Device
from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

TIMEOUT = 60
PROMPTS = [
    "a",
    "The server",
    "def f(x):\n    return x",
    "Left padding with a correct attention mask",
    "x" * 40,
    "import os\nimport sys\n",
    "Καλημέρα κόσμε",
    "attnserve",
    "ONNX Runtime",
    "0123456789" * 3,
]


@dataclass(frozen=True)
class CountingDevice(Device):
    """The CPU device, recording the bytes of every copy the arena makes (a spy on its only move)."""

    copies: list = None

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        self.copies.append(width * rows)
        super().copy_rows(dst, dst_pitch, src, src_pitch, width, rows)


def fill_with_nan(arena) -> None:
    """A sentinel in every row: a run that read a position nobody wrote would give NaN logits."""
    for buffer in arena.buffers:
        count = int(np.prod(arena.shape))
        view = np.ctypeslib.as_array((ctypes.c_float * count).from_address(buffer.data_ptr()))
        view[:] = np.nan


@pytest.fixture(scope="module")
def arena_server(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=6, prefill_chunk=16)
    arena = running.engine.slots.decoder.arena
    copies: list[int] = []
    arena.device = CountingDevice("cpu", 0, copies=copies)
    fill_with_nan(arena)
    yield running, arena, copies
    running.stop()


def test_ragged_continuous_batch_arriving_at_different_steps_equals_pytorch_alone(arena_server, reference_model):
    running, arena, copies = arena_server
    reqs = [request(p, max_new_tokens=64 + 5 * (i % 3)) for i, p in enumerate(PROMPTS)]
    calls = [partial(running.stub.Generate, req, timeout=TIMEOUT) for req in reqs]
    replies = staggered(running, calls, steps_apart=8)  # request i arrives while earlier ones decode
    wait_until(lambda: idle(running.engine), what="the arena server to go idle")
    for prompt, req, reply in zip(PROMPTS, reqs, replies):
        assert (
            list(reply.token_ids) == generate(reference_model, [encode(prompt)], req.max_new_tokens, **BYTE_IDS)[0]
        ), prompt
    assert max(running.server.metrics.step_batch._sum.get(), 0) > 0
    slot_bytes = arena.slot_bytes * len(arena.buffers)
    assert copies, "10 requests through 6 slots: some slot must have been refilled by a move"
    assert max(copies) <= arena.slot_bytes  # one slot of one buffer per copy, its used positions only
    assert sum(copies) <= len(reqs) * slot_bytes < 2 * arena.nbytes  # at most one slot per retirement


def test_decode_and_admission_copy_nothing(arena_server):
    """A request alone decodes and retires from slot 0: the arena never copies a byte."""
    running, _, copies = arena_server
    before = len(copies)
    reply = running.stub.Generate(request("alone here", max_new_tokens=30), timeout=TIMEOUT)  # within a chunk
    assert reply.usage.completion_tokens == 30 and len(copies) == before


def test_retiring_and_admitting_leave_a_running_request_untouched(arena_server, reference_model):
    running, _, _ = arena_server
    pacer, engine = running.pacer, running.engine
    long_req = request("A long-running request", max_new_tokens=90)
    alone = lambda: engine.stats() == {"active": 1, "queued": 0}
    pacer.hold()
    with ThreadPoolExecutor(6) as pool:
        long_reply = pool.submit(running.stub.Generate, long_req, timeout=TIMEOUT)
        for wave in range(3):  # short requests join and leave around it, the engine held between waves
            wait_until(pacer.held.is_set, what=f"the long request alone before wave {wave}")
            accepted = pacer.submitted
            shorts = [
                pool.submit(running.stub.Generate, request(p, max_new_tokens=5 + wave), timeout=TIMEOUT)
                for p in PROMPTS[:4]
            ]
            wait_until(lambda a=accepted: pacer.submitted == a + 4, what=f"wave {wave} to queue")
            pacer.release(until=alone if wave < 2 else None)
            [s.result() for s in shorts]
        got = long_reply.result()
    assert list(got.token_ids) == generate(reference_model, [encode("A long-running request")], 90, **BYTE_IDS)[0]


def test_prompt_near_the_context_prefilled_in_chunks_equals_one_prefill(tiny_model_dir, arena_server, reference_model):
    chunked, _, _ = arena_server  # --prefill-chunk 16: a 120-token prompt takes 8 runs
    whole = start_server(tiny_model_dir, max_batch=2, prefill_chunk=256)
    try:
        prompt = ("The quick brown fox jumps over the lazy dog. " * 3)[:119]
        req = request(prompt, max_new_tokens=7)
        a, b = chunked.stub.Generate(req, timeout=TIMEOUT), whole.stub.Generate(req, timeout=TIMEOUT)
    finally:
        whole.stop()
    assert len(encode(prompt)) == 120
    assert list(a.token_ids) == list(b.token_ids) == generate(reference_model, [encode(prompt)], 7, **BYTE_IDS)[0]


def test_a_long_prompt_is_prefilled_one_chunk_per_decode_step(arena_server):
    """While a 110-token prompt is prefilled in 16-token chunks, the running batch decodes a step
    between every two chunks: it is delayed by at most one chunk per step."""
    running, _, _ = arena_server
    slots = running.engine.slots
    timeline: list[str] = []
    real_chunk, real_decode = slots._prefill_chunk, slots.decode
    slots._prefill_chunk = lambda: (timeline.append("chunk"), real_chunk())[1]
    slots.decode = lambda next_ids, sampled=None, passes=None, bans=None: (
        timeline.append("decode"),
        real_decode(next_ids, sampled, passes, bans),
    )[1]
    # The engine holds while the long prompt arrives, so that the 100-token stream is still decoding
    # on any machine (unpaced, it once ended first, and the chunks then ran back to back).
    running.pacer.hold(when=lambda: running.engine.stats()["active"] == 1)
    try:
        stream = running.stub.GenerateStream(request("tick", max_new_tokens=100), timeout=TIMEOUT)
        next(stream)
        long_prompt = running.stub.Generate.future(request("y" * 110, max_new_tokens=2), timeout=TIMEOUT)
        wait_until(lambda: running.engine.stats()["queued"] == 1, what="the long prompt to queue")
        assert running.pacer.held.is_set()
        running.pacer.release()
        long_prompt.result(timeout=TIMEOUT)
        list(stream)
    finally:
        slots._prefill_chunk, slots.decode = real_chunk, real_decode
        running.pacer.reset()
    chunks = [i for i, event in enumerate(timeline) if event == "chunk"]
    assert len(chunks) == 7  # 111 tokens (BOS included) in chunks of 16
    assert all(timeline[a + 1 : b] == ["decode"] for a, b in itertools.pairwise(chunks)), timeline


SLOT_BYTES = 2 * 2 * 4 * 128 * 16 * 4  # tiny: 2 layers x (key, value) x 4 heads x 128 positions x 16 x fp32


def test_max_batch_auto_fills_the_kv_cache_memory_and_reports_it(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=0, kv_cache_memory=1_000_000, metrics_port=0)
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
        assert info.limits.max_batch_size == 1_000_000 // SLOT_BYTES == 7
        assert (info.kv_cache, info.kv_cache_bytes) == ("arena", 7 * SLOT_BYTES)
        assert running.server.metrics.kv_cache_bytes._value.get() == 7 * SLOT_BYTES
        with ThreadPoolExecutor(9) as pool:  # more requests than slots: they queue, nothing is lost
            replies = list(
                pool.map(lambda p: running.stub.Generate(request(p, max_new_tokens=8), timeout=TIMEOUT), PROMPTS[:9])
            )
        assert all(r.usage.completion_tokens == 8 for r in replies)
    finally:
        running.stop()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--max-batch", "64", "--kv-cache-memory", "1M"],
            f"--max-batch 64 needs a {64 * SLOT_BYTES:,}-byte KV arena ({SLOT_BYTES:,} per slot), "
            "more than --kv-cache-memory 1,000,000",
        ),
        (
            ["--max-batch", "auto", "--kv-cache-memory", "100K"],
            f"--kv-cache-memory 100,000 bytes holds no slot: one slot of 128 positions needs {SLOT_BYTES:,} bytes",
        ),
        (["--max-batch", "auto"], "--max-batch auto needs --kv-cache-memory BYTES (the arena's budget)"),
    ],
)
def test_a_kv_arena_that_does_not_fit_is_refused_at_start_up(tiny_model_dir, flags, message):
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "serve", "--model", str(tiny_model_dir), "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"attnserve serve: error: {message}"


def test_a_concat_directory_is_refused_with_the_command_that_re_exports_it(tiny_concat_model_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "serve", "--model", str(tiny_concat_model_dir), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"attnserve serve: error: {tiny_concat_model_dir} was exported with the concat KV "
        "cache, which attnserve serve no longer runs; export its checkpoint again: "
        "attnserve export CHECKPOINT --out DIR"
    )


def test_sizes_and_batch_flags_parse_like_the_readme_says():
    from attnserve.server.config import parse_bytes, parse_max_batch

    assert [parse_bytes(t) for t in ("1000000", "512M", "1.5G", "256Mi", "2GiB", "100K")] == [
        1_000_000,
        512_000_000,
        1_500_000_000,
        256 * 2**20,
        2 * 2**30,
        100_000,
    ]
    assert (parse_max_batch("auto"), parse_max_batch("16")) == (0, 16)
    for bad in ("12Q", "lots", ""):
        with pytest.raises(ValueError, match="is not a size"):
            parse_bytes(bad)
    for bad in ("0", "-3", "many"):
        with pytest.raises(ValueError, match="at least 1"):
            parse_max_batch(bad)


def test_greedy_unary_calls_decode_in_bursts_that_give_what_pytorch_and_a_stream_give(arena_server, reference_model):
    """Concurrent unary greedy calls (nobody needs a token before the end) run their decode steps in
    bursts, the graph's greedy token fed back to the next step, and decode what PyTorch decodes and
    what a stream (one step at a time, a message per token) decodes."""
    running, _, _ = arena_server
    slots = running.engine.slots
    bursts: list[int] = []
    real = slots.decode_steps

    def counted(next_ids, steps, enough, bans=None, ahead=False, draws=None):
        ran = real(next_ids, steps, enough, bans, ahead, draws)
        bursts.append(ran)
        return ran

    slots.decode_steps = counted
    reqs = [request(p, max_new_tokens=24 + 5 * i) for i, p in enumerate(PROMPTS[:6])]
    try:
        with ThreadPoolExecutor(len(reqs)) as pool:
            unary = list(pool.map(lambda r: running.stub.Generate(r, timeout=TIMEOUT), reqs))
    finally:
        slots.decode_steps = real
    assert bursts and max(bursts) > 1, bursts
    for prompt, r, reply in zip(PROMPTS, reqs, unary):
        streamed = [t for m in running.stub.GenerateStream(r, timeout=TIMEOUT) for t in m.token_ids]
        expected = generate(reference_model, [encode(prompt)], r.max_new_tokens, **BYTE_IDS)[0]
        assert list(reply.token_ids) == streamed == expected, prompt
