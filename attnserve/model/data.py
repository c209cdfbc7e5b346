"""The corpus of the decoder language model: loading, the held-out split, random windows.

Any text file is a corpus. The default is the Python documentation text that ships with CPython
(`pydoc_data.topics`), so training works offline. The split is made on the bytes, before any
tokenizer sees them, so a BPE trained on the training part never sees the held-out tail. Knows
nothing of models or optimizers: it hands out (input, target) tensors of token ids.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..tokenizer.utf8 import BOS_ID

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
            raise DataError(f"--corpus {path}: a folder with no .txt files")
        data = b"\n".join(p.read_bytes() for p in files)
    else:
        raise DataError(f"--corpus {path}: no such file or folder")
    if not data:
        raise DataError(f"--corpus {path}: is empty")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"--corpus {path}: not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})") from None
    return data


def split_heldout(
    data: bytes, block: int, fraction: float = HELDOUT_FRACTION, whole_characters: bool = False
) -> tuple[bytes, bytes]:
    """(train, held-out): the held-out part is the tail, at least one block long.

    With `whole_characters` the cut moves back to the start of a UTF-8 character, so that both
    parts decode as text (a BPE tokenizer is trained on the first)."""
    if len(data) < 2 * block:
        raise DataError(
            f"corpus too short: {len(data)} bytes, need at least {2 * block} "
            f"(a block of {block} to train on and one held out)"
        )
    n_heldout = max(block, int(len(data) * fraction))
    n_train = len(data) - n_heldout
    if n_train < block:
        n_train, n_heldout = block, len(data) - block
    while whole_characters and n_train > 0 and data[n_train] & 0xC0 == 0x80:  # a continuation byte
        n_train -= 1
    return data[:n_train], data[n_train:]


def default_heldout_bytes(block: int = 256) -> bytes:
    """The held-out split of the default corpus (export's int8 gate measures loss on it)."""
    return split_heldout(default_corpus_bytes(), block)[1]


def as_tensor(data: bytes | list[int]) -> torch.Tensor:
    """(N,) view of the bytes (uint8), or of a list of token ids (int32)."""
    if isinstance(data, (bytes, bytearray)):
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.tensor(data, dtype=torch.int32)


def span(bos: int | None, block: int) -> int:
    """Tokens one window reads: with BOS the first input is BOS, so `block`; without, block + 1."""
    return block if bos is not None else block + 1


def windows(
    data: torch.Tensor, starts: torch.Tensor, block: int, bos: int | None = BOS_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, each (B, block), of the windows starting at `starts`.

    With `bos` (the byte tokenizer): inputs BOS + data[s : s+block-1], targets data[s : s+block];
    a window starts with BOS like a prompt does. Without (BPE, whose prompts have no BOS): inputs
    data[s : s+block], targets data[s+1 : s+block+1]."""
    offsets = starts[:, None] + torch.arange(span(bos, block))  # (B, span)
    tokens = data[offsets].long()  # (B, span)
    if bos is None:
        return tokens[:, :-1], tokens[:, 1:]
    return torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], dim=1), tokens


class ByteBatches:
    """Random windows of the training tokens (bytes by default); batch k of a (seed, rank) stream
    is always the same."""

    def __init__(
        self, data: bytes | list[int], block: int, batch_size: int, seed: int, rank: int = 0, bos: int | None = BOS_ID
    ):
        self.data, self.block, self.batch_size, self.bos = as_tensor(data), block, batch_size, bos
        self.seed = seed * 1_000_003 + rank * 7_919

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows of step `step`: a resumed run sees the batches an uninterrupted one would."""
        generator = torch.Generator().manual_seed(self.seed + step * 104_729)
        last = len(self.data) - span(self.bos, self.block)
        starts = torch.randint(0, last + 1, (self.batch_size,), generator=generator)
        return windows(self.data, starts, self.block, self.bos)


def heldout_starts(n_tokens: int, window: int, n_windows: int) -> torch.Tensor:
    """Evenly spaced starts of windows of `window` tokens over the held-out ones: non-overlapping when they fit."""
    count = min(n_windows, max(1, n_tokens // window))
    return torch.linspace(0, n_tokens - window, steps=count).long()


def heldout_batches(
    data: bytes | list[int],
    block: int,
    batch_size: int,
    n_windows: int,
    rank: int = 0,
    world_size: int = 1,
    bos: int | None = BOS_ID,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's share of the fixed held-out windows, in batches (the same windows at every eval)."""
    if len(data) < span(bos, block):
        raise DataError(f"the held-out split has {len(data)} tokens, fewer than one window of {span(bos, block)}")
    starts = heldout_starts(len(data), span(bos, block), n_windows)[rank::world_size]
    tensor = as_tensor(data)
    return [windows(tensor, chunk, block, bos) for chunk in starts.split(batch_size)]
