"""Automatic prefix caching: keys and values of prompt blocks kept in a pool beside the KV arena.

When a prompt is prefilled, its whole blocks (prefix_blocks.BLOCK tokens) are copied from its
arena slot into pool blocks; when a later prompt starts with cached blocks, they are copied into
its slot and only the rest of it is prefilled. Exact, because a position's keys and values depend
only on the tokens up to it: a cached block holds what a prefill of the same tokens computes, and
nothing ever writes a pool block between its insertion and its eviction. (ONNX Runtime's attention
may sum in another order for a run of another length, which moves last bits; the rest is never a
single token, where that is the rule rather than the exception: arena_decoder.SHORTEST_PROMPT_RUN.)
A copy is one strided
device copy per buffer per run of consecutive pool blocks (the pool lays a head's positions out
as a slot does, so a chain stored in a run of free blocks comes back in one copy per buffer).

The pool is (H, capacity * BLOCK, D) per arena buffer, on the arena's device, allocated once.
Knows nothing of requests or scheduling; arena_runner.py decides when to load and store.
"""

from __future__ import annotations

import math

from .arena import KVArena
from .arena_decoder import SHORTEST_PROMPT_RUN
from .prefix_blocks import BLOCK, PrefixBlocks


def block_bytes(n_layers: int, n_heads: int, head_dim: int, dtype: str) -> int:
    """Bytes of one cached block: BLOCK positions of keys and values in every layer (an arena slot's size)."""
    return KVArena.bytes_needed(n_layers, n_heads, head_dim, BLOCK, 1, dtype)


class PrefixCache:
    """Prompt blocks of one arena's model in a pool of `nbytes` (whole blocks) on the arena's device."""

    def __init__(self, arena: KVArena, nbytes: int):
        self.arena = arena
        self.block_bytes = block_bytes(arena.n_layers, arena.n_heads, arena.head_dim, arena.dtype_name)
        if nbytes < self.block_bytes:
            raise ValueError(
                f"--prefix-cache-memory {nbytes:,} bytes holds no block: one block of {BLOCK} positions "
                f"needs {self.block_bytes:,} bytes"
            )
        self.index = PrefixBlocks(nbytes // self.block_bytes)
        self.positions = self.index.capacity * BLOCK  # the pool's positions per head
        shape = (arena.n_heads, self.positions, arena.head_dim)  # (H, capacity * BLOCK, D)
        self.pool = [arena.device.allocate(shape, arena.dtype) for _ in arena.buffers]
        for buffer in self.pool:
            arena.device.filled_as_used(buffer.data_ptr(), math.prod(shape) * arena.itemsize)

    @property
    def nbytes(self) -> int:
        """The pool's size, fixed at start-up."""
        return self.index.capacity * self.block_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the blocks cached now."""
        return len(self.index) * self.block_bytes

    def match(self, prompt: list[int]) -> int:
        """Positions of `prompt` a load would copy now: never its last two tokens (its last token's
        logits must be computed, in a run of more than one token: SHORTEST_PROMPT_RUN)."""
        return len(self.index.match(prompt, len(prompt) - SHORTEST_PROMPT_RUN)) * BLOCK

    def load(self, slot: int, prompt: list[int]) -> int:
        """Copy the longest cached prefix of `prompt` (as match() measures it) into the empty `slot`;
        returns the number of positions copied (0: a miss)."""
        assert not self.arena.lengths[slot], "a prefix is loaded into an empty slot"
        chain = self.index.match(prompt, len(prompt) - SHORTEST_PROMPT_RUN)
        for number, block, count in runs(list(enumerate(chain))):
            self._copy(slot, number, block, count, to_pool=False)
        self.arena.lengths[slot] = len(chain) * BLOCK
        return len(chain) * BLOCK

    def store(self, slot: int, prompt: list[int]) -> None:
        """Cache the whole blocks of `prompt`, prefilled in `slot`, that are not cached yet."""
        assert self.arena.lengths[slot] >= len(prompt) // BLOCK * BLOCK, "the slot holds the prompt"
        for number, block, count in runs(self.index.insert(prompt)):
            self._copy(slot, number, block, count, to_pool=True)

    def _copy(self, slot: int, number: int, block: int, count: int, to_pool: bool) -> None:
        """Blocks [number, number + count) of a slot <-> pool blocks [block, block + count), every buffer."""
        arena, step = self.arena, BLOCK * self.arena.head_dim * self.arena.itemsize  # bytes of a block's head
        slot_pitch, pool_pitch = arena.head_bytes, self.positions * step // BLOCK
        for buffer, pool in zip(arena.buffers, self.pool):
            at_slot = buffer.data_ptr() + slot * arena.slot_bytes + number * step
            at_pool = pool.data_ptr() + block * step
            if to_pool:
                arena.device.copy_rows(at_pool, pool_pitch, at_slot, slot_pitch, count * step, arena.n_heads)
            else:
                arena.device.copy_rows(at_slot, slot_pitch, at_pool, pool_pitch, count * step, arena.n_heads)


def runs(blocks: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(block number, pool block) pairs as runs (first number, first pool block, count) where both
    go up by one: each run is one copy per buffer."""
    out: list[tuple[int, int, int]] = []
    for number, block in blocks:
        if out and out[-1][0] + out[-1][2] == number and out[-1][1] + out[-1][2] == block:
            first, start, count = out[-1]
            out[-1] = (first, start, count + 1)
        else:
            out.append((number, block, 1))
    return out
