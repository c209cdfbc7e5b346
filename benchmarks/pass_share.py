"""How many of each request kind's rows the batched logits pass picks, and how many the host does.

A Server over --model in this process (the engine in a thread), --logits-pass as given; for each kind,
--requests requests of --new-tokens tokens at once, then the count of rows the runner's pass picked
(Sequence.take_pick) and those picked on the host (Sequence.pick: a request's first token, a row
the pass's head could not hold, a row the pass was not worth it for). Prints a table, then one
JSON object last. Torch-free.

    python -m benchmarks.pass_share --model models/NAME [--logits-pass on] [--requests 8] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
from collections.abc import Callable
from typing import Any

from attnserve.engine.domain import GenerationRequest, SamplingParams
from attnserve.engine.sequence import Sequence
from attnserve.server.app import Server
from attnserve.server.config import ServerConfig

KINDS: dict[str, dict[str, Any]] = {
    "temperature 0.8, top_p 0.95": dict(sampling=SamplingParams(temperature=0.8, top_p=0.95)),
    "temperature 0.7, top_p 0.9": dict(sampling=SamplingParams(temperature=0.7, top_p=0.9)),
    "temperature 1, top_k 50": dict(sampling=SamplingParams(temperature=1.0, top_k=50)),
    "temperature 1, min_p 0.1": dict(sampling=SamplingParams(temperature=1.0, min_p=0.1)),
    "greedy, logprobs 5": dict(logprobs=5),
    "ignore_eos": dict(ignore_eos=True),
}


def counting(counts: collections.Counter) -> None:
    """Count each row's side as the engine takes it."""
    for name, side in (("take_pick", "pass"), ("pick", "host")):
        real = getattr(Sequence, name)

        def counted(self: Sequence, row: Any, real: Callable[..., int] = real, side: str = side) -> int:
            counts[side] += 1
            return real(self, row)

        setattr(Sequence, name, counted)


async def run(model: str, mode: str, requests: int, new_tokens: int) -> dict:
    counts: collections.Counter = collections.Counter()
    counting(counts)
    config = ServerConfig(
        model=model, port=0, provider="cpu", max_batch=requests, engine_core="thread", logits_pass=mode
    )
    server = Server(config)
    rows = {}
    await server.start()
    try:
        prompt = tuple(server.tokenizer.encode_prompt("The list"))
        for name, fields in KINDS.items():
            counts.clear()
            handles = [
                server.engine.submit(GenerationRequest(f"{name} {i}", prompt, new_tokens, **fields))
                for i in range(requests)
            ]
            for handle in handles:
                while not (events := await handle.next_events()) or not getattr(events[-1], "usage", None):
                    pass
            rows[name] = {"pass": counts["pass"], "host": counts["host"]}
    finally:
        await server.stop()
    return {"model": model, "logits_pass": mode, "requests": requests, "new_tokens": new_tokens, "kinds": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--logits-pass", default="on", choices=("auto", "on", "off"), help="the server's --logits-pass")
    p.add_argument("--requests", type=int, default=8, help="requests of each kind, at once")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per request, at most")
    args = p.parse_args(argv)
    result = asyncio.run(run(args.model, args.logits_pass, args.requests, args.new_tokens))
    for name, row in result["kinds"].items():
        share = row["pass"] / max(1, row["pass"] + row["host"] - args.requests)  # each first token is the host's
        print(f"{name:<30} pass {row['pass']:>6}  host {row['host']:>6}  pass share after the first token {share:.3f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
