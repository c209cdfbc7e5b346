"""Training of the encoder-decoder on source/target pairs, with held-out exact-match accuracy.

The default task is numbers into English words (model/numbers.py), generated on the fly; a
tab-separated file of pairs is a user's own task. Knows nothing of ONNX or gRPC.
"""

from __future__ import annotations

import math
import random
import sys
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID, decode, encode
from .checkpoint import build_model, save_checkpoint
from .config import ModelConfig
from .generate import generate_seq2seq, left_pad
from .numbers import number_pairs, read_pairs


class Seq2SeqError(Exception):
    """Encoder-decoder training cannot start: bad pairs file or options (a one-line reason)."""


@dataclass(frozen=True)
class Seq2SeqTrainConfig:
    lr: float = 2e-3  # peak AdamW learning rate
    warmup_steps: int = 100  # linear warm-up, then cosine decay to lr / 10
    max_steps: int = 2400  # optimizer steps (the cosine schedule spans them; ~10 min on 2 cores)
    time_budget: float | None = None  # seconds of training after which to stop early
    batch_size: int = 64  # pairs per step
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # max global gradient norm
    eval_every: int = 250  # steps between held-out evaluations
    eval_pairs: int = 500  # held-out pairs for exact-match accuracy
    seed: int = 0  # data order and initialisation
    progress: bool = False  # a progress bar on stderr (the CLI turns it on)


def batch_tensors(pairs: list[tuple[str, str]]):
    """Source (left-padded, BOS + bytes), decoder input (BOS + target) and labels (target + EOS, PAD ignored)."""
    src, src_mask, _ = left_pad([encode(s) for s, _ in pairs])
    targets = [list(t.encode("utf-8")) for _, t in pairs]
    t = max(len(x) for x in targets) + 1
    tgt_in = torch.tensor([[BOS_ID, *x] + [PAD_ID] * (t - 1 - len(x)) for x in targets])
    labels = torch.tensor([[*x, EOS_ID] + [PAD_ID] * (t - 1 - len(x)) for x in targets])
    return src, src_mask, tgt_in, labels


