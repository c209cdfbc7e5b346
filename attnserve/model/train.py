"""Training of the decoder language model on a text corpus: a tokenizer (bytes, or a BPE trained
on the training split), AdamW, warm-up then cosine decay, gradient clipping, held-out loss in bits
per byte (comparable across tokenizers), checkpoints with resume, DDP under torchrun.

The data (data.py), the schedule (schedule.py), the process group (distributed.py) and the
tokenizers (attnserve.tokenizer) live elsewhere; nothing here knows of ONNX or gRPC. The
encoder-decoder trains in train_seq2seq.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ..tokenizer import KINDS as TOKENIZERS
from ..tokenizer import Tokenizer, TokenizerError, from_state
from . import distributed
from .checkpoint import CheckpointError, build_model, load_state, save_checkpoint
from .config import ModelConfig, preset
from .data import HELDOUT_FRACTION, ByteBatches, DataError, heldout_batches, read_corpus, split_heldout
from .distributed import DeviceError, Ranks
from .progress import ProgressBar
from .schedule import budget_progress, budget_spent, learning_rate

CHECKPOINT = "checkpoint.pt"
# `attnserve train` model-size flags (argparse dest) -> the ModelConfig field each overrides
MODEL_FLAGS = {
    "context_length": "max_len",
    "d_model": "d_model",
    "n_layers": "n_layers",
    "n_heads": "n_heads",
    "d_ff": "d_ff",
}
MIN_CONTEXT = 8  # BOS plus a few bytes per window
HEAD_DIM_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention needs head_size % 8 == 0
DEFAULT_TOKENIZER = "bpe"  # measured: make tokenizer-table (README, "attnserve train")
DEFAULT_BPE_VOCAB = 2048


class TrainError(Exception):
    """Training cannot start: bad options, an unwritable --out, a mismatched --resume."""


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 5e-3  # peak AdamW learning rate
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay, on matrices only
    beta2: float = 0.99  # AdamW second-moment decay (0.99: small models, small batches)
    batch_size: int = 32  # windows of max_len bytes per step, per process
    grad_clip: float = 1.0  # max global gradient norm
    eval_interval: int = 250  # steps between held-out evaluations and checkpoints
    eval_windows: int = 256  # fixed held-out windows per evaluation (evenly spaced)
    max_steps: int | None = None  # stop after this many steps in all (resumes count on)
    time_budget: float | None = 180.0  # stop after this many seconds of training in all (eval excluded)
    seed: int = 0  # initialisation and batches (each rank samples its own stream)
    device: str = "cpu"  # "cpu" or "cuda"
    precision: str = "auto"  # "bf16" autocast, "fp32", or "auto": bf16 where the hardware has it
    threads: int | None = None  # CPU threads per process (None: OMP_NUM_THREADS or cores / processes)
    corpus: str | None = None  # text file or folder of .txt files (None: CPython's pydoc topics)
    tokenizer: str | None = None  # "bytes" (UTF-8, BOS first) or "bpe" (trained on the training split);
    #                                      None: a resumed run's own, else DEFAULT_TOKENIZER
    vocab_size: int | None = None  # BPE ids in all, specials included (None: DEFAULT_BPE_VOCAB)
    heldout_fraction: float = HELDOUT_FRACTION  # tail of the corpus held out
    out_dir: str = "runs/small"  # checkpoint.pt goes here
    resume: bool = False  # continue from out_dir/checkpoint.pt (weights, optimizer, step)
    progress: bool = True  # progress bar on rank 0

    def __post_init__(self) -> None:
        for name in ("batch_size", "eval_interval", "eval_windows"):
            if getattr(self, name) < 1:
                raise TrainError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise TrainError(f"threads must be at least 1, got {self.threads}")
        if self.max_steps is not None and self.max_steps < 0:
            raise TrainError(f"max_steps must be >= 0, got {self.max_steps}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise TrainError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise TrainError(f"time_budget must be positive, got {self.time_budget}")
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


def prepare_out(out_dir: str | Path, rank: int) -> Path:
    """Create the run folder and prove it writable now, not after minutes of training."""
    out = Path(out_dir)
    probe = out / f".write-test-{rank}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise TrainError(f"cannot write --out {out}: {e.strerror or e}") from None
    return out


def resume_state(path: Path) -> dict:
    """The checkpoint to continue from: weights, optimizer and step."""
    try:
        state = load_state(path)
    except CheckpointError as e:
        raise TrainError(f"--resume: {e}") from None
    if "optimizer" not in state or "step" not in state:
        raise TrainError(f"--resume: {path} holds no optimizer state or step to continue from")
    return state


def check_resumed_config(state: dict, path: Path, model_config: ModelConfig) -> None:
    """A resumed run's model config must be the one asked for."""
    if state["config"] != model_config.to_dict():
        raise TrainError(
            f"--resume: {path} was trained with another model config than the one asked for: "
            + config_differences(state["config"], model_config.to_dict())
        )


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
    train_bytes, heldout_bytes = split_heldout(data, block, cfg.heldout_fraction, whole_characters=bpe)
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


