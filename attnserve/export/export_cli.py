"""`attnserve export` on the command line: its flags, the export run, one-line errors.

What an export does is in onnx_export.py; the defaults are its and the contract's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..model.checkpoint import CheckpointError
from ..runtime import contract
from .onnx_export import DEFAULT_PARITY_STEPS, ExportError, export_checkpoint
from .parity import ParityError
from .quantize import ACCURACY_LEVELS, INT4_BLOCK_SIZES, Int4Options


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`attnserve export`'s flags."""
    p.add_argument("checkpoint", help="runs/NAME/checkpoint.pt")
    p.add_argument("--out", required=True, help="model directory to write, e.g. models/NAME")
    p.add_argument(
        "--dtype",
        choices=contract.DTYPES,
        default=contract.DTYPES[0],
        help="of the weights, KV cache and logits: float32 runs on the CPU provider, float16 on CUDA and the "
        f"CPU, bfloat16 on CUDA only (default: {contract.DTYPES[0]})",
    )
    p.add_argument(
        "--quantize",
        choices=contract.QUANTIZATIONS,
        default=None,
        help="weights for the CPU provider, gated on held-out loss and batch invariance: int8 (activations "
        "quantized per row) or int4 (weight-only blocks, MatMulNBits) (default: none)",
    )
    p.add_argument(
        "--int4-block-size",
        type=int,
        choices=INT4_BLOCK_SIZES,
        default=None,
        help=f"--quantize int4: weights per block sharing one scale (default: {Int4Options.block_size})",
    )
    p.add_argument(
        "--int4-head-block-size",
        type=int,
        choices=INT4_BLOCK_SIZES,
        default=None,
        help=f"--quantize int4: the output head's weights per block (default: {Int4Options.head_block_size})",
    )
    p.add_argument(
        "--int4-accuracy-level",
        type=int,
        choices=ACCURACY_LEVELS,
        default=None,
        help="--quantize int4: what MatMulNBits computes in: 0 unset, 1 float32, 2 float16, 3 bfloat16, 4 int8 "
        f"(default: {Int4Options.accuracy_level})",
    )
    p.add_argument(
        "--parity-steps",
        type=int,
        default=DEFAULT_PARITY_STEPS,
        help=f"greedy decode steps compared (default: {DEFAULT_PARITY_STEPS})",
    )
    p.add_argument(
        "--kv-cache",
        choices=contract.KV_LAYOUTS,
        default=contract.KV_ARENA,
        help=f"decoder KV cache layout: {contract.KV_ARENA} (in place, GroupQueryAttention; the one attnserve "
        f"serve runs) or {contract.KV_CONCAT} (past + new; the KV benchmark's baseline) (default: {contract.KV_ARENA})",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template (Hugging Face's) for tokenizer_config.json, which the OpenAI-compatible "
        "/v1/chat/completions applies; BPE tokenizers only (default: none)",
    )


def read_chat_template(path: str | None) -> str | None:
    """--chat-template's file (the exporter checks that it compiles)."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"--chat-template {path}: {getattr(e, 'strerror', None) or e}") from None


def int4_options(args) -> Int4Options:
    """--int4-block-size, --int4-head-block-size and --int4-accuracy-level over the defaults; ExportError
    without --quantize int4."""
    given = {
        "block_size": args.int4_block_size,
        "head_block_size": args.int4_head_block_size,
        "accuracy_level": args.int4_accuracy_level,
    }
    named = [f"--int4-{field.replace('_', '-')}" for field, value in given.items() if value is not None]
    if named and args.quantize != "int4":
        raise ExportError(f"{named[0]} is for --quantize int4")
    return Int4Options(**{field: value for field, value in given.items() if value is not None})


def main(args) -> int:
    """CLI entry: one-line errors and a non-zero exit; the parity numbers on failure."""
    try:
        manifest = export_checkpoint(
            args.checkpoint,
            args.out,
            args.dtype,
            args.quantize,
            args.parity_steps,
            kv_cache=args.kv_cache,
            chat_template=read_chat_template(args.chat_template),
            int4=int4_options(args),
        )
    except (ExportError, CheckpointError) as e:
        print(f"attnserve export: error: {e}", file=sys.stderr)
        return 2
    except ParityError as e:
        print(f"attnserve export: {e}", file=sys.stderr)
        return 1
    gate = manifest.parity.get("float32_gate", manifest.parity)  # a quantized export nests the float32 gate
    compared = gate["greedy"]["steps"]
    if compared < args.parity_steps:
        print(
            f"attnserve export: --parity-steps {args.parity_steps}: the model's context leaves room for "
            f"{compared} greedy steps after the gate's prompts; {compared} were compared",
            file=sys.stderr,
        )
    print(
        f"wrote {args.out} ({manifest.dtype}{f', {manifest.quantization}' if manifest.quantization else ''}, "
        f"{manifest.kv_cache} KV cache, parity passed)"
    )
    return 0