def learning_rate(step: int, cfg: Seq2SeqTrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def exact_match(model, pairs: list[tuple[str, str]], batch: int = 100) -> float:
    """Fraction of sources whose greedy translation equals the target exactly."""
    model.eval()
    hits = 0
    for i in range(0, len(pairs), batch):
        chunk = pairs[i : i + batch]
        longest = max(len(t.encode()) for _, t in chunk) + 2
        outputs = generate_seq2seq(model, [encode(s) for s, _ in chunk], min(longest, model.config.max_len))
        hits += sum(decode(o) == t for o, (_, t) in zip(outputs, chunk))
    model.train()
    return hits / len(pairs)


class PairSource:
    """Training pairs: drawn fresh from the number task, or sampled from a user's list."""

    def __init__(self, pairs: list[tuple[str, str]] | None, seed: int):
        self.pairs, self.rng, self.seed = pairs, random.Random(seed), seed

    def batch(self, size: int, step: int) -> list[tuple[str, str]]:
        if self.pairs is None:
            return number_pairs(size, heldout=False, seed=self.seed * 1_000_003 + step)
        return [self.rng.choice(self.pairs) for _ in range(size)]


def train_seq2seq(model, cfg: Seq2SeqTrainConfig, out_path, train_pairs=None, heldout_pairs=None, log=print) -> dict:
    """Train, evaluate exact match periodically, save the checkpoint; returns the final figures."""
    torch.manual_seed(cfg.seed)
    heldout = heldout_pairs or number_pairs(cfg.eval_pairs, heldout=True, seed=cfg.seed + 12345)
    source = PairSource(train_pairs, cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    start, trained, step, accuracy = time.perf_counter(), 0.0, 0, None
    bar = tqdm(
        total=cfg.max_steps,
        unit="step",
        disable=not cfg.progress,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5 if sys.stderr.isatty() else 10.0,
    )
    log = bar.write if cfg.progress else log
    for step in range(cfg.max_steps):
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        src, src_mask, tgt_in, labels = batch_tensors(source.batch(cfg.batch_size, step))
        logits = model(src, src_mask, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=PAD_ID)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        trained += time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix({"loss": f"{loss.item():.4f}", "lr": f"{group['lr']:.2e}"}, refresh=False)
        if (step + 1) % cfg.eval_every == 0:
            accuracy = exact_match(model, heldout[:100])
            log(
                f"step {step + 1:>6}  loss {loss.item():.4f}  held-out exact match (100) {accuracy:.1%}  "
                f"{trained:.0f} s"
            )
        if cfg.time_budget is not None and trained >= cfg.time_budget:
            break
    bar.close()
    accuracy = exact_match(model, heldout)
    save_checkpoint(out_path, model, step=step + 1, heldout_exact_match=accuracy, train_seconds=trained)
    return {
        "steps": step + 1,
        "train_seconds": trained,
        "wall_seconds": time.perf_counter() - start,
        "heldout_exact_match": accuracy,
        "heldout_pairs": len(heldout),
    }


def split_pairs(pairs: list[tuple[str, str]], percent: int = 5) -> tuple[list, list]:
    """A user's pairs split by a hash of the source: the same pairs are held out in every run."""
    heldout = [p for p in pairs if zlib.crc32(p[0].encode()) % 100 < percent]
    train = [p for p in pairs if zlib.crc32(p[0].encode()) % 100 >= percent]
    if not train or not heldout:
        raise Seq2SeqError(f"{len(pairs)} pairs are too few to hold {percent}% out; give at least 40")
    return train, heldout


def user_pairs(path: str, config: ModelConfig) -> tuple[list, list]:
    """Train and held-out pairs of a TSV file; each side must fit the context with BOS or EOS."""
    if not Path(path).is_file():
        raise Seq2SeqError(f"corpus not found: {path} (a file of source<TAB>target lines)")
    try:
        pairs = read_pairs(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise Seq2SeqError(str(e)) from None
    for i, (src, tgt) in enumerate(pairs, 1):
        longest = max(len(src.encode()), len(tgt.encode())) + 1
        if longest > config.max_len:
            raise Seq2SeqError(f"{path}: pair {i} needs {longest} tokens, the context (max_len) is {config.max_len}")
    return split_pairs(pairs)


def main_seq2seq(config: ModelConfig, args) -> int:
    """`attnserve train` for an encoder-decoder preset; ends by printing held-out exact match."""
    try:
        if args.resume:
            raise Seq2SeqError("--resume is for decoder-only training; encoder-decoder runs start fresh")
        if args.device != "cpu":
            raise Seq2SeqError("encoder-decoder training runs on the CPU (--device cpu)")
        train_pairs, heldout = user_pairs(args.corpus, config) if args.corpus else (None, None)
        out = Path(args.out or f"runs/{args.preset}") / "checkpoint.pt"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Seq2SeqError(f"cannot write --out {out.parent}: {e.strerror or e}") from None
    except Seq2SeqError as e:
        print(f"attnserve train: error: {e}", file=sys.stderr)
        return 2
    overrides = {
        "max_steps": args.max_steps,
        "time_budget": args.time_budget,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "eval_every": args.eval_interval,
    }
    cfg = replace(Seq2SeqTrainConfig(progress=True), **{k: v for k, v in overrides.items() if v is not None})
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(cfg.seed)
    model = build_model(config)
    print(
        f"training {config.arch} ({model.num_parameters():,} parameters) on "
        f"{args.corpus or 'numbers into words'}, up to {cfg.max_steps} steps"
        + (f" or {cfg.time_budget:.0f} s" if cfg.time_budget else ""),
        flush=True,
    )
    try:
        result = train_seq2seq(model, cfg, out, train_pairs, heldout)
    except KeyboardInterrupt:
        print("attnserve train: interrupted; nothing saved", file=sys.stderr)
        return 130
    print(f"trained {result['steps']} steps, {result['train_seconds']:.0f} s; checkpoint: {out}")
    print(f"held-out exact match: {result['heldout_exact_match']:.1%} of {result['heldout_pairs']} pairs")
    return 0
