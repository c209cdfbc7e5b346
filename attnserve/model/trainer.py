"""The training loop that any architecture plugs into: AdamW, warm-up then cosine decay, gradient
clipping, a progress bar, a step or time budget, CPU or CUDA, DDP under torchrun, checkpoints
with resume.

Nothing here is specific to an architecture: a Task hands out batches, computes the loss and
measures its held-out figure; the decoder LM's is in train.py, the encoder-decoder's in
train_seq2seq.py. Knows nothing of ONNX or gRPC.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from ..flags import check_directory
from . import distributed
from .checkpoint import CheckpointError, build_model, load_state, save_checkpoint
from .config import ModelConfig
from .distributed import Ranks
from .progress import ProgressBar
from .schedule import budget_progress, budget_spent, learning_rate

MAX_SEED = 2**64 - 1  # torch.manual_seed takes -2**63 .. 2**64 - 1; seeds here are unsigned, as the protocol's

CHECKPOINT = "checkpoint.pt"
PRECISIONS = ("auto", "bf16", "fp32")  # "bf16" autocast, "fp32", or "auto": bf16 where the hardware has it
# `attnserve train` model-size flags (argparse dest) -> the ModelConfig field each overrides
MODEL_FLAGS = {
    "context_length": "max_len",
    "d_model": "d_model",
    "n_layers": "n_layers",
    "n_heads": "n_heads",
    "d_ff": "d_ff",
}
NAMED_FLAGS = ("positional",)  # ModelConfig fields set by a flag of their own name (train_cli's --positional)


class TrainError(Exception):
    """Training cannot start: bad options, an unwritable --out, a mismatched --resume."""


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 5e-3  # peak AdamW learning rate
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay, on matrices only
    beta2: float = 0.99  # AdamW second-moment decay (0.99: small models, small batches)
    batch_size: int = 32  # examples per step, per process
    grad_clip: float = 1.0  # max global gradient norm
    eval_interval: int = 250  # steps between held-out evaluations and checkpoints
    max_steps: int | None = None  # stop after this many steps in all (resumes count on)
    time_budget: float | None = 180.0  # stop after this many seconds of training in all (eval excluded)
    seed: int = 0  # initialisation and batches (each rank samples its own stream)
    device: str = "cpu"  # "cpu" or "cuda"
    precision: str = "auto"  # "bf16" autocast, "fp32", or "auto": bf16 where the hardware has it
    threads: int | None = None  # CPU threads per process (None: OMP_NUM_THREADS or cores / processes)
    out_dir: str = "runs/small"  # checkpoint.pt goes here
    resume: bool = False  # continue from out_dir/checkpoint.pt (weights, optimizer, step)
    progress: bool = True  # progress bar on rank 0

    def __post_init__(self) -> None:
        """Refuse what cannot train, naming the `attnserve train` flag (the field's name, dashed)."""
        for name, value in (("--batch-size", self.batch_size), ("--eval-interval", self.eval_interval)):
            if value < 1:
                raise TrainError(f"{name} must be at least 1, got {value}")
        if self.threads is not None and self.threads < 1:
            raise TrainError(f"--threads must be at least 1, got {self.threads}")
        if self.max_steps is not None and self.max_steps < 0:
            raise TrainError(f"--max-steps must not be negative, got {self.max_steps}")
        if self.precision not in PRECISIONS:
            raise TrainError(f"--precision must be {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise TrainError(f"--time-budget must be positive, got {self.time_budget}")
        if not self.lr > 0:  # also refuses NaN
            raise TrainError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.seed <= MAX_SEED:
            raise TrainError(f"--seed must be 0 to {MAX_SEED:,} (what torch.manual_seed takes), got {self.seed}")


class Task(Protocol):
    """What an architecture plugs into the Trainer: its batches, its loss, its held-out figure."""

    metric: str  # checkpoint and result key of the held-out figure, e.g. "heldout_bpb"
    lower_is_better: bool  # which way "best" goes

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """This rank's batch of step `step` (inputs..., targets last): the same on a resume."""
        ...

    def loss(self, net: torch.nn.Module, batch: tuple[torch.Tensor, ...], dtype: torch.dtype | None) -> torch.Tensor:
        """Mean loss of a batch already on the device; `dtype` is the autocast one (None: float32)."""
        ...

    def evaluate(self, model: torch.nn.Module) -> float:
        """The held-out figure over all ranks, in float32 as exported."""
        ...

    def describe(self, value: float) -> str:
        """The figure for people, e.g. '1.234 bits per byte'."""
        ...

    def checkpoint_extra(self) -> dict:
        """What else the checkpoint needs to be used (e.g. the tokenizer), weights_only-loadable."""
        ...


def prepare_out(out_dir: str | Path, rank: int) -> Path:
    """Create the run folder and prove it writable now, not after minutes of training."""
    out = Path(out_dir)
    try:
        check_directory("--out", out)
    except ValueError as e:
        raise TrainError(str(e)) from None
    probe = out / f".write-test-{rank}-{os.getpid()}"  # two runs on one folder must not share a probe
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


def setup(cfg: TrainerConfig) -> tuple[Ranks, torch.device, dict | None]:
    """This process's ranks and device (threads set), --out proven writable, the state to resume."""
    ranks = distributed.ranks_from_env()
    device = distributed.pick_device(cfg.device, ranks)
    if device.type == "cpu":
        torch.set_num_threads(distributed.cpu_threads(ranks, cfg.threads))
    prepare_out(cfg.out_dir, ranks.rank)
    return ranks, device, resume_state(Path(cfg.out_dir) / CHECKPOINT) if cfg.resume else None


def flag_of(field: str) -> str:
    """The command-line flag that sets a ModelConfig field, or the field's own name if none does."""
    dest = {f: d for d, f in MODEL_FLAGS.items()}.get(field) or (field if field in NAMED_FLAGS else None)
    return f"--{dest.replace('_', '-')}" if dest else field


def config_differences(saved: dict, asked: dict) -> str:
    """'FLAG was SAVED, not ASKED' for each field that differs, e.g. '--d-model was 64, not 32'."""
    fields = sorted(set(saved) | set(asked))
    return "; ".join(
        f"{flag_of(f)} was {saved.get(f)}, not {asked.get(f)}" for f in fields if saved.get(f) != asked.get(f)
    )


def check_resumed_config(state: dict, path: Path, model_config: ModelConfig) -> None:
    """A resumed run's model config must be the one asked for."""
    if state["config"] != model_config.to_dict():
        raise TrainError(
            f"--resume: {path} was trained with another model config than the one asked for: "
            + config_differences(state["config"], model_config.to_dict())
        )


def make_optimizer(model: torch.nn.Module, cfg: TrainerConfig) -> torch.optim.AdamW:
    """AdamW (fused: one kernel for all parameters, 6x faster on CPU); no decay on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)


class Trainer:
    """One run's model, optimizer, task and counters; `fit` is the loop."""

    def __init__(
        self, model_config: ModelConfig, cfg: TrainerConfig, ranks: Ranks, device: torch.device, task: Task, state
    ):
        self.cfg, self.ranks, self.device, self.task = cfg, ranks, device, task
        if state is not None:
            check_resumed_config(state, self.checkpoint_path(), model_config)
        self.autocast = distributed.autocast_dtype(cfg.precision, device)
        torch.manual_seed(cfg.seed)
        self.model = build_model(model_config).to(device)
        self.optimizer = make_optimizer(self.model, cfg)
        self.step, self.seconds, self.tokens = 0, 0.0, 0
        self.last: float | None = None  # the latest held-out figure, and the best so far
        self.best: float | None = None
        if state is not None:
            self.restore(state)
        self.start_step, self.start_seconds = self.step, self.seconds
        self.evaluated_at: int | None = None  # the step of the latest evaluation
        self.net: torch.nn.Module = self.model  # what the step runs: the model, or DDP around it
        if ranks.distributed:
            self.net = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.seconds = int(state["step"]), float(state.get("train_seconds", 0.0))
        self.last, self.best = state.get(self.task.metric), state.get(f"best_{self.task.metric}")

    def learning_rate(self) -> float:
        c = self.cfg
        progress = budget_progress(self.step, self.seconds, c.max_steps, c.time_budget, c.warmup_steps)
        return learning_rate(self.step, progress, c.lr, c.warmup_steps, c.min_lr_ratio)

    def train_step(self) -> tuple[float, float]:
        """One optimizer step on this rank's batch; DDP averages the gradients. Returns (loss, lr)."""
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = tuple(t.to(self.device, non_blocking=True) for t in self.task.batch(self.step))
        with torch.autocast(self.device.type, dtype=self.autocast or torch.float32, enabled=bool(self.autocast)):
            loss = self.task.loss(self.net, batch, self.autocast)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.tokens += batch[-1].numel() * self.ranks.world_size
        return loss.item(), lr

    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds - self.start_seconds, 1e-9)

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
                world_size=self.ranks.world_size,
                **{self.task.metric: self.last, f"best_{self.task.metric}": self.best},
                **self.task.checkpoint_extra(),
            )

    def evaluate_and_save(self, log: Callable[[str], None]) -> None:
        last = self.last = self.task.evaluate(self.model)
        better = min if self.task.lower_is_better else max
        best = self.best = last if self.best is None else better(self.best, last)
        self.evaluated_at = self.step
        self.save()
        describe = self.task.describe
        log(f"step {self.step}: held-out {describe(last)} (best {describe(best)}), {self.seconds:.0f} s of training")

    def out_of_budget(self) -> bool:
        """All ranks agree: rank 0's clock decides when a time budget is set."""
        if self.cfg.time_budget is not None:
            self.seconds = distributed.broadcast_float(self.seconds, self.device)
        return budget_spent(self.step, self.seconds, self.cfg.max_steps, self.cfg.time_budget)

    def fit(self, log: Callable[[str], None] | None = None) -> dict:
        """Step until the budget is spent, evaluating and checkpointing every eval_interval steps."""
        bar = ProgressBar(self.cfg, self.step, enabled=self.ranks.is_main and self.cfg.progress)
        log = (bar.write if log is None else log) if self.ranks.is_main else (lambda _: None)
        try:
            while not self.out_of_budget():
                start = time.perf_counter()
                loss, lr = self.train_step()
                self.step += 1
                self.seconds += time.perf_counter() - start
                figure = None if self.last is None else self.task.describe(self.last)
                bar.update(self.step, loss, lr, self.tokens_per_second(), figure)
                if self.step % self.cfg.eval_interval == 0:
                    self.evaluate_and_save(log)
            if self.evaluated_at != self.step:
                self.evaluate_and_save(log)
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            bar.close()
            self.net = self.model  # drop the DDP wrapper while the process group still exists
        return self.result()

    def result(self) -> dict:
        return {
            "steps": self.step,
            "start_step": self.start_step,
            "train_seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second(),
            self.task.metric: self.last,
            f"best_{self.task.metric}": self.best,
            "checkpoint": self.checkpoint_path(),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "model": self.model,
        }