def flag_of(field: str) -> str:
    """The command-line flag that sets a ModelConfig field, or the field's own name if none does."""
    dest = {f: d for d, f in MODEL_FLAGS.items()}.get(field)
    return f"--{dest.replace('_', '-')}" if dest else field


def config_differences(saved: dict, asked: dict) -> str:
    """'FLAG was SAVED, not ASKED' for each field that differs, e.g. '--d-model was 64, not 32'."""
    fields = sorted(set(saved) | set(asked))
    return "; ".join(
        f"{flag_of(f)} was {saved.get(f)}, not {asked.get(f)}" for f in fields if saved.get(f) != asked.get(f)
    )


def lm_inputs(x: torch.Tensor, config: ModelConfig, dtype: torch.dtype | None = None):
    """Mask, positions and an empty past (in the compute dtype, so no casts) for windows x (B, T)."""
    b, t = x.shape
    mask = torch.ones(b, t, dtype=torch.long, device=x.device)  # (B, T)
    positions = torch.arange(t, device=x.device).expand(b, t)  # (B, T)
    empty = x.new_zeros((b, config.n_heads, 0, config.d_k), dtype=dtype or torch.float32)  # (B, H, 0, D)
    return x, mask, positions, [(empty, empty) for _ in range(config.n_layers)]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (fused: one kernel for all parameters, 6x faster on CPU); no decay on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)


