"""Where a decode step's time goes, by request kind: the engine over the server's arena runner in one process
(no gRPC, no front end), each piece of a step timed where it runs.

The engine core's model is loaded as `attnserve serve` loads it (core/loading.py: the same session options,
spinning and logits pass); requests of each kind (as benchmarks.sampling_kinds sends them: greedy, ignore_eos,
top_p, top_k, logprobs, repetition) run `--streams` at a time (engine_cost's prompts: 16 ordinary ids each),
`--new-tokens` each, the kinds alternating in rounds after a warm-up round. Named pieces (PIECES: the
model's runs, the burst's rows and picks on the host, the compiled draws) are timed by wrapping them, so
each piece's time includes the pieces it calls. Reported per kind: the medians over rounds of each piece's
microseconds a decode step, "outside the model's runs" (everything but the model's own runs: the engine's
Python, the picks, the draws), and each kind's step time against greedy's. A probe for the host's share
of a step; the served ratios are sampling_kinds'.

    python -m benchmarks.step_pieces --model runs/ladder/models/gpt2-124m-int8 --streams 1,16 \\
        --kinds greedy,top_p,top_k,logprobs,repetition --rounds 5 [--run-ahead off] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from attnserve.core.config import CoreConfig
from attnserve.core.loading import load_model
from attnserve.engine import burst, sequence, whole_draw
from attnserve.engine.domain import GenerationRequest, SamplingParams
from attnserve.engine.engine import Engine, EngineLimits
from attnserve.report_stamp import Stamp, write_report
from attnserve.runtime import arena_decoder, arena_runner
from benchmarks.engine_cost import prompts, read_request

# each kind's request, as benchmarks.sampling_kinds sends it (its seed: the stream's place)
KINDS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "ignore_eos": {"ignore_eos": True},
    "top_p": {"sampling": {"temperature": 0.8, "top_p": 0.95}},
    "top_k": {"sampling": {"temperature": 1.0, "top_k": 50}},
    "logprobs": {"logprobs": 5},
    "repetition": {"sampling": {"temperature": 0.7, "repetition_penalty": 1.1}},
}

# (owner, attribute, label): the pieces timed, each wrapped where the engine calls it
PIECES = (
    (arena_runner.ArenaRunner, "_greedy", "greedy step (runner)"),
    (arena_runner.ArenaRunner, "_drawn", "drawn step (runner)"),
    (arena_decoder.ArenaDecoder, "decode_passed", "model run and pass (decoder)"),
    (burst.BurstDraws, "rows", "step's PassRows"),
    (burst.BurstDraws, "pick_on_host", "picks on the host"),
    (sequence.Sequence, "draw", "a row picked alone"),
    (burst.Burst, "step", "tokens taken"),
    (whole_draw, "draw_logits", "compiled draw (a row)"),
    (whole_draw, "draw_processed", "compiled draw (a penalized or banning row)"),
    (whole_draw, "draws_logits", "compiled draws (rows together)"),
    (whole_draw, "top_k", "compiled top-k draw"),
    (whole_draw, "scores", "compiled greedy logprobs"),
)
MODEL_RUNS = "the model's runs"
OUTSIDE = "outside the model's runs"


class Timers:
    """Seconds spent in each wrapped piece since the last clear()."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.wrapped: list[tuple[Any, str, Callable[..., Any]]] = []  # (owner, name, the original)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """`owner.name` timed under `label` (a module's function: where it is looked up at each call)."""
        inner: Callable[..., Any] = getattr(owner, name)
        seconds = self.seconds

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[label] += time.perf_counter() - start

        self.wrapped.append((owner, name, inner))
        setattr(owner, name, timed)

    def clear(self) -> None:
        self.seconds.clear()

    def unwrap(self) -> None:
        """Every wrapped piece its original again (a module's functions outlive a measurement)."""
        for owner, name, inner in reversed(self.wrapped):
            setattr(owner, name, inner)
        self.wrapped.clear()


def request(kind: str, place: int, prompt: list[int], new_tokens: int) -> GenerationRequest:
    """Stream `place`'s request of `kind` with its prompt; its place is its seed where it samples."""
    spec = KINDS[kind]
    sampling = dict(spec.get("sampling", {}))
    if sampling:
        sampling["seed"] = place
    return GenerationRequest(
        "step-pieces",
        tuple(prompt),
        new_tokens,
        SamplingParams(**sampling),
        ignore_eos=spec.get("ignore_eos", False),
        logprobs=spec.get("logprobs"),
    )


async def run_streams(engine: Engine, kind: str, batch: list[list[int]], new_tokens: int) -> int:
    """A request of `kind` for each prompt of `batch`, at once, each read to its end: the tokens they got."""

    reads = (read_request(engine, request(kind, place, prompt, new_tokens)) for place, prompt in enumerate(batch))
    return sum(await asyncio.gather(*reads))


def measure(args: argparse.Namespace, streams: int) -> dict[str, Any]:
    """Each kind's pieces at `streams` streams: medians over the rounds of microseconds a decode step."""
    config = CoreConfig(
        args.model, "cpu", args.threads, "auto", False, streams, None, 512, False, None, 0, run_ahead=args.run_ahead
    )
    loaded = load_model(config)
    timers = Timers()
    timers.wrap(loaded.slots.decoder.session, "run_with_iobinding", MODEL_RUNS)
    for owner, name, label in PIECES:
        timers.wrap(owner, name, label)
    limits = EngineLimits(loaded.capacity, None, 0, None, args.run_ahead, 0)
    engine = Engine(loaded.slots, loaded.tokenizer, limits)
    engine.start()
    tokenizer = loaded.tokenizer
    batch = prompts(tokenizer.vocab_size, {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}, streams)
    rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in args.kinds}
    try:
        for number in range(args.rounds + 1):  # the first a warm-up
            for kind in args.kinds:
                timers.clear()
                start = time.perf_counter()
                tokens = asyncio.run(run_streams(engine, kind, batch, args.new_tokens))
                elapsed = time.perf_counter() - start
                if number:
                    steps = max(tokens / streams, 1.0)  # decode steps, about: every stream's tokens in turn
                    per_step = {label: seconds / steps * 1e6 for label, seconds in timers.seconds.items()}
                    per_step["step"] = elapsed / steps * 1e6
                    per_step[OUTSIDE] = per_step["step"] - per_step.get(MODEL_RUNS, 0.0)
                    rounds[kind].append(per_step)
    finally:
        engine.stop()
        timers.unwrap()
    kinds = {kind: medians(got) for kind, got in rounds.items()}
    greedy = kinds.get("greedy", {}).get("step")
    for values in kinds.values():
        if greedy:
            values["x greedy (step time)"] = greedy / values["step"]
    return {"streams": streams, "kinds": kinds}


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each piece's median over the rounds (a round without it: 0)."""
    labels = {label for got in rounds for label in got}
    return {label: statistics.median(got.get(label, 0.0) for got in rounds) for label in sorted(labels)}


