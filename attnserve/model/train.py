"""Training of the decoder language model on a text corpus: a tokenizer (bytes, or a BPE trained
on the training split), random windows of the corpus, next-token loss, held-out loss in bits per
byte (comparable across tokenizers).

This is the decoder's Task; the loop, schedule, checkpoints, resume and DDP are the Trainer's
(trainer.py), the data windows data.py's, the tokenizers attnserve.tokenizer's. Knows nothing of
ONNX or gRPC. The encoder-decoder's Task is in train_seq2seq.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..tokenizer import KINDS as TOKENIZERS
from ..tokenizer import Tokenizer, TokenizerError, from_state
from . import distributed
from .config import DECODER, ModelConfig
from .data import HELDOUT_FRACTION, ByteBatches, DataError, heldout_batches, read_corpus, split_heldout
from .distributed import Ranks
from .trainer import Trainer, TrainerConfig, TrainError, setup

DEFAULT_TOKENIZER = "bpe"  # measured: make tokenizer-table (docs/reports/tokenizers.md)
DEFAULT_BPE_VOCAB = 2048


@dataclass(frozen=True)
class TrainConfig(TrainerConfig):
    eval_windows: int = 256  # fixed held-out windows per evaluation (evenly spaced)
    corpus: str | None = None  # text file or folder of .txt files (None: CPython's pydoc topics)
    tokenizer: str | None = None  # "bytes" (UTF-8, BOS first) or "bpe" (trained on the training split);
    #                                      None: a resumed run's own, else DEFAULT_TOKENIZER
    vocab_size: int | None = None  # BPE ids in all, specials included (None: DEFAULT_BPE_VOCAB)
    heldout_fraction: float = HELDOUT_FRACTION  # tail of the corpus held out

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_windows < 1:
            raise TrainError(f"eval_windows must be at least 1, got {self.eval_windows}")
        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise TrainError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.vocab_size is not None and self.tokenizer == "bytes":
            raise TrainError("--vocab-size is the BPE tokenizer's; the byte tokenizer has 259 ids")


@dataclass(frozen=True)
class Corpus:
    """The tokenized corpus: the tokenizer, its training and held-out ids, and the bytes per id."""

    tokenizer: Tokenizer
    train: bytes | list[int]  # bytes are the byte tokenizer's ids
    heldout: bytes | list[int]
    byte_lengths: torch.Tensor  # (V,) UTF-8 bytes each id stands for: held-out loss per byte

    @property
    def bos(self) -> int | None:
        """BOS starts each window where it starts each prompt (bytes); BPE windows are plain slices."""
        return self.tokenizer.bos_id if self.tokenizer.add_bos else None


def resolve_tokenizer(cfg: TrainConfig, state: dict | None) -> TrainConfig:
    """The config with the tokenizer and BPE size this run uses: a resumed run keeps the
    checkpoint's (flags given must agree with it), a new one takes the defaults."""
    if state is None:
        kind = cfg.tokenizer or DEFAULT_TOKENIZER
        return replace(cfg, tokenizer=kind, vocab_size=(cfg.vocab_size or DEFAULT_BPE_VOCAB) if kind == "bpe" else None)
    saved = from_state(state.get("tokenizer")).kind
    saved_vocab = state.get("train_config", {}).get("vocab_size")
    if cfg.tokenizer not in (None, saved):
        raise TrainError(f"--resume: the checkpoint's tokenizer is {saved}, not --tokenizer {cfg.tokenizer}")
    if cfg.vocab_size not in (None, saved_vocab):
        raise TrainError(
            f"--resume: the checkpoint's BPE was trained with --vocab-size {saved_vocab}, not {cfg.vocab_size}"
        )
    return replace(cfg, tokenizer=saved, vocab_size=saved_vocab)


def check_ranks_agree(tokenizer: Tokenizer, device: torch.device) -> None:
    """Under DDP every rank trains its own BPE from the same text; all ranks see the same sums and
    so take the same decision: go on only if every rank's tokenizer is the same."""
    digest = float(int(hashlib.sha256(json.dumps(tokenizer.state(), sort_keys=True).encode()).hexdigest()[:5], 16))
    n, total, squares = distributed.sum_all([1.0, digest, digest * digest], device)
    if n * squares != total * total:  # equality holds only when every digest is the same
        raise TrainError(
            "the ranks trained different BPE tokenizers from the same text; train one with "
            "a single process and --resume it under torchrun"
        )


