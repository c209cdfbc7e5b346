"""The machine's cost of a gRPC refusal, without attnserve: a bare grpc.aio server whose one method,
attnserve.v1's GenerateStream path, only ends each call RESOURCE_EXHAUSTED, called by --callers
closed-loop callers on --connections channels (as benchmarks/loadtest/refusals.py calls a real server);
its process's CPU time (/proc/PID/stat) divided by the calls it ended.

What grpcio's own refusal costs on a machine is what the overload test scales its call rate by
(tests/test_overload.py): the rate that tests issue 46's scenario on the machine its report was measured
on, where this cost was REFERENCE_US, becomes rate * REFERENCE_US / (this machine's cost) on a slower one.

    python -m benchmarks.loadtest.bare_refusals [--seconds 3] [--callers 64] [--connections 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import grpc

from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc
from benchmarks.loadtest.refusals import knock
from benchmarks.loadtest.server_process import cpu_seconds

# The bare refusal's CPU time on the 2-vCPU Sapphire Rapids machine of docs/reports/refusals.md (172 us
# there, with attnserve's front end at 207 us a refusal), where 1,000 calls a second is issue 46's rate.
REFERENCE_US = 172.0


async def serve() -> None:
    """The bare server: print the port, then refuse every call until killed."""

    async def refuse(_request: bytes, context: grpc.aio.ServicerContext):
        context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
        context.set_details("the queue is full")
        return
        yield  # an async generator: a server-streaming method's shape

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 1024)])
    handler = grpc.unary_stream_rpc_method_handler(refuse)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                pb.DESCRIPTOR.services_by_name["TextGeneration"].full_name, {"GenerateStream": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def drive(target: str, pid: int, seconds: float, callers: int, connections: int) -> dict:
    channels = [grpc.aio.insecure_channel(target) for _ in range(connections)]
    stubs = [pb_grpc.TextGenerationStub(channel) for channel in channels]
    stop, codes = asyncio.Event(), Counter[str]()
    tasks = [asyncio.create_task(knock(stubs[i % connections], stop, codes, 64)) for i in range(callers)]
    await asyncio.sleep(0.5)  # warm-up
    before, cpu_before, start = sum(codes.values()), cpu_seconds(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    calls, cpu, elapsed = sum(codes.values()) - before, cpu_seconds(pid) - cpu_before, time.perf_counter() - start
    stop.set()
    await asyncio.gather(*tasks)
    for channel in channels:
        await channel.close()
    return {
        "calls": calls,
        "statuses": dict(codes),
        "calls_per_s": round(calls / elapsed, 1),
        "us_per_call": round(1e6 * cpu / calls, 1) if calls else None,
        "reference_us": REFERENCE_US,
    }


def measure(seconds: float = 3.0, callers: int = 64, connections: int = 4) -> dict:
    """The bare server in a process of its own, refused at for `seconds`: its CPU time a call."""
    server = subprocess.Popen(
        [sys.executable, "-m", __spec__.name if __spec__ else __name__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        return asyncio.run(drive(f"127.0.0.1:{port}", server.pid, seconds, callers, connections))
    finally:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help="be the bare server (the measuring process starts it)")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--callers", type=int, default=64)
    p.add_argument("--connections", type=int, default=4)
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    print(json.dumps(measure(args.seconds, args.callers, args.connections)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
