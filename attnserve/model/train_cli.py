"""`attnserve train`: the two configs built once from the command line, the architecture's Task
run through the one Trainer, one-line errors, and the held-out figure printed last.

Knows nothing of the loop (trainer.py) or of either architecture's data (train.py,
train_seq2seq.py): it picks which one the preset asks for.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..tokenizer import KINDS as TOKENIZERS
from . import distributed
from .config import ENCODER_DECODER, POSITIONALS, PRESETS, ModelConfig, preset
from .data import DataError
from .distributed import DeviceError
from .train import DEFAULT_BPE_VOCAB, DEFAULT_TOKENIZER, TrainConfig, train
from .train_seq2seq import Seq2SeqTrainConfig, train_seq2seq
from .trainer import MODEL_FLAGS, NAMED_FLAGS, PRECISIONS, TrainerConfig, TrainError, flag_of

MIN_CONTEXT = 8  # BOS plus a few bytes per window
HEAD_DIM_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention needs head_size % 8 == 0
DEFAULT_PRESET = "small"


def shown(name: str) -> str:
    """A config field's default as help shows it: the decoder's, then the encoder-decoder's if it differs."""
    lm, seq2seq = (getattr(config, name) for config in (TrainConfig, Seq2SeqTrainConfig))
    show = lambda value: "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
    return show(lm) if lm == seq2seq else f"{show(lm)}; encoder-decoders {show(seq2seq)}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`attnserve train`'s flags. A flag left out (None) keeps the default of the preset's architecture:
    TrainConfig's or Seq2SeqTrainConfig's, which the help shows."""
    p.epilog = "data-parallel: torchrun --nproc_per_node=N -m attnserve.cli train ..."
    p.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"model preset: {', '.join(PRESETS)} (default: {DEFAULT_PRESET})"
    )
    p.add_argument(
        "--corpus",
        default=None,
        help="text file or folder of .txt files (default: CPython's pydoc topics); for an encoder-decoder "
        "preset, a file of source<TAB>target lines (default: numbers into words)",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/PRESET)")
    p.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default=None,
        help=f"bpe: a byte-level BPE trained on the training split in seconds; bytes: UTF-8 bytes, BOS first "
        f"(default: {DEFAULT_TOKENIZER}; --resume keeps the checkpoint's)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help=f"BPE ids in all, 259 (3 special + 256 bytes) and up (default: {DEFAULT_BPE_VOCAB})",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help=f"stop after N optimizer steps in all (default: {shown('max_steps')})",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help=f"stop after this many seconds of training in all, eval excluded (default: {shown('time_budget')}; "
        "none once --max-steps is given)",
    )
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default=TrainerConfig.device, help=f"(default: {TrainerConfig.device})"
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=TrainerConfig.precision,
        help=f"bf16 autocast, fp32, or auto: bf16 where the hardware has it (default: {TrainerConfig.precision})",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=TrainerConfig.seed,
        help=f"seed of the initialisation and the batches (default: {TrainerConfig.seed})",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (step, optimizer)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"windows (pairs) per step per process (default: {shown('batch_size')})",
    )
    p.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default: {shown('lr')})")
    p.add_argument(
        "--eval-interval",
        type=int,
        default=None,
        help=f"steps between held-out evaluations (default: {shown('eval_interval')})",
    )
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
        help=f"tokens per window, the model's max_len (at least {MIN_CONTEXT})",
    )
    size.add_argument("--d-model", type=int, default=None, metavar="N", help="width of the residual stream")
    size.add_argument("--n-layers", type=int, default=None, metavar="N", help="decoder layers")
    size.add_argument(
        "--n-heads",
        type=int,
        default=None,
        metavar="N",
        help=f"attention heads; d-model / n-heads must be a multiple of {HEAD_DIM_MULTIPLE}",
    )
    size.add_argument("--d-ff", type=int, default=None, metavar="N", help="hidden width of the feed-forward")
    size.add_argument(
        "--positional",
        choices=POSITIONALS,
        default=None,
        help="token positions: sinusoidal (the lectures'), learned (GPT-2's) or rotary (Llama's); decoder-only "
        "presets (default: sinusoidal, every preset's)",
    )


def model_overrides(args) -> dict:
    """The ModelConfig fields set by model-size flags given on the command line; each a positive integer."""
    given = {d: getattr(args, d) for d in MODEL_FLAGS if getattr(args, d, None) is not None}
    for dest, value in given.items():
        if value < 1:
            raise TrainError(f"{flag_of(MODEL_FLAGS[dest])} must be a positive integer, got {value}")
    return {MODEL_FLAGS[d]: v for d, v in given.items()}


def check_model_size(fields: dict) -> None:
    """Refuse a context or head size the model, or its ONNX export, cannot take."""
    n, d, h = fields["max_len"], fields["d_model"], fields["n_heads"]
    if n < MIN_CONTEXT:
        raise TrainError(f"--context-length must be at least {MIN_CONTEXT}, got {n}")
    if d % h:
        raise TrainError(f"--d-model {d} is not divisible by --n-heads {h}")
    if (d // h) % HEAD_DIM_MULTIPLE:
        raise TrainError(
            f"head dim --d-model {d} / --n-heads {h} = {d // h} must be a multiple of "
            f"{HEAD_DIM_MULTIPLE} (ONNX Runtime's GroupQueryAttention requires it)"
        )


def model_config_from_args(args) -> ModelConfig:
    """The preset's config with the model-size flags given applied, checked before it is built."""
    overrides = model_overrides(args)
    overrides.update({field: getattr(args, field) for field in NAMED_FLAGS if getattr(args, field, None) is not None})
    try:
        base = preset(args.preset)
    except KeyError:
        raise TrainError(f"--preset must be one of {', '.join(sorted(PRESETS))}, not {args.preset!r}") from None
    if base.arch == ENCODER_DECODER and overrides.get("positional") == "rotary":
        raise TrainError("--positional rotary is for decoder-only models; an encoder-decoder adds its positions")
    if overrides:
        check_model_size({**base.to_dict(), **overrides})
    return replace(base, **overrides)


