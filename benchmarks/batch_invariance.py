"""Does a request's output depend on what shares its batch, or on the prefix cache? Issue 60's measure,
served through gRPC, for each model directory given.

Per model: one `attnserve serve` with the prefix cache on (the default) and one with it off. Eight
prompts of --prompt-tokens random ids are sent one at a time, then all at once beside eight others
(16 streams), each as greedy and as a seeded sample (temperature 0.8, top_p 0.95, seed 7), exactly
--new-tokens each; then --shared prompts that share a --preamble-tokens preamble and differ after it
are sent one at a time to both servers (the cache-on server copies the preamble's blocks after the
first). Reports, per model and kind, the prompts whose tokens differ (batched against alone, cache
hit against miss); then one JSON object last (--out also writes its Markdown report, --plot a PNG).
Torch-free.

    python -m benchmarks.batch_invariance --model models/A [--model models/B ...] [--new-tokens 64]
        [--prompt-tokens 16] [--shared 13] [--preamble-tokens 900] [--threads 2] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from attnserve.report_stamp import Stamp
from attnserve.runtime.contract import read_manifest
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as rpc
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.serving import report

TITLE = "A request's tokens alone, batched and from the prefix cache"
KINDS = {"greedy": {}, "seeded top-p": {"temperature": 0.8, "top_p": 0.95, "seed": 7}}
PROMPTS = 8  # measured prompts; as many others share their batch
TIMEOUT = 600


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, action="append", type=Path, help="a model directory (repeatable)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per request, exactly (ignore_eos)")
    p.add_argument("--prompt-tokens", type=int, default=16, help="ids per prompt of the batch comparison")
    p.add_argument("--shared", type=int, default=13, help="prompts of the prefix cache comparison")
    p.add_argument("--preamble-tokens", type=int, default=900, help="ids the prefix cache's prompts share")
    p.add_argument("--threads", type=int, default=2, help="the servers' --threads")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of the differing prompts per model and comparison here")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    models = [measure_model(model, args) for model in args.model]
    settings = {k: getattr(args, k) for k in ("new_tokens", "prompt_tokens", "shared", "preamble_tokens", "threads")}
    report({**settings, "models": models}, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


def measure_model(model: Path, args) -> dict:
    """Both comparisons on one model directory."""
    manifest = read_manifest(model)
    vocab = manifest.config["vocab_size"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, args.prompt_tokens).tolist() for _ in range(2 * PROMPTS)]
    preamble = rng.integers(0, vocab, args.preamble_tokens).tolist()
    shared = [preamble + rng.integers(0, vocab, 1 + n % 5).tolist() for n in range(args.shared)]
    if len(shared[-1]) + args.new_tokens > manifest.config["max_len"]:
        raise SystemExit(f"--preamble-tokens {args.preamble_tokens}: the prompts outgrow {model}'s context")
    flags = ["--provider", "cpu", "--threads", str(args.threads), "--max-batch", str(2 * PROMPTS)]
    flags += ["--max-new-tokens-cap", str(args.new_tokens)]
    result: dict = {"model": str(model), "quantization": manifest.quantization, "dtype": manifest.dtype, "kinds": {}}
    with (
        ServerProcess(str(model.resolve()), *flags) as cached,
        ServerProcess(str(model.resolve()), *flags, "--prefix-cache", "off") as plain,
    ):
        for kind, fields in KINDS.items():
            alone = [generate(cached.target, prompt, args.new_tokens, fields) for prompt in prompts[:PROMPTS]]
            with ThreadPoolExecutor(2 * PROMPTS) as pool:
                batched = list(
                    pool.map(
                        generate,
                        [cached.target] * len(prompts),
                        prompts,
                        [args.new_tokens] * len(prompts),
                        [fields] * len(prompts),
                    )
                )
            hits = [generate(cached.target, prompt, args.new_tokens, fields) for prompt in shared]
            misses = [generate(plain.target, prompt, args.new_tokens, fields) for prompt in shared]
            result["kinds"][kind] = {
                "batched_differ": sum(a != b for a, b in zip(alone, batched[:PROMPTS])),
                "prompts": PROMPTS,
                "cache_hit_differ": sum(a != b for a, b in zip(hits[1:], misses[1:])),
                "cache_hits": len(shared) - 1,
            }
    return result


def generate(target: str, prompt: list[int], new_tokens: int, fields: dict) -> list[int]:
    """The token ids of one request, exactly `new_tokens` of them."""
    with grpc.insecure_channel(target) as channel:
        request = pb.GenerateRequest(prompt_token_ids=prompt, max_new_tokens=new_tokens, ignore_eos=True, **fields)
        return list(rpc.TextGenerationStub(channel).Generate(request, timeout=TIMEOUT).token_ids)


def print_table(result: dict) -> None:
    print(f"{'model':<40}{'kind':<16}{'batched: differ':>18}{'cache hit: differ':>20}")
    for model in result["models"]:
        name = f"{Path(model['model']).name} ({model['quantization'] or model['dtype']})"
        for kind, row in model["kinds"].items():
            batched = f"{row['batched_differ']} of {row['prompts']}"
            print(f"{name:<40}{kind:<16}{batched:>18}{row['cache_hit_differ']:>12} of {row['cache_hits']}")


def write_plot(result: dict, path: str) -> None:
    """Per model, the share of prompts whose tokens differ, one bar per kind and comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    bars = [(kind, key) for kind in KINDS for key in ("batched", "cache_hit")]
    fig, ax = plt.subplots(figsize=(2 + 2.2 * len(models), 4))
    width = 0.8 / len(bars)
    for i, (kind, key) in enumerate(bars):
        total = "prompts" if key == "batched" else "cache_hits"
        shares = [m["kinds"][kind][f"{key}_differ"] / m["kinds"][kind][total] for m in models]
        label = f"{kind}, {'beside 15 others' if key == 'batched' else 'prefix cache hit'}"
        ax.bar([k + i * width for k in range(len(models))], shares, width, label=label, color=f"C{i}")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(models))])
    ax.set_xticklabels([f"{Path(m['model']).name}" for m in models], fontsize=8)
    ax.set_ylabel("prompts whose tokens differ from alone / uncached", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
