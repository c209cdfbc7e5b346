"""The prefix cache's index: which token blocks have keys and values in which pool block.

A prompt is cut into blocks of BLOCK tokens; block i of a prompt is cached under (the pool block
of block i - 1, its BLOCK token ids), so a block is found only through the very blocks before it
(vLLM chains its block hashes the same way; keying by the ids themselves, not a hash of them,
means two different prefixes can never meet in one entry). A prompt's longest cached prefix is a
walk from the root. Eviction is least recently used over leaves only: a block is evicted only once
no cached block follows it, so every cached block stays reachable. The order of `self.lru` keeps
every block after the blocks that follow it (a chain is touched leaf first), so its oldest entry
is always a leaf.

Pure Python: pool block numbers in, pool block numbers out; prefix_cache.py moves the bytes.
Knows nothing of devices, arenas or requests.
"""

from __future__ import annotations

import collections
import heapq

BLOCK = 16  # tokens per cached block: vLLM's default; a hit loses at most 15 tokens, a 900-token prefix is 56 copies
ROOT = -1  # the parent of a prompt's first block

Key = tuple[int, tuple[int, ...]]  # (parent pool block, the block's token ids)


class PrefixBlocks:
    """An index over `capacity` pool blocks: chains of token blocks, LRU over leaves."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: dict[Key, int] = {}  # key -> pool block
        self.keys: dict[int, Key] = {}  # pool block -> its key
        self.children = [0] * capacity  # cached blocks whose parent is this pool block
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # oldest first
        self.free = list(range(capacity))  # a heap: the lowest free block first, so chains lie in runs

    def __len__(self) -> int:
        """Pool blocks in use."""
        return len(self.keys)

    def match(self, tokens: list[int], limit: int) -> list[int]:
        """The pool blocks of the longest cached prefix of tokens[:limit], whole blocks only (touched)."""
        chain = self._cached(tokens, limit)
        self.touch(chain)
        return chain

    def _cached(self, tokens: list[int], limit: int) -> list[int]:
        """The pool blocks of the longest cached prefix of tokens[:limit], a walk from the root."""
        chain: list[int] = []
        for start in range(0, limit - BLOCK + 1, BLOCK):
            block = self.blocks.get((chain[-1] if chain else ROOT, tuple(tokens[start : start + BLOCK])))
            if block is None:
                break
            chain.append(block)
        return chain

    def touch(self, chain: list[int]) -> None:
        """The chain's blocks are the most recently used, each after the ones that follow it."""
        for block in reversed(chain):
            self.lru.move_to_end(block)

    def insert(self, tokens: list[int]) -> list[tuple[int, int]]:
        """Cache the whole blocks of `tokens` that are not cached yet. Returns (block number in tokens,
        pool block) for each block whose keys and values must now be copied in, in the lowest free
        pool blocks (so that they lie in runs); stores fewer when the pool holds nothing evictable
        but this prompt's own blocks."""
        blocks = len(tokens) // BLOCK
        chain = self.match(tokens, len(tokens))  # the blocks cached already
        self._make_room(blocks - len(chain), keep=set(chain))
        added: list[tuple[int, int]] = []
        for number in range(len(chain), min(blocks, len(chain) + len(self.free))):
            block = heapq.heappop(self.free)
            self._add(block, (chain[-1] if chain else ROOT, tuple(tokens[number * BLOCK : (number + 1) * BLOCK])))
            added.append((number, block))
            chain.append(block)
        self.touch(chain)
        return added

    def _add(self, block: int, key: Key) -> None:
        self.blocks[key] = block
        self.keys[block] = key
        self.children[block] = 0
        if key[0] != ROOT:
            self.children[key[0]] += 1
        self.lru[block] = None

    def _make_room(self, count: int, keep: set[int]) -> None:
        """Evict least recently used leaves until `count` blocks are free (never one in `keep`)."""
        while len(self.free) < count and self.lru:
            oldest = next(iter(self.lru))
            if oldest in keep:
                return
            self._evict(oldest)

    def _evict(self, block: int) -> None:
        assert self.children[block] == 0, "only a leaf is evicted"
        key = self.keys.pop(block)
        del self.blocks[key]
        del self.lru[block]
        if key[0] != ROOT:
            self.children[key[0]] -= 1
        heapq.heappush(self.free, block)
