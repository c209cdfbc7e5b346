"""Speculative decoding (--speculative-config) against none, served through gRPC: tokens/s, each
side's acceptance, and whether both sides gave the same tokens (issue 64's report).

Two `attnserve serve` on 127.0.0.1 over the same model directory, one with --config as its
--speculative-config, one without; S streams at once (threads of this process, each calling
Generate, greedy or with --request-fields, --new-tokens at most, EOS may end one) over two workloads
of text cut from the held-out tail of the default corpus (CPython's pydoc topics, the last 5%: text
the model was not trained on):
- copy: a passage, a blank line, then its start again with one word changed, so that the answer
  may repeat the rest of the passage (as an edit, a summary or a quotation repeats its context);
- plain: a passage's start, continued (no repetition but what the text makes).
Each round runs both sides and both workloads, in turn forwards and backwards. First, on the runtime
alone, what a verification of T positions costs against a decode step. Reports, per stream
count and workload, each side's median tokens/s with min and max, on/off round by round, the
acceptance (ids kept over ids proposed, from the server's metrics) and how many completions were
identical on both sides; then one JSON object last (--out also writes its Markdown report, --plot
a PNG). Torch-free.

    python -m benchmarks.speculative --model models/NAME [--config JSON] [--streams 1,4,16]
        [--new-tokens 128] [--requests-per-stream 2] [--repeats 3] [--threads N] [--request-fields JSON]
        [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import json
import random
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc

from attnserve.report_stamp import Stamp
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.serving import alternating, report, spread

TITLE = "Speculative decoding against none, through gRPC, alternating"
CONFIG = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
SIDES = ("off", "on")
WORKLOADS = ("copy", "plain")
HELDOUT = 0.05  # attnserve.model.data.HELDOUT_FRACTION: the corpus's tail the training never saw
PASSAGE_BYTES = 450  # a copy prompt holds a passage and a third of it again
EDITS = {" the ": " a ", " is ": " was ", " a ": " the ", " and ": " or "}
DRAFT = "attnserve_spec_decode_draft_tokens_total"
ACCEPTED = "attnserve_spec_decode_accepted_tokens_total"


def corpus_parts() -> tuple[str, str]:
    """The default corpus's training part and held-out tail, cut where training cuts its bytes
    (attnserve.model.data's default_corpus_bytes and split_heldout, which import torch: this does not)."""
    from pydoc_data.topics import topics

    data = "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    cut = len(data) - int(len(data) * HELDOUT)
    while data[cut] & 0xC0 == 0x80:  # a continuation byte: the cut moves back to its character's start
        cut -= 1
    return data[:cut].decode("utf-8"), data[cut:].decode("utf-8")


def passages(count: int, seed: int) -> list[str]:
    """`count` passages of about PASSAGE_BYTES, each starting at a line of the held-out text."""
    text, rng = corpus_parts()[1], random.Random(seed)
    starts = [i + 1 for i, c in enumerate(text[: -PASSAGE_BYTES - 1]) if c == "\n" and text[i + 1 : i + 2].strip()]
    return [text[s : s + PASSAGE_BYTES].rsplit(" ", 1)[0] for s in rng.sample(starts, count)]


def copy_prompt(passage: str) -> str:
    """The passage, a blank line, its first third again with its first editable word changed."""
    again = passage[: len(passage) // 3]
    for word, other in EDITS.items():
        if word in again:
            again = again.replace(word, other, 1)
            break
    return f"{passage}\n\n{again}"


def prompts(workload: str, count: int, seed: int) -> list[str]:
    chosen = passages(count, seed)
    return [copy_prompt(p) for p in chosen] if workload == "copy" else [p[: len(p) // 2] for p in chosen]


def verification_cost(model: Path, threads: int, repeats: int, runs: int = 200) -> dict:
    """What a verification of T positions costs against a decode step of one slot, on the runtime alone
    (no server): each run's milliseconds, a slot at a 100-token past, T = 1 + proposals; rounds
    alternating, medians with min and max."""
    import numpy as np

    from attnserve.runtime.model_sessions import ModelSessions
    from attnserve.runtime.opening import open_slot_runner

    runner = open_slot_runner(ModelSessions(model, "cpu", threads), 1, 256)
    runner.start(0, tuple(range(4, 104)))
    token = int(runner.prefill().rows[0].argmax())
    decoder, sizes = runner.decoder, (1, 2, 3, 5, 9)
    held = int(decoder.arena.lengths[0])

    def step() -> None:
        decoder.decode_greedy(np.array([token]))
        decoder.arena.lengths[0] = held

    def verify(t: int) -> None:
        decoder.verify(0, [token] * t)
        decoder.arena.lengths[0] = held

    kinds: dict[str, Callable[[], None]] = {"step": step, **{f"verify {t}": partial(verify, t) for t in sizes}}
    measured: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in alternating(list(kinds), repeats, "verification cost"):
        kinds[kind]()
        start = time.perf_counter()
        for _ in range(runs):
            kinds[kind]()
        measured[kind].append((time.perf_counter() - start) / runs * 1000)
    runner.release(0)
    return {
        "ms": {kind: spread(values) for kind, values in measured.items()},
        "over_step": {
            f"verify {t}": spread([v / s for v, s in zip(measured[f"verify {t}"], measured["step"])]) for t in sizes
        },
    }


class Side:
    """One server, and the Generate calls of a measurement."""

    def __init__(self, model: Path, threads: int, max_streams: int, new_tokens: int, config: str | None, fields: dict):
        flags = ["--provider", "cpu", "--threads", str(threads), "--max-batch", str(max_streams)]
        flags += ["--max-queue", str(4 * max_streams), "--max-new-tokens-cap", str(new_tokens)]
        flags += ["--speculative-config", config] if config else []
        self.server = ServerProcess(str(Path(model).resolve()), *flags)
        self.channel = grpc.insecure_channel(self.server.target)
        self.stub = pb_grpc.TextGenerationStub(self.channel)
        self.fields = fields  # every request's fields beyond its prompt and max_new_tokens

    def request(self, text: str, new_tokens: int) -> pb.GenerateRequest:
        """A request for `text`: where it samples with no seed given, seeded by its text (both sides draw
        alike, each request differently)."""
        fields = dict(self.fields)
        if fields.get("temperature") and "seed" not in fields:
            fields["seed"] = zlib.crc32(text.encode())
        return pb.GenerateRequest(prompt=text, max_new_tokens=new_tokens, **fields)

    def measure(self, texts: list[list[str]], new_tokens: int) -> dict:
        """One thread per stream, each sending its texts one after another; tokens/s over the wall time,
        the completions in order, and the acceptance over this measurement (None without speculation)."""
        before = self.server.metrics()

        def stream(own: list[str]) -> list[tuple[int, ...]]:
            return [tuple(self.stub.Generate(self.request(text, new_tokens), timeout=600).token_ids) for text in own]

        start = time.perf_counter()
        with ThreadPoolExecutor(len(texts)) as pool:
            outputs = list(pool.map(stream, texts))
        seconds = time.perf_counter() - start
        after = self.server.metrics()
        proposed = after.get(DRAFT, 0.0) - before.get(DRAFT, 0.0)
        kept = after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)
        tokens = sum(len(ids) for own in outputs for ids in own)
        return {
            "tokens_per_s": tokens / seconds,
            "tokens": tokens,
            "outputs": [ids for own in outputs for ids in own],
            "proposed": proposed,
            "accepted": kept,
        }

    def close(self) -> None:
        self.channel.close()
        self.server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="model directory written by `attnserve export`")
    p.add_argument("--config", default=CONFIG, help=f"the 'on' side's --speculative-config (default: {CONFIG})")
    p.add_argument("--streams", default="1,4,16", help="comma-separated streams at once")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per request, at most (EOS may end one)")
    p.add_argument("--requests-per-stream", type=int, default=2, help="requests each stream sends, one after another")
    p.add_argument("--repeats", type=int, default=3, help="rounds, sides and workloads alternating; medians reported")
    p.add_argument("--threads", type=int, default=0, help="the servers' --threads (0: their default)")
    p.add_argument(
        "--request-fields",
        default="{}",
        help='every request\'s GenerateRequest fields as JSON, e.g. \'{"temperature": 0.7, "top_p": 0.95, '
        '"logprobs": 2}\' (default: greedy); a sampled request without a seed is seeded by its prompt',
    )
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of on/off per workload and stream count here")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    stamp = Stamp.start(provider="cpu")
    cost = verification_cost(args.model, args.threads, args.repeats)
    configs = {"off": None, "on": args.config}
    fields = json.loads(args.request_fields)
    sides = {
        side: Side(args.model, args.threads, max(streams), args.new_tokens, configs[side], fields) for side in SIDES
    }
    runs = [(side, workload) for side in SIDES for workload in WORKLOADS]
    rows = []
    try:
        for count in streams:
            texts = {w: prompts(w, count * args.requests_per_stream, seed=count) for w in WORKLOADS}
            split = {w: [texts[w][i::count] for i in range(count)] for w in WORKLOADS}
            for server in sides.values():  # warm-up: every prompt once (and the server's first runs)
                for w in WORKLOADS:
                    server.measure(split[w], 8)
            measured: dict[tuple[str, str], list[dict]] = {run: [] for run in runs}
            for run in alternating(runs, args.repeats, f"{count} streams"):
                measured[run].append(sides[run[0]].measure(split[run[1]], args.new_tokens))
            rows.append(summary(count, measured))
    finally:
        for server in sides.values():
            server.close()
    settings = {"model": str(args.model), "config": args.config, "threads": args.threads, "request_fields": fields}
    settings.update(new_tokens=args.new_tokens, requests_per_stream=args.requests_per_stream, repeats=args.repeats)
    settings["workloads"] = {"copy": copy_prompt.__doc__, "plain": "a passage's first half, continued"}
    result = {**settings, "verification_cost": cost, "rows": rows}
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


def summary(count: int, measured: dict[tuple[str, str], list[dict]]) -> dict:
    """One stream count's figures per workload: each side's tokens/s, on over off round by round, the
    acceptance, and the completions identical on both sides."""
    row: dict = {"streams": count, "workloads": {}}
    for workload in WORKLOADS:
        off, on = measured["off", workload], measured["on", workload]
        proposed = sum(m["proposed"] for m in on)
        same = sum(a == b for m_off, m_on in zip(off, on) for a, b in zip(m_off["outputs"], m_on["outputs"]))
        row["workloads"][workload] = {
            "tokens_per_s": {side: spread([m["tokens_per_s"] for m in measured[side, workload]]) for side in SIDES},
            "on_over_off": spread([b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(off, on)]),
            "proposed_per_request": proposed / sum(len(m["outputs"]) for m in on),
            "acceptance": sum(m["accepted"] for m in on) / proposed if proposed else None,
            "identical": [same, sum(len(m["outputs"]) for m in on)],
            "tokens_per_request": sum(m["tokens"] for m in on) / sum(len(m["outputs"]) for m in on),
        }
    return row


def print_table(result: dict) -> None:
    fields = json.dumps(result.get("request_fields") or {}) if result.get("request_fields") else "greedy"
    print(f"{result['model']}; on: --speculative-config '{result['config']}'; requests: {fields}")
    cost = result["verification_cost"]
    step = cost["ms"]["step"]["median"]
    line = ", ".join(f"{kind} {ratio['median']:.2f}x" for kind, ratio in cost["over_step"].items())
    print(f"one slot's decode step {step:.3f} ms; a verification of T positions: {line}")
    for row in result["rows"]:
        for workload, f in row["workloads"].items():
            off, on, ratio = f["tokens_per_s"]["off"], f["tokens_per_s"]["on"], f["on_over_off"]
            acceptance = "-" if f["acceptance"] is None else f"{f['acceptance']:.0%}"
            line = f"{row['streams']:>3} streams {workload:<6} off {off['median']:>8,.1f}"
            line += f"  on {on['median']:>8,.1f} tokens/s"
            line += f"  on/off {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})  acceptance {acceptance}"
            line += f"  identical {f['identical'][0]}/{f['identical'][1]}"
            print(line)


def write_plot(result: dict, path: str) -> None:
    """On over off per stream count, a bar per workload, with the rounds' spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(WORKLOADS)
    for i, workload in enumerate(WORKLOADS):
        ratios = [row["workloads"][workload]["on_over_off"] for row in rows]
        medians = [r["median"] for r in ratios]
        errors = [[m - r["min"] for m, r in zip(medians, ratios)], [r["max"] - m for m, r in zip(medians, ratios)]]
        x = [k + i * width for k in range(len(rows))]
        ax.bar(x, medians, width, yerr=errors, capsize=3, label=workload, color=f"C{i}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))])
    ax.set_xticklabels([f"{row['streams']} streams" for row in rows])
    ax.set_ylabel("tokens/s with speculation over without", fontsize=8)
    ax.set_title(f"prompt lookup: {Path(result['model']).name}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
