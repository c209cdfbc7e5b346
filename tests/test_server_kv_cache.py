"""The KV cache's slot API: admit left-pads to the longest row, free + compact trims the padding."""

import numpy as np

from benchmarks.concat_cache import KVCache

H, D = 2, 4


def prefilled(lengths: list[int], seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Present tensors (b, H, T, D) x 2 and the left-padded mask of prompts of these lengths."""
    rng, t = np.random.default_rng(seed), max(lengths)
    mask = np.array([[0] * (t - n) + [1] * n for n in lengths], dtype=np.int64)
    present = [rng.normal(size=(len(lengths), H, t, D)).astype(np.float32) * mask[:, None, :, None] for _ in range(2)]
    return present, mask


def test_admit_into_an_empty_cache_takes_the_rows_as_they_are():
    cache = KVCache(2)
    present, mask = prefilled([3, 5], seed=0)
    slots = cache.admit(present, mask)
    assert slots == [0, 1] and cache.batch == 2 and cache.length == 5
    assert np.array_equal(cache.mask, mask)


def test_admit_left_pads_the_shorter_side():
    cache = KVCache(2)
    long_present, long_mask = prefilled([6], seed=1)
    short_present, short_mask = prefilled([2], seed=2)
    cache.admit(long_present, long_mask)
    slot = cache.admit(short_present, short_mask)[0]
    row = cache.row_of(slot)
    assert cache.length == 6
    assert cache.mask[row].tolist() == [0, 0, 0, 0, 1, 1]
    assert np.array_equal(cache.past[0][row, :, 4:], short_present[0][0])
    assert not cache.past[0][row, :, :4].any()


def test_step_inputs_give_each_row_its_own_next_position():
    cache = KVCache(2)
    cache.admit(*prefilled([4, 1], seed=3))
    mask, positions, past = cache.step_inputs()
    assert mask.shape == (2, 5) and mask[:, -1].tolist() == [1, 1]
    assert positions.tolist() == [[4], [1]]
    cache.append([np.concatenate([p, p[:, :, :1]], axis=2) for p in past], mask)
    assert cache.length == 5 and cache.step_inputs()[1].tolist() == [[5], [2]]


def test_free_then_compact_drops_the_row_and_the_padding_no_one_needs():
    cache = KVCache(2)
    long_slot = cache.admit(*prefilled([7], seed=4))[0]
    short_present, short_mask = prefilled([3], seed=5)
    short_slot = cache.admit(short_present, short_mask)[0]
    cache.free(long_slot)
    assert cache.batch == 2  # freed rows leave at compact()
    cache.compact()
    assert cache.slots == [short_slot] and cache.length == 3
    assert np.array_equal(cache.past[1], short_present[1])
    assert cache.mask.tolist() == [[1, 1, 1]]


def test_freeing_everything_empties_the_cache_and_slots_stay_unique():
    cache = KVCache(2)
    first = cache.admit(*prefilled([2, 2], seed=6))
    for slot in first:
        cache.free(slot)
    cache.compact()
    assert cache.batch == 0 and cache.length == 0 and cache.past == []
    again = cache.admit(*prefilled([1], seed=7))
    assert not set(again) & set(first)


def test_host_conversion_is_used_for_device_arrays():
    class DeviceArray:  # stands in for an OrtValue on a GPU
        def __init__(self, a):
            self.a = a

    cache = KVCache(2, to_host=lambda v: v.a if isinstance(v, DeviceArray) else v)
    present, mask = prefilled([2], seed=8)
    cache.admit([DeviceArray(p) for p in present], mask)
    cache.admit(*prefilled([4], seed=9))
    assert all(isinstance(p, np.ndarray) and p.shape == (2, H, 4, D) for p in cache.past)


def test_cross_segment_is_left_padded_per_source_and_trimmed_with_its_row():
    cache = KVCache(2)
    long_cross, long_src = prefilled([6], seed=10)  # an encoder-decoder row: source of 6
    short_cross, short_src = prefilled([2], seed=11)
    long_slot = cache.admit(*prefilled([1], seed=12), long_cross, long_src)[0]
    short_slot = cache.admit(*prefilled([1], seed=13), short_cross, short_src)[0]
    row = cache.row_of(short_slot)
    assert cache.cross_mask.shape == (2, 6) and cache.cross_mask[row].tolist() == [0, 0, 0, 0, 1, 1]
    assert np.array_equal(cache.cross[0][row, :, 4:], short_cross[0][0]) and not cache.cross[0][row, :, :4].any()
    assert cache.length == 1  # the self-attention past is its own segment
    cache.free(long_slot)
    cache.compact()
    assert cache.cross_mask.tolist() == [[1, 1]] and np.array_equal(cache.cross[1], short_cross[1])
    cache.free(short_slot)
    cache.compact()
    assert cache.cross == [] and cache.cross_mask is None


def test_cross_segment_is_handed_to_the_device_once_per_membership_change():
    class DeviceArray:  # stands in for an OrtValue on a GPU
        def __init__(self, a):
            self.a = a

    moved = []
    cache = KVCache(
        2,
        to_host=lambda v: v.a if isinstance(v, DeviceArray) else v,
        to_device=lambda a: moved.append(a.shape) or DeviceArray(a),
    )
    cache.admit(*prefilled([1], seed=14), *prefilled([3], seed=15))
    cache.admit(*prefilled([1], seed=16), *prefilled([5], seed=17))
    assert all(isinstance(c, DeviceArray) and c.a.shape == (2, H, 5, D) for c in cache.cross)
    assert moved == [(1, H, 3, D)] * 2 + [(2, H, 5, D)] * 2
    mask, _positions, past = cache.step_inputs()
    cache.append(past, mask)
    assert len(moved) == 4  # a decode step moves nothing
