"""The `attnserve` command: parses arguments, then imports only the subcommand it runs.

`attnserve serve` must not import torch, so no subcommand module is imported at the top.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

# subcommand -> (module, function taking the parsed args and returning an exit code)
HANDLERS = {
    "train": ("attnserve.model.train_cli", "main"),
    "export": ("attnserve.export.onnx_export", "main"),
    "attention-map": ("attnserve.model.attention_map", "main"),
    "serve": ("attnserve.server.app", "main"),
    "generate": ("attnserve.clients.generate_cli", "main"),
    "bench": ("attnserve.clients.bench", "main"),
    "ray-serve": ("attnserve.ray_serve.main", "main"),
}

# A subcommand whose import misses one of these names the extras that install it (the base install
# is a client host: pyproject.toml).
SERVING = "pip install 'attnserve[cpu]' (or 'attnserve[gpu]' for CUDA)"
TRAINING = "pip install 'attnserve[train]'"
EXTRAS = {
    **dict.fromkeys(("onnxruntime", "numpy", "tokenizers", "prometheus_client", "grpc_reflection"), SERVING),
    **dict.fromkeys(("torch", "onnx", "onnxscript", "tqdm"), TRAINING),
}


def add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a transformer on a text corpus",
        epilog="data-parallel: torchrun --nproc_per_node=N -m attnserve.cli train ...",
    )
    p.add_argument("--preset", default="small", help="model preset: tiny, small (default), numbers, ...")
    p.add_argument(
        "--corpus",
        default=None,
        help="text file or folder of .txt files (default: CPython's pydoc topics); for an encoder-decoder "
        "preset, a file of source<TAB>target lines (default: numbers into words)",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/PRESET)")
    p.add_argument(
        "--tokenizer",
        choices=["bytes", "bpe"],
        default=None,
        help="bpe: a byte-level BPE trained on the training split in seconds (the default); "
        "bytes: UTF-8 bytes, BOS first. --resume keeps the checkpoint's",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="BPE ids in all, 259 (3 special + 256 bytes) and up (default 2048)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps in all")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="stop after this many seconds of training in all, eval excluded (default 180 unless --max-steps; "
        "encoder-decoders: none, 2400 steps)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="bf16 autocast, fp32, or auto: bf16 where the hardware has it (default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (step, optimizer)")
    p.add_argument(
        "--batch-size", type=int, default=None, help="windows (pairs) per step per process (default 32; 64 pairs)"
    )
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 5e-3; encoder-decoders 2e-3)")
    p.add_argument("--eval-interval", type=int, default=None, help="steps between held-out evaluations")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per process (default: the cores shared among local processes)",
    )
    size = p.add_argument_group("model size (each overrides the preset's value)")
    size.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="N",
        help="tokens per window, the model's max_len (at least 8)",
    )
    size.add_argument("--d-model", type=int, default=None, metavar="N", help="width of the residual stream")
    size.add_argument("--n-layers", type=int, default=None, metavar="N", help="decoder layers")
    size.add_argument(
        "--n-heads",
        type=int,
        default=None,
        metavar="N",
        help="attention heads; d-model / n-heads must be a multiple of 8",
    )
    size.add_argument("--d-ff", type=int, default=None, metavar="N", help="hidden width of the feed-forward")


def add_export(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to an ONNX model directory, gated on parity")
    p.add_argument("checkpoint", help="runs/NAME/checkpoint.pt")
    p.add_argument("--out", required=True, help="model directory to write, e.g. models/NAME")
    p.add_argument(
        "--dtype", choices=["float32", "float16"], default="float32", help="float16 is for the CUDA provider"
    )
    p.add_argument("--quantize", choices=["int8"], default=None, help="dynamic int8 for the CPU provider")
    p.add_argument("--parity-steps", type=int, default=64, help="greedy decode steps compared (default 64)")
    p.add_argument(
        "--kv-cache",
        choices=["arena", "concat"],
        default=None,
        help="decoder KV cache layout: arena (in place, GroupQueryAttention; the default for both "
        "architectures, the one attnserve serve runs) or concat (past + new; the KV benchmark's baseline)",
    )


def add_attention_map(sub) -> None:
    p = sub.add_parser("attention-map", help="plot an encoder-decoder's cross-attention as a PNG heatmap")
    p.add_argument("checkpoint", help="an encoder-decoder checkpoint, e.g. runs/numbers/checkpoint.pt")
    p.add_argument("source", help="source text to translate, e.g. 4021")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--per-head", action="store_true", help="one panel per head of --layer instead of per layer")
    p.add_argument("--layer", type=int, default=0, help="layer shown with --per-head (default 0)")


def add_serve(sub) -> None:
    """`attnserve serve`'s flags come from ServerConfig's fields, where each default is written once."""
    from attnserve.server.config import ServerConfig  # torch-free and light: dataclasses and argparse

    ServerConfig.add_cli_args(sub.add_parser("serve", help="serve a model directory over gRPC on ONNX Runtime"))


def add_ray_serve(sub) -> None:
    """`attnserve ray-serve`'s flags: the replica's from ServerConfig, Ray's from RayServeConfig."""
    from attnserve.ray_serve.config import RayServeConfig  # no ray import: dataclasses and argparse

    RayServeConfig.add_cli_args(
        sub.add_parser("ray-serve", help="serve a model directory on Ray Serve: replicas behind Ray's gRPC proxy")
    )


