"""The prefix cache's index (runtime/prefix_blocks.py) and its copies (runtime/prefix_cache.py) on a
real CPU arena: whole blocks only, chains found only through their parents, least recently used
leaves evicted first, nothing evicted that a prompt being stored still walks through, and a loaded
prefix byte for byte what was stored."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.runtime.arena import KVArena
from attnserve.runtime.prefix_blocks import BLOCK, PrefixBlocks
from attnserve.runtime.prefix_cache import PrefixCache, block_bytes, runs


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1000, n).tolist()


def test_match_finds_whole_blocks_of_the_longest_cached_prefix_never_past_the_limit():
    index = PrefixBlocks(16)
    prompt = tokens(0, 3 * BLOCK + 5)
    added = index.insert(prompt)
    assert [number for number, _ in added] == [0, 1, 2]  # whole blocks only: the last 5 tokens are not cached
    assert [block for _, block in added] == [0, 1, 2]  # a chain in a run of free blocks: one copy
    assert len(index.match(prompt, len(prompt))) == 3
    assert len(index.match(prompt, 3 * BLOCK - 1)) == 2  # the limit cuts the third block
    assert len(index.match(prompt[: 2 * BLOCK] + [7] * BLOCK, 10 * BLOCK)) == 2


def test_a_prompt_diverging_mid_block_shares_the_blocks_before_it_and_a_block_needs_its_parents():
    index = PrefixBlocks(16)
    first = tokens(1, 4 * BLOCK)
    index.insert(first)
    other = first[: 2 * BLOCK + 7] + tokens(2, 2 * BLOCK - 7)  # differs from token 2 * BLOCK + 7 on
    assert len(index.match(other, len(other))) == 2
    assert [number for number, _ in index.insert(other)] == [2, 3]  # its own blocks after the shared two
    assert len(index) == 6
    shifted = [5] + first  # the same blocks one position later are other blocks
    assert index.match(shifted, len(shifted)) == []
    second_alone = first[BLOCK : 2 * BLOCK] + first[2 * BLOCK :]  # block 1's tokens at the root: not block 1
    assert index.match(second_alone, len(second_alone)) == []


def test_eviction_takes_the_least_recently_used_leaf_first_and_keeps_every_block_reachable():
    index = PrefixBlocks(6)
    a, b = tokens(3, 3 * BLOCK), tokens(4, 3 * BLOCK)
    index.insert(a)
    index.insert(b)
    assert len(index) == 6
    index.match(a, len(a))  # a is now the more recently used
    c = tokens(5, 2 * BLOCK)
    assert len(index.insert(c)) == 2  # room made from b's end: its last two blocks, leaf first
    assert len(index.match(b, len(b))) == 1
    assert len(index.match(a, len(a))) == 3
    assert len(index.match(c, len(c))) == 2
    for key, block in index.blocks.items():  # every cached block's parent is cached
        assert key[0] == -1 or key[0] in index.keys, (key, block)


def test_a_prompt_larger_than_the_pool_stops_storing_rather_than_evicting_its_own_blocks():
    index = PrefixBlocks(3)
    prompt = tokens(6, 5 * BLOCK)
    assert [number for number, _ in index.insert(prompt)] == [0, 1, 2]
    assert len(index.match(prompt, len(prompt))) == 3
    other = tokens(7, 2 * BLOCK)
    assert len(index.insert(other)) == 2  # evicts the long prompt's last blocks, then stops: a full pool
    assert len(index.match(prompt, len(prompt))) == 1


def test_runs_join_blocks_consecutive_in_both_the_prompt_and_the_pool():
    assert runs([(0, 4), (1, 5), (2, 9), (3, 10), (5, 11)]) == [(0, 4, 2), (2, 9, 2), (5, 11, 1)]
    assert runs([]) == []


def arena(capacity: int = 3, context: int = 4 * BLOCK) -> KVArena:
    return KVArena(n_layers=2, n_heads=2, head_dim=8, context=context, capacity=capacity)


def fill(kv: KVArena, slot: int, seed: int) -> None:
    """Random keys and values in every used position of `slot`, as a prefill would leave them."""
    rng = np.random.default_rng(seed)
    for buffer in kv.buffers:
        values = rng.standard_normal(kv.shape[1:], dtype=np.float32)  # (H, L, D)
        kv.device.upload(buffer.data_ptr() + slot * kv.slot_bytes, values)


def test_a_loaded_prefix_is_byte_for_byte_what_was_stored_and_never_the_last_two_tokens():
    kv = arena()
    cache = PrefixCache(kv, 8 * block_bytes(2, 2, 8, "float32"))
    prompt = tokens(8, 3 * BLOCK)  # exactly three blocks: the last token stays to be prefilled
    fill(kv, 0, seed=1)
    kv.lengths[0] = len(prompt)
    cache.store(0, prompt)
    assert cache.held_bytes == 3 * cache.block_bytes
    assert cache.match(prompt) == 2 * BLOCK
    assert cache.load(1, prompt) == 2 * BLOCK and kv.lengths[1] == 2 * BLOCK
    for stored, loaded in zip(kv.read(0), kv.read(1)):
        np.testing.assert_array_equal(stored[:, : 2 * BLOCK], loaded)
    one_more = prompt + tokens(9, 1)  # three blocks would leave one token: a run of one query (next_run)
    assert cache.match(one_more) == 2 * BLOCK
    longer = prompt + tokens(9, 5)
    assert cache.match(longer) == 3 * BLOCK
    assert cache.load(2, longer) == 3 * BLOCK
    for stored, loaded in zip(kv.read(0), kv.read(2)):
        np.testing.assert_array_equal(stored, loaded)


def test_a_pool_smaller_than_one_block_is_refused_with_both_numbers():
    with pytest.raises(ValueError) as refused:
        PrefixCache(arena(), 1000)
    assert str(refused.value) == (
        f"--prefix-cache-memory 1,000 bytes holds no block: one block of {BLOCK} positions needs "
        f"{block_bytes(2, 2, 8, 'float32'):,} bytes"
    )


def test_a_prompt_stored_over_evicted_blocks_still_lies_in_one_run():
    index = PrefixBlocks(6)
    index.insert(tokens(10, 6 * BLOCK))
    added = index.insert(tokens(11, 3 * BLOCK))  # evicts the first prompt's last three blocks, leaf first
    assert added == [(0, 3), (1, 4), (2, 5)] and len(runs(added)) == 1  # one copy per buffer, not three
