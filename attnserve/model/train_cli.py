"""`attnserve train`: the two configs built once from the command line, the architecture's Task
run through the one Trainer, one-line errors, and the held-out figure printed last.

Knows nothing of the loop (trainer.py) or of either architecture's data (train.py,
train_seq2seq.py): it picks which one the preset asks for.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from . import distributed
from .config import ENCODER_DECODER, ModelConfig, preset
from .data import DataError
from .distributed import DeviceError
from .train import TrainConfig, train
from .train_seq2seq import Seq2SeqTrainConfig, train_seq2seq
from .trainer import MODEL_FLAGS, TrainerConfig, TrainError, flag_of

MIN_CONTEXT = 8  # BOS plus a few bytes per window
HEAD_DIM_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention needs head_size % 8 == 0


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
    try:
        base = preset(args.preset)
    except KeyError as e:
        raise TrainError(e.args[0]) from None
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