def add_client_flags(p) -> None:
    """Connection flags shared by the client subcommands (generate, bench)."""
    p.add_argument(
        "--target",
        default="127.0.0.1:50051",
        help="server HOST:PORT, or several comma-separated (round_robin); default 127.0.0.1:50051",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="deadline of each call in seconds (default 60 for generate, 300 for bench)",
    )
    p.add_argument("--tls-ca", default=None, help="PEM CA bundle that signed the server's certificate (enables TLS)")
    p.add_argument("--tls-cert", default=None, help="PEM client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM client private key for mutual TLS")
    p.add_argument("--tls-server-name", default=None, help="name to verify in the server's certificate")
    p.add_argument("--token-file", default=None, help="file with the bearer token the server expects")


def add_stream_interval_flags(p) -> None:
    """The request's stream interval (generate, bench); left out, the server's --stream-interval-* apply."""
    p.add_argument(
        "--stream-interval-tokens",
        type=int,
        default=None,
        metavar="N",
        help="stream a message once N tokens wait (the first at once); default: the server's",
    )
    p.add_argument(
        "--stream-interval-ms",
        type=int,
        default=None,
        metavar="MS",
        help="... or once MS milliseconds have passed, whichever first (0: no time bound); default: the server's",
    )


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a completion from a running server (streamed by default)",
        description="Stream a completion to the terminal; Ctrl-C cancels it on the server "
        "(exit 130). The prompt is text or, with --prompt-token-ids, token ids. "
        "Errors print one line and exit 2 (bad request) or 1.",
    )
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="text to continue ('-' reads it from stdin); leave it out with --prompt-token-ids",
    )
    p.add_argument(
        "--prompt-token-ids",
        default=None,
        metavar="ID,ID,...",
        help="the prompt as comma-separated token ids, sent as given (nothing prepended), "
        "e.g. 256,105,109; instead of the text prompt",
    )
    # Sampling flags default to None: GenerationParams (attnserve/clients/types.py) holds the defaults.
    p.add_argument("--max-new-tokens", type=int, default=None, help="most tokens to generate (default: server cap)")
    p.add_argument("--temperature", type=float, default=None, help="0 (default) is greedy decoding")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (default 0: all)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    p.add_argument("--repetition-penalty", type=float, default=None, help="> 1 discourages repeats (1: off)")
    p.add_argument("--seed", type=int, default=None, help="seed of this request's sampler")
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop when the text contains TEXT (repeat the flag for several)",
    )
    add_stream_interval_flags(p)
    p.add_argument("--request-id", default="", help="id echoed by the server and in its logs")
    p.add_argument("--no-stream", action="store_true", help="one unary Generate call instead of a stream")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token_ids, finish_reason, usage, timings, request_id",
    )
    add_client_flags(p)


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure a running server: latency and throughput under load",
        description="Warm up, then a closed-loop concurrency sweep (and open-loop Poisson "
        "arrivals with --rate) over streamed requests; throughput in output tokens/s "
        "and bytes/s (the fair figure across tokenizers). Progress goes to stderr; "
        "the table, then the JSON report as one line (always last), to stdout.",
    )
    p.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated requests in flight per level (default 1,4,16; none with --rate alone)",
    )
    p.add_argument("--rate", default=None, help="comma-separated open-loop request rates per second (Poisson)")
    p.add_argument("--requests", type=int, default=32, help="requests per level (default 32)")
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=32,
        help="prompt length in tokens (default 32): exact token ids; with --prompt-text, text of N - 1 "
        "ASCII bytes, N tokens with the byte tokenizer's BOS, fewer with BPE (the report's "
        "prompt_tokens counts them)",
    )
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt-ids",
        dest="prompt_ids",
        action="store_true",
        default=True,
        help="the default: prompts as token ids, drawn (from --seed) from the vocabulary less BOS/EOS/PAD, "
        "so every tokenizer gets exactly --prompt-tokens",
    )
    prompts.add_argument(
        "--prompt-text",
        dest="prompt_ids",
        action="store_false",
        help="prompts as ASCII text cut from one English passage (exact lengths with the byte tokenizer only)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per request (default 64)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before measuring (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the arrival times")
    add_stream_interval_flags(p)
    p.add_argument("--out", default=None, help="write the JSON report to this file")
    p.add_argument("--plot", default=None, help="write throughput and latency plots to this PNG")
    add_client_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train(sub)
    add_export(sub)
    add_attention_map(sub)
    add_serve(sub)
    add_ray_serve(sub)
    add_generate(sub)
    add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, function = HANDLERS[args.command]
    try:
        handler = getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing not in EXTRAS:
            raise
        print(f"attnserve {args.command}: error: {missing} is not installed; {EXTRAS[missing]}", file=sys.stderr)
        return 2
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
