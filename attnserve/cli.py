"""The `attnserve` command: parses arguments, then imports only the subcommand it runs.

`attnserve serve` must not import torch, so no subcommand module is imported at the top.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, function taking the parsed args and returning an exit code)
HANDLERS = {
    "train": ("attnserve.model.train", "main"),
    "export": ("attnserve.export.onnx_export", "main"),
    "attention-map": ("attnserve.model.attention_map", "main"),
}


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a transformer on a text corpus")
    p.add_argument("--preset", default="small", help="model preset: tiny, small (default), numbers, ...")
    p.add_argument("--corpus", default=None, help="text file or folder of .txt files (default: CPython's pydoc topics)")
    p.add_argument("--out", default=None, help="run folder (default: runs/PRESET)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    p.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds of training")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")


def add_export(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to an ONNX model directory, gated on parity")
    p.add_argument("checkpoint", help="runs/NAME/checkpoint.pt")
    p.add_argument("--out", required=True, help="model directory to write, e.g. models/NAME")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="float16 is for the CUDA provider")
    p.add_argument("--quantize", choices=["int8"], default=None, help="dynamic int8 for the CPU provider")
    p.add_argument("--parity-steps", type=int, default=64, help="greedy decode steps compared (default 64)")


def add_attention_map(sub) -> None:
    p = sub.add_parser("attention-map", help="plot an encoder-decoder's cross-attention as a PNG heatmap")
    p.add_argument("checkpoint", help="an encoder-decoder checkpoint, e.g. runs/numbers/checkpoint.pt")
    p.add_argument("source", help="source text to translate, e.g. 4021")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--per-head", action="store_true", help="one panel per head of --layer instead of per layer")
    p.add_argument("--layer", type=int, default=0, help="layer shown with --per-head (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_train(sub)
    add_export(sub)
    add_attention_map(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, function = HANDLERS[args.command]
    return int(getattr(importlib.import_module(module), function)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