def configs_from_args(args) -> tuple[ModelConfig, TrainerConfig]:
    """The two configs, built once from the command line; only flags given override defaults."""
    model_config = model_config_from_args(args)
    common = dict(
        out_dir=args.out or f"runs/{args.preset}",
        corpus=args.corpus,
        device=args.device,
        precision=args.precision,
        seed=args.seed,
        resume=args.resume,
    )
    tokenizer, vocab_size = getattr(args, "tokenizer", None), getattr(args, "vocab_size", None)
    cfg: TrainerConfig
    if model_config.arch == ENCODER_DECODER:
        if tokenizer not in (None, "bytes") or vocab_size is not None:
            raise TrainError("--tokenizer bpe is for decoder-only models; encoder-decoders train on bytes")
        cfg = Seq2SeqTrainConfig(**common)
    else:
        cfg = TrainConfig(**common, tokenizer=tokenizer, vocab_size=vocab_size)
    if args.max_steps is not None:
        cfg = replace(cfg, max_steps=args.max_steps, time_budget=args.time_budget)
    elif args.time_budget is not None:
        cfg = replace(cfg, time_budget=args.time_budget)
    flags = ("batch_size", "lr", "eval_interval", "threads")
    overrides = {k: getattr(args, k) for k in flags if getattr(args, k, None) is not None}
    return model_config, replace(cfg, **overrides)


def summary(result: dict) -> str:
    """The last lines a run prints: what was trained, then the held-out figure."""
    speed = f"{result['tokens_per_second']:,.0f} tokens/s"
    trained = f"trained {result['steps']} steps, {result['train_seconds']:.0f} s ({speed}"
    if "heldout_exact_match" in result:
        return (
            f"{trained}, {result['parameters']:,} parameters); checkpoint: {result['checkpoint']}\n"
            f"held-out exact match: {result['heldout_exact_match']:.1%} of {result['heldout_pairs']} pairs"
        )
    tokenizer = result["tokenizer"]
    return (
        f"{trained}, {result['parameters']:,} parameters, {tokenizer.kind} tokenizer of {tokenizer.vocab_size} ids); "
        f"checkpoint: {result['checkpoint']}\nheld-out: {result['heldout_bpb']:.3f} bits per byte"
    )


def main(args) -> int:
    """CLI entry: one-line errors and exit 2; ends by printing the held-out figure."""
    try:
        model_config, cfg = configs_from_args(args)
        if isinstance(cfg, Seq2SeqTrainConfig):
            result = train_seq2seq(model_config, cfg)
        else:
            assert isinstance(cfg, TrainConfig)
            result = train(model_config, cfg)
    except (TrainError, DataError, DeviceError) as e:
        print(f"attnserve train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnserve train: interrupted; the checkpoint is saved, --resume continues", file=sys.stderr)
        return 130
    if distributed.ranks_from_env().is_main:
        print(summary(result))
    return 0
