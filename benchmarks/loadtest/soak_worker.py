"""One soak client process: K streams, each a loop of requests that behave well or badly.

Run by soak.py (`python -m benchmarks.loadtest.soak_worker`), which may SIGKILL it mid-stream.
Every request picks a behavior by weight; each behavior has the status codes it may end with, and
anything else is unexpected. One JSON line per finished request goes to stdout. grpcio and the
generated protos only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import grpc

from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

OK, CANCELLED, DEADLINE = "OK", "CANCELLED", "DEADLINE_EXCEEDED"
# behavior -> (weight, the codes it may end with)
BEHAVIORS: dict[str, tuple[float, frozenset[str]]] = {
    "complete": (0.55, frozenset({OK})),  # a stream read to its end
    "unary": (0.10, frozenset({OK})),  # Generate
    "cancel": (0.15, frozenset({CANCELLED, OK})),  # cancelled at a random message, unless it ended first
    "deadline": (0.10, frozenset({OK, DEADLINE})),  # a stream whose deadline is likely to pass first
    "malformed": (0.05, frozenset({"INVALID_ARGUMENT"})),  # bytes that are not a GenerateRequest
    "invalid": (0.05, frozenset({"INVALID_ARGUMENT"})),  # a field beyond its limit
}
PROMPTS = ["The ", "def main(", "import ", "Return the ", "class ", "# ", "for i in ", "A"]
MALFORMED = (b"\x0a\x05ab", b"\x08\xff", b"\x0c", b"\x0a\x02\xff\xfe")
TIMEOUT = 120.0


def expected(behavior: str) -> frozenset[str]:
    return BEHAVIORS[behavior][1]


async def stream(stub, request: pb.GenerateRequest, record: dict, timeout: float, cancel_after: int | None) -> None:
    """Read a stream; TTFT and the gaps between token-carrying messages go into `record`."""
    start = last = time.perf_counter()
    call = stub.GenerateStream(request, timeout=timeout)
    received = 0
    async for message in call:
        now = time.perf_counter()
        if message.token_ids:
            if record["ttft"] is None:
                record["ttft"] = now - start
            else:
                record["gaps"].append(round(now - last, 6))
            last = now
            record["tokens"] += len(message.token_ids)
        received += 1
        if cancel_after is not None and received >= cancel_after:
            call.cancel()
            raise asyncio.CancelledError  # what a cancelled call raises to the reader on its next message


async def one(channel: grpc.aio.Channel, stub, rng: random.Random, max_new_tokens: int) -> dict:
    """Send one request with a random behavior; its record."""
    names = list(BEHAVIORS)
    behavior = rng.choices(names, weights=[BEHAVIORS[n][0] for n in names])[0]
    request = pb.GenerateRequest(prompt=rng.choice(PROMPTS), max_new_tokens=rng.randint(8, max_new_tokens))
    record: dict = {"behavior": behavior, "code": OK, "ttft": None, "gaps": [], "tokens": 0}
    try:
        if behavior == "complete":
            await stream(stub, request, record, TIMEOUT, None)
        elif behavior == "cancel":
            await stream(stub, request, record, TIMEOUT, rng.randint(1, 8))
        elif behavior == "deadline":
            await stream(stub, request, record, rng.uniform(0.01, 0.3), None)
        elif behavior == "unary":
            reply = await stub.Generate(request, timeout=TIMEOUT)
            record["tokens"] = len(reply.token_ids)
        elif behavior == "malformed":
            raw = channel.unary_stream("/attnserve.v1.TextGeneration/GenerateStream")
            async for _ in raw(rng.choice(MALFORMED), timeout=TIMEOUT):
                pass
        else:
            request.max_new_tokens = 0
            await stub.Generate(request, timeout=TIMEOUT)
    except asyncio.CancelledError:
        record["code"] = CANCELLED
    except grpc.aio.AioRpcError as error:
        record["code"] = error.code().name
        record["details"] = (error.details() or "")[:200]
    return record


async def loop(target: str, seed: int, max_new_tokens: int, until: float) -> None:
    """One stream slot: requests back to back until `until` (time.time())."""
    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TextGenerationStub(channel)
        while time.time() < until:
            record = await one(channel, stub, rng, max_new_tokens)
            record["end"] = time.time()
            print(json.dumps(record, separators=(",", ":")), flush=True)


async def run(args: argparse.Namespace) -> None:
    await asyncio.gather(
        *(loop(args.target, args.seed * 1000 + i, args.max_new_tokens, args.until) for i in range(args.streams))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--until", type=float, required=True, help="time.time() after which no request starts")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
