"""The graph's own speed: a plain decode loop over two model directories, in one run (issue 22's
"graph at batch 1": an export change against the export before it, the same checkpoint).

Each side prefills --batch prompts of 16 ids together, then runs --new-tokens - 1 greedy decode
steps through the arena driver (ArenaDecoder, one np.argmax over the batch per step), on its own
ONNX Runtime session with --threads; the sides alternate (the order flips every round). Reports
the median microseconds a step (min-max) per batch size, the ratio, and whether the two sides
decoded the same tokens; then the machine's read bandwidth, measured after the rounds, each side's
weight bytes a token, and the share of its batch-1 limit it reached (bandwidth.py); the JSON
object last. Torch-free.

    python -m benchmarks.graph_speed --model models/small-1k-bpe --baseline models/small-1k-bpe-unpacked
        [--batch 1,16] [--new-tokens 256] [--repeats 6] [--threads 1] [--bandwidth-mib 1024] [--out F.json]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnserve.report_stamp import Stamp
from attnserve.runtime.arena_decoder import ArenaDecoder
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from benchmarks.bandwidth import read_bandwidth, weight_bytes_per_token
from benchmarks.serving import alternating, report, spread

PROMPT_TOKENS = 16
SIDES = ("baseline", "model")
TITLE = "The graph's own speed: two model directories step for step"


def decode(model: ModelSessions, batch: int, new_tokens: int) -> tuple[float, np.ndarray]:
    """Microseconds a step (prefill included, as one step), and the (steps, batch) tokens."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, model.spec.vocab_size - 10, PROMPT_TOKENS).tolist() for _ in range(batch)]
    decoder = fresh_decoder(model, prompts)
    start = time.perf_counter()
    tokens = greedy(decoder, prompts, new_tokens)
    return (time.perf_counter() - start) / new_tokens * 1e6, tokens


def fresh_decoder(model: ModelSessions, prompts: list[list[int]]) -> ArenaDecoder:
    """An arena driver with a slot for each prompt, all empty."""
    return open_slot_runner(model, len(prompts), len(prompts) * len(prompts[0])).decoder


def greedy(decoder: ArenaDecoder, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """The plain loop over the arena driver: the prompts (one length) prefilled together into its first
    slots, then new_tokens - 1 decode steps, one argmax over the batch each; the (steps, batch) tokens."""
    tokens = [decoder.prefill(0, prompts).argmax(axis=1)]
    for _ in range(new_tokens - 1):
        tokens.append(decoder.decode(tokens[-1]).argmax(axis=1))
    return np.stack(tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--baseline", required=True, help="the model directory to compare it with")
    p.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per sequence")
    p.add_argument("--repeats", type=int, default=6, help="rounds, sides alternating; medians reported")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--bandwidth-mib", type=int, default=1024, help="MiB read to measure read bandwidth (bandwidth.py)")
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    models = {side: ModelSessions(getattr(args, side), provider="cpu", threads=args.threads) for side in SIDES}
    rows: list[dict] = []
    for batch in (int(b) for b in args.batch.split(",")):
        for model in models.values():  # warm-up
            decode(model, batch, 16)
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        tokens: dict[str, np.ndarray] = {}
        for side in alternating(SIDES, args.repeats, f"batch {batch}"):
            us, tokens[side] = decode(models[side], batch, args.new_tokens)
            times[side].append(us)
        b, m = spread(times["baseline"]), spread(times["model"])
        r = spread([model / baseline for model, baseline in zip(times["model"], times["baseline"])])
        same = bool(np.array_equal(tokens["model"], tokens["baseline"]))
        rows.append({"batch": batch, "baseline_us": b, "model_us": m, "ratio": r, "same_tokens": same})
    settings = {key: getattr(args, key) for key in ("model", "baseline", "new_tokens", "threads", "repeats")}
    result = {**settings, "prompt_tokens": PROMPT_TOKENS, "rows": rows, "bandwidth": bandwidth_limits(args, rows)}
    report(result, stamp, args.out, None, print_table, title=TITLE)
    return 0


def bandwidth_limits(args, rows: list[dict]) -> dict:
    """This machine's read bandwidth (measured now, after the rounds), each side's weight bytes a token,
    its batch-1 limit in tokens/s and the share of it the batch-1 row reached (bandwidth.py)."""
    bandwidth = read_bandwidth(threads=max(2, args.threads), mib=args.bandwidth_mib)
    sides: dict[str, dict] = {}
    for side in SIDES:
        size = weight_bytes_per_token(getattr(args, side))
        sides[side] = {"weight_bytes_per_token": size, "tokens_per_s_limit": bandwidth / size}
        for row in rows:
            if row["batch"] == 1:
                tokens_per_s = 1e6 / row[f"{side}_us"]["median"]
                sides[side]["share_at_batch_1"] = tokens_per_s / sides[side]["tokens_per_s_limit"]
    return {"read_bytes_per_s": bandwidth, **sides}


def print_table(result: dict) -> None:
    for row in result["rows"]:
        b, m, r = row["baseline_us"], row["model_us"], row["ratio"]
        print(
            f"batch {row['batch']:>3}: baseline {b['median']:,.0f} us a step ({b['min']:,.0f}-{b['max']:,.0f}), "
            f"model {m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f}), model/baseline {r['median']:.3f} "
            f"({r['min']:.3f}-{r['max']:.3f}), same tokens: {row['same_tokens']}"
        )
    limits = result["bandwidth"]
    print(f"read bandwidth {limits['read_bytes_per_s'] / 1e9:.1f} GB/s")
    for side in SIDES:
        share = limits[side].get("share_at_batch_1")
        reached = f", batch 1 at {share:.0%} of it" if share is not None else ""
        print(
            f"{side}: {limits[side]['weight_bytes_per_token'] / 1e6:,.1f} MB of weights a token, "
            f"limit {limits[side]['tokens_per_s_limit']:,.1f} tokens/s{reached}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