def tokenize_corpus(data: bytes, cfg: TrainConfig, block: int, state: dict | None) -> Corpus:
    """Split the bytes, then tokenize both parts: a new BPE learns from the training part only;
    a resumed run's tokenizer is the checkpoint's, never retrained. `cfg` is resolved."""
    bpe = cfg.tokenizer == "bpe"
    try:
        train_bytes, heldout_bytes = split_heldout(data, block, cfg.heldout_fraction, whole_characters=bpe)
    except DataError as e:  # only a corpus of the user's can be this short
        raise DataError(f"--corpus {cfg.corpus}: {e}") from None
    try:
        if state is not None:
            tokenizer = from_state(state.get("tokenizer"))
        elif bpe:
            from ..tokenizer.bpe import train_bpe

            tokenizer = train_bpe(train_bytes.decode("utf-8", errors="replace"), cfg.vocab_size or DEFAULT_BPE_VOCAB)
        else:
            tokenizer = from_state(None)
    except TokenizerError as e:
        raise TrainError(str(e)) from None
    lengths = torch.tensor(tokenizer.byte_lengths())
    if not bpe:
        return Corpus(tokenizer, train_bytes, heldout_bytes, lengths)
    train_ids, heldout_ids = (
        tokenizer.encode(part.decode("utf-8", errors="replace")) for part in (train_bytes, heldout_bytes)
    )
    if len(train_ids) < block + 1:
        raise DataError(
            f"corpus too short: the training split is {len(train_ids)} BPE tokens, need at least "
            f"{block + 1} (one window of --context-length {block} and its target)"
        )
    return Corpus(tokenizer, train_ids, heldout_ids, lengths)


def lm_inputs(x: torch.Tensor, config: ModelConfig, dtype: torch.dtype | None = None):
    """Mask, positions and an empty past (in the compute dtype, so no casts) for windows x (B, T)."""
    b, t = x.shape
    mask = torch.ones(b, t, dtype=torch.long, device=x.device)  # (B, T)
    positions = torch.arange(t, device=x.device).expand(b, t)  # (B, T)
    empty = x.new_zeros((b, config.kv_heads, 0, config.d_k), dtype=dtype or torch.float32)  # (B, H_kv, 0, D)
    return x, mask, positions, [(empty, empty) for _ in range(config.n_layers)]


class LMTask:
    """The decoder's part of training: random windows, next-token loss, held-out bits per byte."""

    metric, lower_is_better = "heldout_bpb", True

    def __init__(self, config: ModelConfig, cfg: TrainConfig, corpus: Corpus, ranks: Ranks, device: torch.device):
        self.config, self.corpus, self.device, block = config, corpus, device, config.max_len
        self.batches = ByteBatches(corpus.train, block, cfg.batch_size, cfg.seed, ranks.rank, corpus.bos)
        self.heldout = heldout_batches(
            corpus.heldout, block, cfg.batch_size, cfg.eval_windows, ranks.rank, ranks.world_size, corpus.bos
        )

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches.batch(step)

    def loss(self, net: torch.nn.Module, batch: tuple[torch.Tensor, ...], dtype: torch.dtype | None) -> torch.Tensor:
        x, y = batch
        logits = net(*lm_inputs(x, self.config, dtype))[0]  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> float:
        """Held-out cross entropy in bits per byte (nats / ln 2 over the UTF-8 bytes the targets stand
        for, whatever the tokenizer), in float32 as exported, over all ranks."""
        model.eval()
        total, count = 0.0, 0
        for x, y in self.heldout:
            logits = model(*lm_inputs(x.to(self.device), self.config))[0]  # (B, T, V)
            total += F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), y.to(self.device).reshape(-1), reduction="sum"
            ).item()
            count += int(self.corpus.byte_lengths[y].sum())
        model.train()
        nats, nbytes = distributed.sum_all([total, float(count)], self.device)
        return nats / nbytes / math.log(2)

    def describe(self, value: float) -> str:
        return f"{value:.3f} bits per byte"

    def checkpoint_extra(self) -> dict:
        return {"tokenizer": self.corpus.tokenizer.state()}


def train(model_config: ModelConfig, cfg: TrainConfig, log: Callable[[str], None] | None = None) -> dict:
    """Train a decoder LM; every rank returns the figures and its model (rank 0 wrote the checkpoint)."""
    if model_config.arch != DECODER:
        raise TrainError(f"train() trains decoders; the {model_config.arch} trains with train_seq2seq()")
    ranks, device, state = setup(cfg)
    cfg = resolve_tokenizer(cfg, state)
    corpus = tokenize_corpus(read_corpus(cfg.corpus), cfg, model_config.max_len, state)
    model_config = replace(model_config, vocab_size=corpus.tokenizer.vocab_size)
    with distributed.process_group(ranks, device):
        check_ranks_agree(corpus.tokenizer, device)
        task = LMTask(model_config, cfg, corpus, ranks, device)
        result = Trainer(model_config, cfg, ranks, device, task, state).fit(log)
    return {**result, "tokenizer": corpus.tokenizer}