class Trainer:
    """One run's model, optimizer, data and counters; `fit` is the loop."""

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: TrainConfig,
        ranks: Ranks,
        device: torch.device,
        corpus: Corpus,
        state: dict | None,
    ):
        self.cfg, self.ranks, self.device, self.config, self.corpus = cfg, ranks, device, model_config, corpus
        self.autocast = distributed.autocast_dtype(cfg.precision, device)
        torch.manual_seed(cfg.seed)
        self.model = build_model(model_config).to(device)
        self.optimizer = make_optimizer(self.model, cfg)
        self.step, self.seconds, self.last_bpb, self.best_bpb = 0, 0.0, None, None
        if state is not None:
            self.restore(state)
        self.start_step, self.start_seconds, self.evaluated_at = self.step, self.seconds, None
        self.net = self.model
        if ranks.distributed:
            self.net = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        block = model_config.max_len
        self.batches = ByteBatches(corpus.train, block, cfg.batch_size, cfg.seed, ranks.rank, corpus.bos)
        self.heldout = heldout_batches(
            corpus.heldout, block, cfg.batch_size, cfg.eval_windows, ranks.rank, ranks.world_size, corpus.bos
        )

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.seconds = int(state["step"]), float(state.get("train_seconds", 0.0))
        self.last_bpb, self.best_bpb = state.get("heldout_bpb"), state.get("best_heldout_bpb")

    def learning_rate(self) -> float:
        c = self.cfg
        progress = budget_progress(self.step, self.seconds, c.max_steps, c.time_budget, c.warmup_steps)
        return learning_rate(self.step, progress, c.lr, c.warmup_steps, c.min_lr_ratio)

    def train_step(self) -> tuple[float, float]:
        """One optimizer step on this rank's batch; DDP averages the gradients. Returns (loss, lr)."""
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = (t.to(self.device, non_blocking=True) for t in self.batches.batch(self.step))
        with torch.autocast(self.device.type, dtype=self.autocast or torch.float32, enabled=bool(self.autocast)):
            logits = self.net(*lm_inputs(x, self.config, self.autocast))[0]  # (B, T, V)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return loss.item(), lr

    @torch.no_grad()
    def evaluate(self) -> float:
        """Held-out cross entropy in bits per byte (nats / ln 2 over the UTF-8 bytes the targets stand
        for, whatever the tokenizer), in float32 as exported, over all ranks."""
        self.model.eval()
        total, count = 0.0, 0
        for x, y in self.heldout:
            logits = self.model(*lm_inputs(x.to(self.device), self.config))[0]  # (B, T, V)
            total += F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), y.to(self.device).reshape(-1), reduction="sum"
            ).item()
            count += int(self.corpus.byte_lengths[y].sum())
        self.model.train()
        total, count = distributed.sum_all([total, float(count)], self.device)
        return total / count / math.log(2)

    def tokens_per_second(self) -> float:
        tokens = (self.step - self.start_step) * self.cfg.batch_size * self.config.max_len * self.ranks.world_size
        return tokens / max(self.seconds - self.start_seconds, 1e-9)

    def checkpoint_path(self) -> Path:
        return Path(self.cfg.out_dir) / CHECKPOINT

    def save(self) -> None:
        """Rank 0 writes weights, optimizer, step and the held-out figures (all weights_only-loadable)."""
        if self.ranks.is_main:
            save_checkpoint(
                self.checkpoint_path(),
                self.model,
                optimizer=self.optimizer.state_dict(),
                step=self.step,
                train_seconds=self.seconds,
                train_config=asdict(self.cfg),
                heldout_bpb=self.last_bpb,
                best_heldout_bpb=self.best_bpb,
                world_size=self.ranks.world_size,
                tokenizer=self.corpus.tokenizer.state(),
            )

    def evaluate_and_save(self, log: Callable[[str], None]) -> None:
        self.last_bpb = self.evaluate()
        self.best_bpb = self.last_bpb if self.best_bpb is None else min(self.best_bpb, self.last_bpb)
        self.evaluated_at = self.step
        self.save()
        log(
            f"step {self.step}: held-out {self.last_bpb:.3f} bits per byte (best {self.best_bpb:.3f}), "
            f"{self.seconds:.0f} s of training"
        )

    def out_of_budget(self) -> bool:
        """All ranks agree: rank 0's clock decides when a time budget is set."""
        if self.cfg.time_budget is not None:
            self.seconds = distributed.broadcast_float(self.seconds, self.device)
        return budget_spent(self.step, self.seconds, self.cfg.max_steps, self.cfg.time_budget)

    def fit(self, log: Callable[[str], None]) -> None:
        """Step until the budget is spent, evaluating and checkpointing every eval_interval steps."""
        bar = ProgressBar(self.cfg, self.step, enabled=self.ranks.is_main and self.cfg.progress)
        log = bar.write if log is None else log
        try:
            while not self.out_of_budget():
                start = time.perf_counter()
                loss, lr = self.train_step()
                self.step += 1
                self.seconds += time.perf_counter() - start
                bar.update(self.step, loss, lr, self.tokens_per_second(), self.last_bpb)
                if self.step % self.cfg.eval_interval == 0:
                    self.evaluate_and_save(log)
            if self.evaluated_at != self.step:
                self.evaluate_and_save(log)
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            bar.close()

    def result(self) -> dict:
        return {
            "steps": self.step,
            "start_step": self.start_step,
            "train_seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second(),
            "heldout_bpb": self.last_bpb,
            "best_heldout_bpb": self.best_bpb,
            "checkpoint": self.checkpoint_path(),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "model": self.model,
            "tokenizer": self.corpus.tokenizer,
        }


