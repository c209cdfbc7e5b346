"""The byte corpus of the decoder language model: loading, the held-out split, random windows.

Byte-level, so any file is a corpus. The default is the Python documentation text that ships
with CPython (`pydoc_data.topics`), so training works offline. Knows nothing of models or
optimizers: it hands out (input, target) tensors of byte ids.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .tokenizer import BOS_ID

HELDOUT_FRACTION = 0.05  # the last 5% of the bytes are held out


class DataError(Exception):
    """The corpus is missing, empty or too short to train on (a one-line reason)."""


def default_corpus_bytes() -> bytes:
    """CPython's pydoc topics, joined in sorted key order: the same bytes on every machine."""
    from pydoc_data.topics import topics
    return "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


def read_corpus(path: str | Path | None) -> bytes:
    """The bytes of a text file, of every .txt file under a folder (sorted by path), or the default."""
    if path is None:
        return default_corpus_bytes()
    path = Path(path)
    if path.is_file():
        data = path.read_bytes()
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"corpus folder {path} has no .txt files")
        data = b"\n".join(p.read_bytes() for p in files)
    else:
        raise DataError(f"corpus not found: {path}")
    if not data:
        raise DataError(f"corpus {path} is empty")
    return data


def split_heldout(data: bytes, block: int, fraction: float = HELDOUT_FRACTION) -> tuple[bytes, bytes]:
    """(train, held-out): the held-out part is the tail, at least one block long."""
    if len(data) < 2 * block:
        raise DataError(f"corpus too short: {len(data)} bytes, need at least {2 * block} "
                        f"(a block of {block} to train on and one held out)")
    n_heldout = max(block, int(len(data) * fraction))
    n_train = len(data) - n_heldout
    if n_train < block:
        n_train, n_heldout = block, len(data) - block
    return data[:n_train], data[n_train:]


def default_heldout_bytes(block: int = 256) -> bytes:
    """The held-out split of the default corpus (export's int8 gate measures loss on it)."""
    return split_heldout(default_corpus_bytes(), block)[1]


def as_tensor(data: bytes) -> torch.Tensor:
    """(N,) uint8 view of the bytes."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def windows(data: torch.Tensor, starts: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs BOS + bytes[s : s+block-1] and targets bytes[s : s+block], each (B, block).

    A window starts with BOS like a prompt does, so training matches what generation sees.
    """
    offsets = starts[:, None] + torch.arange(block)                 # (B, block)
    targets = data[offsets].long()                                   # (B, block)
    bos = torch.full_like(targets[:, :1], BOS_ID)                    # (B, 1)
    return torch.cat([bos, targets[:, :-1]], dim=1), targets


class ByteBatches:
    """Random windows of the training bytes; batch k of a (seed, rank) stream is always the same."""

    def __init__(self, data: bytes, block: int, batch_size: int, seed: int, rank: int = 0):
        self.data, self.block, self.batch_size = as_tensor(data), block, batch_size
        self.seed = seed * 1_000_003 + rank * 7_919

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows of step `step`: a resumed run sees the batches an uninterrupted one would."""
        generator = torch.Generator().manual_seed(self.seed + step * 104_729)
        starts = torch.randint(0, len(self.data) - self.block + 1, (self.batch_size,), generator=generator)
        return windows(self.data, starts, self.block)


def heldout_starts(n_bytes: int, block: int, n_windows: int) -> torch.Tensor:
    """Evenly spaced window starts over the held-out bytes: non-overlapping when they fit."""
    span = n_bytes - block + 1
    count = min(n_windows, max(1, n_bytes // block))
    return torch.linspace(0, span - 1, steps=count).long()


def heldout_batches(data: bytes, block: int, batch_size: int, n_windows: int,
                    rank: int = 0, world_size: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's share of the fixed held-out windows, in batches (the same windows at every eval)."""
    starts = heldout_starts(len(data), block, n_windows)[rank::world_size]
    tensor = as_tensor(data)
    return [windows(tensor, chunk, block) for chunk in starts.split(batch_size)]
