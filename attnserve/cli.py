"""The `attnserve` command: train, export, serve and query transformers.

It finds the subcommand, then imports only what declares and runs it. Each subcommand's flags
are declared beside the code that runs it, most from its config dataclass (attnserve/flags.py),
so that a default is written once. `attnserve serve` must not
import torch, so nothing of a subcommand is imported until it is the one asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from . import __version__


@dataclass(frozen=True)
class Subcommand:
    help: str
    flags: str  # "module:callable" adding the subcommand's flags to its parser
    run: str  # "module:callable" taking the parsed args and returning an exit code


SUBCOMMANDS = {
    "train": Subcommand(
        "train a transformer on a text corpus",
        "attnserve.model.train_cli:add_arguments",
        "attnserve.model.train_cli:main",
    ),
    "import": Subcommand(
        "import a Hugging Face checkpoint directory (GPT-2, Llama, Mistral, Qwen2), proven against transformers",
        "attnserve.model.hf.import_cli:add_arguments",
        "attnserve.model.hf.import_cli:main",
    ),
    "export": Subcommand(
        "export a checkpoint to an ONNX model directory, gated on parity",
        "attnserve.export.export_cli:add_arguments",
        "attnserve.export.export_cli:main",
    ),
    "attention-map": Subcommand(
        "plot an encoder-decoder's cross-attention as a PNG heatmap",
        "attnserve.model.attention_map:add_arguments",
        "attnserve.model.attention_map:main",
    ),
    "serve": Subcommand(
        "serve a model directory over gRPC on ONNX Runtime",
        "attnserve.server.config:ServerConfig.add_cli_args",
        "attnserve.server.app:main",
    ),
    "ray-serve": Subcommand(
        "serve a model directory on Ray Serve: replicas behind Ray's gRPC proxy",
        "attnserve.ray_serve.config:RayServeConfig.add_cli_args",
        "attnserve.ray_serve.main:main",
    ),
    "tokenize": Subcommand(
        "a model directory's token ids (and their texts) for a text, or the text of ids",
        "attnserve.runtime.tokenize_cli:add_arguments",
        "attnserve.runtime.tokenize_cli:main",
    ),
    "generate": Subcommand(
        "generate a completion from a running server (streamed by default)",
        "attnserve.clients.generate_cli:add_arguments",
        "attnserve.clients.generate_cli:main",
    ),
    "bench": Subcommand(
        "measure a running server: latency and throughput under load",
        "attnserve.clients.bench_cli:add_arguments",
        "attnserve.clients.bench_cli:main",
    ),
}

# A subcommand whose import misses one of these names the extras that install it (the base install
# is a client host: pyproject.toml).
SERVING = "pip install 'attnserve[cpu]' (or 'attnserve[gpu]' for CUDA)"
TRAINING = "pip install 'attnserve[train]'"
EXTRAS = {
    **dict.fromkeys(("onnxruntime", "numpy", "tokenizers", "prometheus_client", "grpc_reflection"), SERVING),
    **dict.fromkeys(("torch", "onnx", "onnxscript", "tqdm"), TRAINING),
    **dict.fromkeys(("transformers", "safetensors"), "pip install 'attnserve[train,hf]'"),
}


class MissingExtra(Exception):
    """A subcommand's code imports a package this install lacks (the message names the extras)."""


def resolve(path: str) -> Callable:
    """ "package.module:Class.method" -> that callable, importing the module."""
    module, _, attributes = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing not in EXTRAS:
            raise
        raise MissingExtra(f"{missing} is not installed; {EXTRAS[missing]}") from None
    for name in attributes.split("."):
        found = getattr(found, name)
    return found


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals in one line on stderr, exit code 2, as every other refusal of the command:
    `attnserve serve: error: argument --port: invalid int value: 'x' (attnserve serve --help lists
    the flags)`, not the usage block first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the flags of `command` only (the others are listed, their code not imported)."""
    parser = OneLineParser(prog="attnserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, subcommand in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=subcommand.help)
        if name == command:
            resolve(subcommand.flags)(p)
    return parser


def subcommand_parser(command: str, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """One subcommand's own parser (`attnserve COMMAND`), for tools that read its flags."""
    parser = parser or build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # the top level has no valued flags
    try:
        parser = build_parser(command if command in SUBCOMMANDS else None)
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the subcommand's parser, whose --help lists its flags
            subcommand_parser(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        run = resolve(SUBCOMMANDS[args.command].run)
    except MissingExtra as e:
        print(f"attnserve {command}: error: {e}", file=sys.stderr)
        return 2
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
