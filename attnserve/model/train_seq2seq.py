"""Training of the encoder-decoder on source/target pairs, with held-out exact-match accuracy.

This is the encoder-decoder's Task; the loop, schedule, checkpoints, resume and DDP are the
Trainer's (trainer.py). The default task is numbers into English words (model/numbers.py),
generated on the fly; a tab-separated file of pairs is a user's own task. Knows nothing of ONNX
or gRPC.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID, decode, encode
from . import distributed
from .config import ENCODER_DECODER, ModelConfig
from .distributed import Ranks
from .generate import generate_seq2seq, left_pad
from .numbers import number_pairs, read_pairs
from .seq2seq import EncoderDecoder
from .trainer import Trainer, TrainerConfig, TrainError, setup


@dataclass(frozen=True)
class Seq2SeqTrainConfig(TrainerConfig):
    lr: float = 2e-3  # peak AdamW learning rate
    warmup_steps: int = 100  # linear warm-up, then cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.01  # AdamW decoupled weight decay, on matrices only
    beta2: float = 0.999  # AdamW second-moment decay
    batch_size: int = 64  # pairs per step, per process
    max_steps: int | None = 2400  # optimizer steps in all (the cosine spans them; ~10 min on 2 cores)
    time_budget: float | None = None  # seconds of training in all after which to stop early
    out_dir: str = "runs/numbers"  # checkpoint.pt goes here
    corpus: str | None = None  # TSV file of source<TAB>target lines (None: numbers into words)
    eval_pairs: int = 500  # held-out pairs of the number task for exact-match accuracy

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_pairs < 1:
            raise TrainError(f"eval_pairs must be at least 1, got {self.eval_pairs}")


def batch_tensors(pairs: list[tuple[str, str]]):
    """Source (left-padded, BOS + bytes), decoder input (BOS + target) and labels (target + EOS, PAD ignored)."""
    src, src_mask, _ = left_pad([encode(s) for s, _ in pairs], PAD_ID)
    targets = [list(t.encode("utf-8")) for _, t in pairs]
    t = max(len(x) for x in targets) + 1
    tgt_in = torch.tensor([[BOS_ID, *x] + [PAD_ID] * (t - 1 - len(x)) for x in targets])
    labels = torch.tensor([[*x, EOS_ID] + [PAD_ID] * (t - 1 - len(x)) for x in targets])
    return src, src_mask, tgt_in, labels


@torch.no_grad()
def count_matches(model: EncoderDecoder, pairs: list[tuple[str, str]], batch: int = 100) -> int:
    """Sources whose greedy translation equals the target exactly."""
    hits = 0
    for i in range(0, len(pairs), batch):
        chunk = pairs[i : i + batch]
        longest = max(len(t.encode()) for _, t in chunk) + 2
        sources, steps = [encode(s) for s, _ in chunk], min(longest, model.config.max_len)
        outputs = generate_seq2seq(model, sources, steps, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)
        hits += sum(decode(o) == t for o, (_, t) in zip(outputs, chunk))
    model.train()
    return hits


def exact_match(model: EncoderDecoder, pairs: list[tuple[str, str]]) -> float:
    """Fraction of sources whose greedy translation equals the target exactly."""
    return count_matches(model, pairs) / len(pairs)


class PairSource:
    """Training pairs: drawn fresh from the number task, or sampled from a user's list; batch k of a
    (seed, rank) stream is always the same, so a resumed run sees what an uninterrupted one would."""

    def __init__(self, pairs: list[tuple[str, str]] | None, seed: int, rank: int = 0):
        self.pairs, self.seed = pairs, seed * 1_000_003 + rank * 7_919

    def batch(self, size: int, step: int) -> list[tuple[str, str]]:
        seed = self.seed + step * 104_729
        if self.pairs is None:
            return number_pairs(size, heldout=False, seed=seed)
        rng = random.Random(seed)
        return [rng.choice(self.pairs) for _ in range(size)]


class Seq2SeqTask:
    """The encoder-decoder's part of training: pairs as tensors, next-byte loss on the targets,
    held-out exact match (each rank translates its share)."""

    metric, lower_is_better = "heldout_exact_match", False

    def __init__(self, cfg: Seq2SeqTrainConfig, train_pairs, heldout: list, ranks: Ranks, device: torch.device):
        self.source, self.batch_size = PairSource(train_pairs, cfg.seed, ranks.rank), cfg.batch_size
        self.heldout, self.device = heldout[ranks.rank :: ranks.world_size], device

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        return batch_tensors(self.source.batch(self.batch_size, step))

    def loss(
        self,
        net: torch.nn.Module,
        batch: tuple[torch.Tensor, ...],
        dtype: torch.dtype | None,  # noqa: ARG002 (the Task's signature: this step takes no autocast dtype)
    ) -> torch.Tensor:
        src, src_mask, tgt_in, labels = batch
        logits = net(src, src_mask, tgt_in)  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=PAD_ID)

    def evaluate(self, model: torch.nn.Module) -> float:
        assert isinstance(model, EncoderDecoder)
        hits, count = distributed.sum_all([float(count_matches(model, self.heldout)), len(self.heldout)], self.device)
        return hits / count

    def describe(self, value: float) -> str:
        return f"{value:.1%} exact match"

    def checkpoint_extra(self) -> dict:
        return {}  # the byte tokenizer, which a checkpoint without one means


def split_pairs(pairs: list[tuple[str, str]], percent: int = 5) -> tuple[list, list]:
    """A user's pairs split by a hash of the source: the same pairs are held out in every run."""
    heldout = [p for p in pairs if zlib.crc32(p[0].encode()) % 100 < percent]
    train = [p for p in pairs if zlib.crc32(p[0].encode()) % 100 >= percent]
    if not train or not heldout:
        raise TrainError(f"{len(pairs)} pairs are too few to hold {percent}% out; give at least 40")
    return train, heldout


def user_pairs(path: str, config: ModelConfig) -> tuple[list, list]:
    """Train and held-out pairs of a TSV file; each side must fit the context with BOS or EOS."""
    if not Path(path).is_file():
        raise TrainError(f"--corpus {path}: no such file (a file of source<TAB>target lines)")
    try:
        pairs = read_pairs(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise TrainError(f"--corpus {e}") from None
    for i, (src, tgt) in enumerate(pairs, 1):
        longest = max(len(src.encode()), len(tgt.encode())) + 1
        if longest > config.max_len:
            raise TrainError(
                f"--corpus {path}: pair {i} needs {longest} tokens, the context (max_len) is {config.max_len}"
            )
    return split_pairs(pairs)


def train_seq2seq(
    model_config: ModelConfig,
    cfg: Seq2SeqTrainConfig,
    train_pairs: list | None = None,
    heldout_pairs: list | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train an encoder-decoder on the given pairs, cfg.corpus, or the number task; every rank returns
    the figures and its model (rank 0 wrote the checkpoint)."""
    if model_config.arch != ENCODER_DECODER:
        raise TrainError(f"train_seq2seq() trains encoder-decoders; the {model_config.arch} trains with train()")
    if train_pairs is None and cfg.corpus is not None:
        train_pairs, heldout_pairs = user_pairs(cfg.corpus, model_config)
    heldout = heldout_pairs or number_pairs(cfg.eval_pairs, heldout=True, seed=cfg.seed + 12345)
    ranks, device, state = setup(cfg)
    with distributed.process_group(ranks, device):
        task = Seq2SeqTask(cfg, train_pairs, heldout, ranks, device)
        result = Trainer(model_config, cfg, ranks, device, task, state).fit(log)
    return {**result, "heldout_pairs": len(heldout)}
