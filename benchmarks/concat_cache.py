"""The concat layout's key/value cache (concat_runner.py, the KV benchmark's baseline), behind a
slot API: admit, append, free, compact.

Layout today: per past input (layer i key, layer i value) one array (B, H, L, D), rows left-
padded to the longest, and an attention mask (B, L) with 0 on padding. The graph concatenates
past and new keys each step, so `append` takes the graph's present as the next past. Arrays may
live on the device (ONNX Runtime OrtValues under IO binding); they are brought to the host
only when the batch's membership changes. The scheduler sees slots, never rows or layouts.

An encoder-decoder adds a fixed segment per row: the cross-attention keys and values (B, H, S, D)
of its source and the source mask (B, S), left-padded to the longest source like the past.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def left_pad_arrays(arrays: list[np.ndarray], length: int, axis: int) -> list[np.ndarray]:
    """Zero-pad each array on the left of `axis` up to `length` (rows of caches of different lengths)."""
    out = []
    for a in arrays:
        pad = [(0, 0)] * a.ndim
        pad[axis] = (length - a.shape[axis], 0)
        out.append(np.pad(a, pad) if pad[axis][0] else a)
    return out


class KVCache:
    """Keys and values of every active request; each request holds one slot (a row)."""

    def __init__(
        self,
        n_tensors: int,
        to_host: Callable[[Any], np.ndarray] = np.asarray,
        to_device: Callable[[np.ndarray], Any] = lambda a: a,
    ):
        self.n_tensors = n_tensors  # 2 per layer, in the order of the graph's past inputs
        self.to_host = to_host  # device array -> numpy (identity on the CPU)
        self.to_device = to_device  # numpy -> device array, for the cross segment (identity on the CPU)
        self.past: list[Any] = []  # n_tensors arrays, (B, H, L, D)
        self.mask = np.zeros((0, 0), np.int64)  # (B, L): 1 real, 0 padding
        self.cross: list[np.ndarray] = []  # encoder-decoder: n_tensors arrays, (B, H, S, D)
        self.cross_mask: np.ndarray | None = None  # encoder-decoder: (B, S), 1 real source token
        self.slots: list[int] = []  # slot id of each row, in row order
        self._freed: set[int] = set()
        self._next_slot = 0

    @property
    def batch(self) -> int:
        return len(self.slots)

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def admit(
        self, present: list[Any], mask: np.ndarray, cross: Sequence[Any] = (), cross_mask: np.ndarray | None = None
    ) -> list[int]:
        """Add prefilled rows (present (b, H, T, D), mask (b, T); an encoder-decoder's cross
        (b, H, S, D) and cross_mask (b, S)) to the batch; returns their slots."""
        assert len(present) == self.n_tensors, (len(present), self.n_tensors)
        new_slots = list(range(self._next_slot, self._next_slot + mask.shape[0]))
        self._next_slot += mask.shape[0]
        if not self.slots:
            self.past, self.mask = [self.to_host(a) for a in present], mask.astype(np.int64)
            self.cross, self.cross_mask = list(cross), cross_mask
        else:
            self.past, self.mask = self._merge(self.past, self.mask, present, mask)
            if cross_mask is not None:
                assert self.cross_mask is not None, "an encoder-decoder's rows all have a source"
                self.cross, self.cross_mask = self._merge(self.cross, self.cross_mask, cross, cross_mask)
        self.cross = [self.to_device(a) for a in self.cross]  # fixed per row: moved once, read every step
        self.slots += new_slots
        return new_slots

    def _merge(
        self, old: Sequence[Any], old_mask: np.ndarray, new: Sequence[Any], new_mask: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows of two batches stacked, the shorter side left-padded: (B+b, H, L, D) and (B+b, L)."""
        length = max(old_mask.shape[1], new_mask.shape[1])
        old = left_pad_arrays([self.to_host(a) for a in old], length, axis=2)
        new = left_pad_arrays([self.to_host(a) for a in new], length, axis=2)
        masks = left_pad_arrays([old_mask, new_mask.astype(np.int64)], length, axis=1)
        return [np.concatenate(pair, axis=0) for pair in zip(old, new)], np.concatenate(masks)

    def step_inputs(self) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """attention_mask (B, L+1) and position_ids (B, 1) for one new token per row, and the past."""
        mask = np.concatenate([self.mask, np.ones((self.batch, 1), np.int64)], axis=1)
        positions = self.mask.sum(axis=1, keepdims=True)  # (B, 1)
        return mask, positions, self.past

    def append(self, present: list[Any], mask: np.ndarray) -> None:
        """Take a decode step's present (B, H, L+1, D) and its mask as the new past."""
        assert len(present) == self.n_tensors and mask.shape == (self.batch, self.length + 1)
        self.past, self.mask = present, mask

    def free(self, slot: int) -> None:
        """Mark a finished request's slot; its row leaves the batch at the next compact()."""
        assert slot in self.slots and slot not in self._freed, slot
        self._freed.add(slot)

    def compact(self) -> None:
        """Drop freed rows, then the leading columns that are padding in every remaining row."""
        if not self._freed:
            return
        keep = [i for i, s in enumerate(self.slots) if s not in self._freed]
        self.slots = [self.slots[i] for i in keep]
        self._freed.clear()
        if not keep:
            self.past, self.mask = [], np.zeros((0, 0), np.int64)
            self.cross, self.cross_mask = [], None
            return
        self.past, self.mask = self._trim(self.past, self.mask, keep)
        if self.cross_mask is not None:
            cross, self.cross_mask = self._trim(self.cross, self.cross_mask, keep)
            self.cross = [self.to_device(a) for a in cross]

    def _trim(self, arrays: list[Any], mask: np.ndarray, keep: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
        """The kept rows, less the leading columns that are padding in every one of them."""
        mask = mask[keep]
        start = int(np.argmax(mask.any(axis=0)))  # first column that is real somewhere
        arrays = [np.ascontiguousarray(self.to_host(a)[keep][:, :, start:]) for a in arrays]
        return arrays, np.ascontiguousarray(mask[:, start:])

    def row_of(self, slot: int) -> int:
        return self.slots.index(slot)
