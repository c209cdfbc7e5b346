"""Overload against real servers over the tiny model: open-loop arrivals at 4x capacity keep the
queue bound, get fast RESOURCE_EXHAUSTED refusals, leave health answering and keep accepted
requests' first token within the queue's bound; 1,000 calls a second (scaled to the machine's speed)
beside a busy CPU end OK or RESOURCE_EXHAUSTED, never UNAVAILABLE; and a client that opens more streams than
--max-concurrent-streams and sends nothing holds at most that many, while others are served."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from fixtures_server import idle, in_flight, request, start_server, wait_until

from benchmarks.loadtest import bare_refusals

STREAM_LIMIT = 8
RATE = 1000  # calls a second: issue 46's, on the machine of docs/reports/refusals.md
BURNER_SHARE = 0.8 / (os.cpu_count() or 1)  # one busy CPU's worth, less a margin: the load of a burner
ROOT = Path(__file__).resolve().parents[1]  # benchmarks/ is run from the checkout's root


@pytest.mark.slow
@pytest.mark.alone
def test_four_times_capacity(tiny_model_dir, tmp_path):
    """4x the engine's capacity, kept below what the front end can refuse on a busy 2-core machine
    while it streams the accepted requests (README, Overload): past that the test measures that
    ceiling, not the queue. With 32-token requests 4x was 1,600 calls/s, with 96-token ones in a core
    process 850; with 120-token ones and --max-batch 4, 640 calls/s until the engine began holding a
    paced stream's tokens (f57a8a6): its capacity then measured 175-188 requests/s and 4x 700-750
    calls/s, refusals slowed past 100 ms and gRPC refused streams. Two slots instead of four: about
    135 requests/s of capacity, 530-540 calls/s at 4x (330-410 beside a CPU-burning process), until
    the engine core's cheaper text (31732cf) took it to 175-182 requests/s and 700-730 calls/s at 4x,
    where the accepted TTFT p99 came within 1-17% of its bound and one run in three went past it. One
    slot: 124-130 requests/s, about 510 calls/s at 4x, p99 84-112 ms against a 124-150 ms bound
    (beside a CPU-burning process 318-330 calls/s, 127-133 ms against 189-192)."""
    out = tmp_path / "overload.json"
    command = [sys.executable, "-m", "benchmarks.loadtest.overload", "--model", str(tiny_model_dir)]
    command += ["--factor", "4", "--duration", "6", "--capacity-seconds", "3", "--max-new-tokens", "120"]
    command += ["--serve-arg=--max-batch=1", "--serve-arg=--max-queue=8", "--serve-arg=--threads=1"]
    command += ["--out", str(out), "--plot", str(tmp_path / "o.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["checks"] == {
        "no_unexpected_statuses": True,
        "refusals_happened": True,
        "queue_bound_held": True,
        "health_always_serving": True,
        "accepted_ttft_p99_within_bound": True,
    }, {
        k: report[k]
        for k in (
            "statuses",
            "unexpected_examples",
            "max_queue_depth_seen",
            "health_failures",
            "accepted_ttft_ms",
            "ttft_bound_ms",
        )
    }
    assert done.returncode == 0
    assert report["max_queue_depth_seen"] <= 8 and report["refused"] > report["accepted"]
    assert report["refusal_ms"]["p50"] < report["accepted_ttft_ms"]["p50"]  # a refusal does not wait in line
    assert report["health_checks"] > 30


def busy_share(seconds: float = 1.0) -> float:
    """The share of all CPUs busy over the next `seconds` (/proc/stat)."""

    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    total, idle = ticks()
    time.sleep(seconds)  # a measurement over time, not a wait before acting
    total_after, idle_after = ticks()
    return 1 - (idle_after - idle) / max(total_after - total, 1)


@pytest.mark.slow
@pytest.mark.alone
def test_a_thousand_calls_a_second_end_ok_or_resource_exhausted_beside_a_busy_cpu(tiny_model_dir, tmp_path):
    """The call rate that broke (issue 46): Poisson arrivals of 1,000 short streams a second for 8 s,
    four slots and eight queue places, beside a CPU-burning process: one the test starts, unless the
    machine already has one's worth of load (a busy CI host: a second would be twice the scenario's,
    past what the front end can refuse on 2 cores, docs/reports/refusals.md). Every call ends OK or
    RESOURCE_EXHAUSTED: none gets gRPC's REFUSED_STREAM (UNAVAILABLE), which it answers once a
    connection holds more than --max-concurrent-streams calls the front end has not yet released.
    The queue bound holds and health answers SERVING. The accepted requests' TTFT bound is not
    checked here: at this rate the front end, not the queue, sets the first token's time
    (docs/reports/refusals.md).

    1,000 calls a second is the rate of the machine issue 46 was measured on. On a slower CPU (the
    machines vary) the same calls take more of a core, so the rate is scaled by what a refusal costs
    grpcio itself here, without attnserve (benchmarks/loadtest/bare_refusals.py: 172 us there): the
    machine is measured, not the code under test, whose own refusal cost the rate must not follow.

    The server runs with --core-nice 5, the setting for CPUs that are short under overload. With the
    core beside the front end, the four processes (burner, load generator, front end, core) split
    2 cores evenly, the front end's share is about what this rate needs, and grpc.aio, which takes
    one call of a method at a time through several turns of its event loop, now and then fell behind:
    calls waited in gRPC core for up to 3 s before any handler saw them (health checks on the same
    connection were answered in ms), and past 1,024 of them the connection refused streams. On the
    project's AMD EPYC that ended some calls UNAVAILABLE in 1 of 6 runs at the default, in each of
    two rounds, and in none of 12 with --core-nice 5 (docs/reports/core-nice.md)."""
    out = tmp_path / "rate.json"
    bare = bare_refusals.measure(seconds=3.0)
    rate = round(RATE * min(1.0, bare_refusals.REFERENCE_US / bare["us_per_call"]))
    command = [sys.executable, "-m", "benchmarks.loadtest.overload", "--model", str(tiny_model_dir)]
    command += ["--rate", str(rate), "--duration", "8", "--capacity-seconds", "2"]
    command += ["--serve-arg=--max-batch=4", "--serve-arg=--max-queue=8", "--serve-arg=--threads=1"]
    command += ["--serve-arg=--core-nice=5", "--out", str(out)]
    busy = busy_share()
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy < BURNER_SHARE else None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    beside = f"{busy:.0%} of the CPUs busy before, {'a burner started' if burner else 'no burner added'}"
    beside += f"; {rate} calls/s, a bare gRPC refusal {bare['us_per_call']} us here"
    assert set(report["statuses"]) == {"OK", "RESOURCE_EXHAUSTED"}, (
        beside,
        report["statuses"],
        report["unexpected_examples"],
    )
    checks = report["checks"]
    assert checks["queue_bound_held"] and checks["health_always_serving"], (checks, report["health_failures"])
    assert report["achieved_rate"] > 0.7 * rate and report["refused"] > report["accepted"]


@pytest.mark.slow
def test_attnserves_own_client_sends_each_call_once_under_overload(tiny_model_dir, tmp_path):
    """The same arrivals through attnserve's AsyncClient, retries on: every refusal is
    RESOURCE_EXHAUSTED, never retried, so the server's handlers see one call per call made."""
    out = tmp_path / "client.json"
    command = [sys.executable, "-m", "benchmarks.loadtest.overload", "--model", str(tiny_model_dir)]
    command += ["--rate", "400", "--duration", "3", "--capacity-seconds", "1", "--client", "attnserve"]
    command += ["--serve-arg=--max-batch=1", "--serve-arg=--max-queue=2", "--serve-arg=--threads=1"]
    command += ["--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["statuses"]) == {"OK", "RESOURCE_EXHAUSTED"}, report["unexpected_examples"]
    assert report["config"]["client"] == "attnserve" and report["calls_seen_per_call"] == 1.0


async def silent_streams(target: str, count: int, release: asyncio.Event):
    """`count` ModelStreamInfer calls on one connection that never send a request."""

    async def nothing():
        await release.wait()
        return
        yield  # an async generator that yields nothing

    channel = grpc.aio.insecure_channel(target)
    method = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    calls = [method(nothing(), timeout=60) for _ in range(count)]
    return channel, calls


async def until(predicate, what: str, timeout: float = 30) -> None:
    """wait_until on an event loop that must go on running meanwhile (the calls' client side)."""
    end = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


def test_silent_streams_are_capped_per_connection(tiny_model_dir):
    running = start_server(tiny_model_dir, max_concurrent_streams=STREAM_LIMIT, metrics_port=0)
    loop = asyncio.new_event_loop()
    try:
        release = asyncio.Event()
        channel, calls = loop.run_until_complete(silent_streams(running.target, 5 * STREAM_LIMIT, release))
        loop.run_until_complete(
            until(lambda: in_flight(running) == STREAM_LIMIT, f"{STREAM_LIMIT} silent streams in flight")
        )
        loop.run_until_complete(asyncio.sleep(0.5))  # an absence: the time the rest had to start, and did not
        assert in_flight(running) == STREAM_LIMIT  # the other 32 wait on the client's side
        # A well-behaved client on a connection of its own is served as usual.
        reply = running.stub.Generate(request("The ", max_new_tokens=8), timeout=30)
        assert reply.usage.completion_tokens == 8
        for call in calls:
            call.cancel()
        loop.run_until_complete(channel.close())
        wait_until(lambda: in_flight(running) == 0 and idle(running.engine), 30, "nothing in flight")
    finally:
        loop.close()
        running.stop()