def print_table(result: dict[str, Any]) -> None:
    for row in result["rows"]:
        kinds = list(row["kinds"])
        labels = sorted({label for values in row["kinds"].values() for label in values})
        print(f"{row['streams']} streams: us a decode step".ljust(46) + "".join(k.rjust(12) for k in kinds))
        for label in labels:
            cells = [row["kinds"][kind].get(label) for kind in kinds]
            print(label.ljust(46) + "".join("".rjust(12) if v is None else f"{v:12.2f}"[-12:] for v in cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--streams", default="1,16", help="comma-separated streams at once")
    p.add_argument("--kinds", default="greedy,top_p,top_k,logprobs,repetition", help="of " + ", ".join(KINDS))
    p.add_argument("--rounds", type=int, default=5, help="rounds after a warm-up, the kinds alternating")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens a request, at most (EOS may end one)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    p.add_argument("--run-ahead", choices=("auto", "on", "off"), default="auto", help="as `serve --run-ahead`")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    args = p.parse_args(argv)
    args.kinds = args.kinds.split(",")
    unknown = [kind for kind in args.kinds if kind not in KINDS]
    if unknown:
        p.error(f"--kinds: {', '.join(unknown)} not of {', '.join(KINDS)}")
    stamp = Stamp.start("CPUExecutionProvider")
    rows = [measure(args, int(streams)) for streams in args.streams.split(",")]
    result = {"model": args.model, "rounds": args.rounds, "new_tokens": args.new_tokens, "rows": rows}
    result["stamp"] = stamp.finish()
    print_table(result)
    if args.out:
        write_report(args.out, result, title="Where a decode step's time goes, by request kind")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