def train(model_config: ModelConfig, cfg: TrainConfig, log: Callable[[str], None] | None = None) -> dict:
    """Train a decoder LM; every rank returns the figures and its model (rank 0 wrote the checkpoint)."""
    if model_config.arch != "decoder":
        raise TrainError(f"training the {model_config.arch} architecture here is not supported yet")
    ranks = distributed.ranks_from_env()
    device = distributed.pick_device(cfg.device, ranks)
    if device.type == "cpu":
        torch.set_num_threads(distributed.cpu_threads(ranks, cfg.threads))
    prepare_out(cfg.out_dir, ranks.rank)
    path = Path(cfg.out_dir) / CHECKPOINT
    state = resume_state(path) if cfg.resume else None
    cfg = resolve_tokenizer(cfg, state)
    corpus = tokenize_corpus(read_corpus(cfg.corpus), cfg, model_config.max_len, state)
    model_config = replace(model_config, vocab_size=corpus.tokenizer.vocab_size)
    if state is not None:
        check_resumed_config(state, path, model_config)
    created = distributed.init(ranks, device)
    try:
        check_ranks_agree(corpus.tokenizer, device)
        trainer = Trainer(model_config, cfg, ranks, device, corpus, state)
        trainer.fit(log if ranks.is_main else (lambda _: None))
        return trainer.result()
    finally:
        distributed.shutdown(created)


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


def configs_from_args(args) -> tuple[ModelConfig, TrainConfig]:
    """The two configs, built once from the command line; only flags given override defaults."""
    model_config = model_config_from_args(args)
    cfg = TrainConfig(
        out_dir=args.out or f"runs/{args.preset}",
        corpus=args.corpus,
        device=args.device,
        precision=args.precision,
        seed=args.seed,
        resume=args.resume,
        tokenizer=getattr(args, "tokenizer", None),
        vocab_size=getattr(args, "vocab_size", None),
    )
    if args.max_steps is not None:
        cfg = replace(cfg, max_steps=args.max_steps, time_budget=args.time_budget)
    elif args.time_budget is not None:
        cfg = replace(cfg, time_budget=args.time_budget)
    flags = ("batch_size", "lr", "eval_interval", "threads")
    overrides = {k: getattr(args, k) for k in flags if getattr(args, k, None) is not None}
    return model_config, replace(cfg, **overrides)


def main(args) -> int:
    """CLI entry: one-line errors and exit 2; ends by printing the held-out bits per byte."""
    try:
        model_config, cfg = configs_from_args(args)
        if model_config.arch == "encoder-decoder":
            if (cfg.tokenizer or "bytes") != "bytes" or cfg.vocab_size is not None:
                raise TrainError("--tokenizer bpe is for decoder-only models; encoder-decoders train on bytes")
            from .train_seq2seq import main_seq2seq

            return main_seq2seq(model_config, args)
        result = train(model_config, cfg)
    except (TrainError, DataError, DeviceError) as e:
        print(f"attnserve train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnserve train: interrupted; the checkpoint is saved, --resume continues", file=sys.stderr)
        return 130
    if distributed.ranks_from_env().is_main:
        print(
            f"trained {result['steps']} steps, {result['train_seconds']:.0f} s "
            f"({result['tokens_per_second']:,.0f} tokens/s, {result['parameters']:,} parameters, "
            f"{result['tokenizer'].kind} tokenizer of {result['tokenizer'].vocab_size} ids); "
            f"checkpoint: {result['checkpoint']}"
        )
        print(f"held-out: {result['heldout_bpb']:.3f} bits per byte")
    return 0
