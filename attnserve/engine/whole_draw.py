"""host_draw's draw over whole rows, compiled (whole_draw.c, built at install as attnserve.engine._whole_draw
and loaded here with ctypes): rows with no top-k, under min-p, top-p or neither, picked in a few passes
over each row instead of numpy's dozen (16 flat rows of 50,257 ids: about 3 ms against 10; read as float32
logits, divided as read: 3.6 ms in one thread, 2.9 ms shared out between two). Its picks are
the definition's (tests/test_sampling.py), as numpy's are; the two may part only where a uniform number
falls within about 1e-15 of an id's edge, so wherever the library loads every row it takes is drawn by it,
alone or in a batch (host_draw.draw and batch_draw.draws both ask it first). A row under penalties or a
bias is drawn from its float32 logits too (`draw_processed`: the ids they change patched in as the row is
read, as sampling.processed_row changes its float64 copy): sampling.pick_whole_row takes it.

The same library scores a greedy row that asks for log-probabilities (`scores`: its likeliest ids and the
float64 sum of exps over the row, in two passes over the float32 logits, where numpy makes a float64 copy
and three more): sampling.compiled_greedy takes it for every such row but a beam's, alone or together
(scores_rows); their log-probabilities are within about 1e-13 of log_softmax's, their ids the same. And it
finds the few ids a top-k draw is decided by (`likeliest`: every id at least as large as the count-th
largest, for likeliest.candidates), and draws a top-k row from them in the same call (`top_k`: host_draw's
draw_among over those ids, for a row with no penalty and no bias but bans: sampling.pick_from_few takes it).

A row of 8,192 ids or more is read in two parts, each weighed by itself and their sums added part by part
(the same ids whichever thread weighs a part). Between wake() and rest() the library's helper thread
weighs the second part of a single row's draw (draw_logits, draw_processed, draw; scores' sum of exps) while
the caller weighs the first: burst.BurstDraws wakes it for a step whose rows go to the draw over every id.
A batch of rows shared out between this module's two threads lends it nothing.

Where the library is not built (no C compiler at install) or the CPU lacks what it was built for (AVX2
and FMA on x86-64), or ATTNSERVE_WHOLE_DRAW=numpy is set, `available()` is False and numpy draws.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ENV = "ATTNSERVE_WHOLE_DRAW"  # "numpy": leave every row to host_draw's numpy draw
# threads a batch of rows is shared out between, and a long row's parts (the CPUs this process may run on)
DRAW_THREADS = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
SHARES = DRAW_THREADS > 1  # whether a long row's second part may go to the library's helper thread
SHARE_FROM = 4  # rows: fewer are drawn in the caller's thread alone
POOL = ThreadPoolExecutor(1, thread_name_prefix="whole-draw")  # the second thread's (started at its first use)


def fresh_pool() -> None:
    """A forked child's own pool: its parent's worker thread did not come with it."""
    global POOL
    POOL = ThreadPoolExecutor(1, thread_name_prefix="whole-draw")


os.register_at_fork(after_in_child=fresh_pool)


def load() -> ctypes.CDLL | None:
    """The compiled library, or None where it is not built, does not run here, or numpy is asked for."""
    if os.environ.get(ENV, "").lower() == "numpy":
        return None
    spec = importlib.util.find_spec("attnserve.engine._whole_draw")
    if spec is None or spec.origin is None:
        return None
    library = ctypes.CDLL(spec.origin)
    if not library.whole_draw_supported():
        return None
    return typed(library)


def typed(library: ctypes.CDLL) -> ctypes.CDLL:
    """The library with its draws' signatures set, as the calls below pass their arguments."""
    pointer, count = ctypes.c_void_p, ctypes.c_int64
    flag = ctypes.c_int
    library.whole_draws.argtypes = (pointer, count, count, count, *[pointer] * 6, flag)
    library.whole_draws_logits.argtypes = (pointer, count, count, *[pointer] * 7, flag)
    library.whole_draws.restype = library.whole_draws_logits.restype = None
    real = ctypes.c_double
    library.whole_draw_logits.argtypes = (pointer, count, real, real, real, real, pointer, pointer)
    library.whole_draw_values.argtypes = (pointer, count, real, real, real, pointer, pointer)
    head = (pointer, count, real, real, real, real, pointer, count, real)
    changes = (pointer, pointer, count, real, real, pointer, pointer, count, pointer, pointer)
    library.whole_draw_processed.argtypes = (*head, *changes)
    library.whole_draw_logits.restype = library.whole_draw_values.restype = library.whole_draw_processed.restype = count
    library.whole_draw_scores.argtypes = (pointer, count, pointer, count, count, pointer, pointer, pointer, flag)
    library.whole_draw_scores.restype = ctypes.c_double
    library.whole_draw_likeliest.argtypes = (pointer, count, count, count, pointer, pointer, pointer)
    library.whole_draw_likeliest.restype = count
    drawn = (pointer, count, real, real, count, real, real)  # the row, its temperature, min-p, k, top-p, uniform
    library.whole_draw_top_k.argtypes = (*drawn, pointer, count, count, *[pointer] * 4)  # bans, room, buffers
    library.whole_draw_top_k.restype = count
    library.whole_draw_share.argtypes, library.whole_draw_share.restype = (flag,), None
    library.whole_draw_share(SHARES)
    for name in ("whole_draw_wake", "whole_draw_rest"):
        getattr(library, name).argtypes, getattr(library, name).restype = (), None
    library.whole_draw_helped.argtypes, library.whole_draw_helped.restype = (), count
    library.whole_draw_split_at.argtypes, library.whole_draw_split_at.restype = (count,), count
    return library


LIBRARY = load()


def available() -> bool:
    """Whether the compiled draw runs here (otherwise numpy's draws every row)."""
    return LIBRARY is not None


class Buffers(threading.local):
    """Each thread's buffers for rows of one size (V,): the weights (float64) and top-p's crossing bucket's
    ids (int32); and a top-k draw's (top_k's): its few ids (int64), the likeliest values (float32) and their
    ids (int64), and its float64 scratch, for few_room(V) ids each."""

    size = -1

    def get(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if size != self.size:
            self.size, self.weights, self.members = size, np.empty(size), np.empty(size, np.int32)
            self.addresses = (self.weights.ctypes.data, self.members.ctypes.data)
            room = few_room(size)
            self.few = (
                np.empty(room, np.int64),
                np.empty(room, np.float32),
                np.empty(room, np.int64),
                np.empty(4 * room),
            )
            self.few_addresses = tuple(buffer.ctypes.data for buffer in self.few)
        return self.weights, self.members

    def at(self, size: int) -> tuple[int, int]:
        """get's buffers' addresses (a single row's call passes them as they are)."""
        self.get(size)
        return self.addresses


BUFFERS = Buffers()


def wake() -> None:
    """Wakes the library's helper thread ahead of a step's rows: until rest() (5 ms at most), a single row's
    draw of 8,192 ids or more weighs the second part of the row on it while the caller weighs the first
    (whole_draw.c's split_at: the same ids either way). Its wake-up costs the caller some tens of microseconds
    on a virtual machine, so a caller wakes it once, for rows whose draws take longer than that."""
    if LIBRARY is not None:
        LIBRARY.whole_draw_wake()


def rest() -> None:
    """The helper thread takes no more parts and sleeps (leaving its core to the model's next run)."""
    if LIBRARY is not None:
        LIBRARY.whole_draw_rest()


@functools.cache
def splits(size: int) -> bool:
    """Whether a row of `size` ids is weighed in two parts (so that the helper thread may take one)."""
    return LIBRARY is not None and LIBRARY.whole_draw_split_at(size) < size


def helped() -> int:
    """How many parts of rows the helper thread has weighed in this process."""
    return 0 if LIBRARY is None else LIBRARY.whole_draw_helped()


def draws(scaled: np.ndarray, min_p: np.ndarray, top_p: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Each temperature-scaled row's id (n,) int64 of rows (n, V) float64 (rows contiguous), with no top-k,
    by its min-p, top-p and uniform number (n,) each: host_draw.draw's; -1 for a row left to numpy's draw
    (min-p keeping at most V / FEW ids, every id -inf, or memory short)."""
    assert LIBRARY is not None and scaled.dtype == np.float64 and scaled.strides[1] == 8
    n, size = scaled.shape
    stride = scaled.strides[0] // 8 if n > 1 else size
    return call(LIBRARY.whole_draws, size, (scaled.ctypes.data, n, size, stride), min_p, top_p, uniform)


def draws_logits(
    logits: Sequence[np.ndarray], temperature: np.ndarray, min_p: np.ndarray, top_p: np.ndarray, uniform: np.ndarray
) -> np.ndarray:
    """draws' ids of n rows of float32 logits (V,) each (contiguous, anywhere) divided by their temperatures
    (n,) > 0: those of the rows as sampling.processed_row divides them (in float64), without the copy: each
    row is read as it is. With more than one row and DRAW_THREADS > 1, the rows are shared out between
    this thread and the pool's (the library runs without the GIL): each row's id is the same either way."""
    assert LIBRARY is not None and all(readable(row) for row in logits)
    n, size = len(logits), logits[0].size
    pointers = np.array([row.ctypes.data for row in logits], np.uintp)
    per_row = [np.ascontiguousarray(a, np.float64) for a in (temperature, min_p, top_p, uniform)]

    def part(start: int, end: int, share: bool) -> np.ndarray:
        head = (pointers[start:end].ctypes.data, end - start, size)
        return call(LIBRARY.whole_draws_logits, size, head, *(a[start:end] for a in per_row), share=share)

    if n < SHARE_FROM or DRAW_THREADS < 2:
        return part(0, n, True)
    half = (n + 1) // 2
    other = POOL.submit(part, half, n, False)
    return np.concatenate([part(0, half, False), other.result()])


def readable(logits: np.ndarray) -> bool:
    """A row draws_logits reads as it is: float32, its ids one after another."""
    return logits.dtype == np.float32 and logits.strides[0] == 4


def call(
    function: Callable[..., None], size: int, head: tuple[int, ...], *per_row: np.ndarray, share: bool = True
) -> np.ndarray:
    """One of the library's draws: its leading arguments (the rows), the rows' float64 arguments, this
    thread's buffers for rows of `size` ids, and the ids it writes (-1 for a row it leaves to numpy); `share`:
    whether each row's second part may go to the library's helper thread (not where this call's rows are a
    share of a batch's, drawn beside another thread's)."""
    weights, members = BUFFERS.get(size)
    arguments = [np.ascontiguousarray(a, np.float64) for a in per_row]
    ids = np.empty(arguments[0].size, np.int64)
    function(
        *head,
        *(a.ctypes.data for a in arguments),
        weights.ctypes.data,
        members.ctypes.data,
        ids.ctypes.data,
        share,
    )
    return np.where(ids < 0, -1, ids)


def draw(scaled: np.ndarray, min_p: float, top_p: float, uniform: float) -> int | None:
    """One row's (V,) id as draws gives it; None where the library is not here or leaves the row to numpy."""
    if LIBRARY is None:
        return None
    row = scaled if scaled.dtype == np.float64 and scaled.strides[0] == 8 else np.ascontiguousarray(scaled, np.float64)
    picked = LIBRARY.whole_draw_values(row.ctypes.data, row.size, min_p, top_p, uniform, *BUFFERS.at(row.size))
    return None if picked < 0 else picked


def draw_logits(logits: np.ndarray, temperature: float, min_p: float, top_p: float, uniform: float) -> int | None:
    """One float32 row's (V,) id as draws_logits gives it; None where the library is not here or leaves the row
    to numpy, or the row is not contiguous float32."""
    if LIBRARY is None or not readable(logits):
        return None
    head = (logits.ctypes.data, logits.size, temperature, min_p, top_p, uniform)
    picked = LIBRARY.whole_draw_logits(*head, *BUFFERS.at(logits.size))
    return None if picked < 0 else picked


def draw_processed(
    logits: np.ndarray,
    temperature: float,
    min_p: float,
    top_p: float,
    uniform: float,
    seen: np.ndarray | None = None,
    penalty: float = 1.0,
    occurred: np.ndarray | None = None,
    counts: np.ndarray | None = None,
    presence: float = 0.0,
    frequency: float = 0.0,
    bias_ids: np.ndarray | None = None,
    bias_values: np.ndarray | None = None,
) -> int | None:
    """draw_logits' id of a float32 row (V,) after what sampling.processed_row changes, in its order: the
    repetition `penalty` on the ids `seen`, the `presence` and `frequency` penalties on the ids `occurred` (with
    their `counts`), then each bias in turn (`bias_values` added to `bias_ids`; a ban's is -inf). The id draw
    gives the row as processed_row makes it (float64, changed, divided by the temperature), without that copy.
    The ids contiguous int64 (seen and occurred each id once, any order), the bias values contiguous float64
    (sampling.changes makes them so); None: no such change. None where the library is not here or leaves the
    row to numpy (an id outside the row), or the row is not contiguous float32."""
    if LIBRARY is None or not readable(logits):
        return None
    head = (logits.ctypes.data, logits.size, temperature, min_p, top_p, uniform)
    repeated: tuple = (None, 0, 1.0) if seen is None else (seen.ctypes.data, seen.size, penalty)
    occurring: tuple = (None, None, 0, 0.0, 0.0)
    if occurred is not None and counts is not None:
        occurring = (occurred.ctypes.data, counts.ctypes.data, occurred.size, presence, frequency)
    biased: tuple = (None, None, 0)
    if bias_ids is not None and bias_values is not None:
        biased = (bias_ids.ctypes.data, bias_values.ctypes.data, bias_ids.size)
    picked = LIBRARY.whole_draw_processed(*head, *repeated, *occurring, *biased, *BUFFERS.at(logits.size))
    return None if picked < 0 else picked


def scores(
    logits: np.ndarray, count: int, banned: np.ndarray, share: bool = True
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """A greedy row's log-probabilities from float32 logits (V,), compiled: the `count` likeliest ids (count,)
    int64 but `banned` (ascending int64), descending, the lower id first on ties, their logits (count,) float32,
    and the sum over every id not banned of e^(logit - the first's), in float64 (log_softmax's, added in
    another order: within about 1e-13 of it). None where the library is not here, the row is not contiguous
    float32, or it has fewer than `count` such ids (every other -inf or NaN). `share`: as call's."""
    if LIBRARY is None or not readable(logits):
        return None
    banned = np.ascontiguousarray(banned, np.int64)
    ids, values, kept = np.empty(count, np.int64), np.empty(count, np.float32), ctypes.c_int64()
    head = (logits.ctypes.data, logits.size, banned.ctypes.data, banned.size, count)
    total = LIBRARY.whole_draw_scores(*head, ids.ctypes.data, values.ctypes.data, ctypes.byref(kept), share)
    return (ids, values, total) if kept.value == count else None


def likeliest(logits: np.ndarray, count: int, room: int) -> np.ndarray | None:
    """The ids (ascending, int64) of float32 logits (V,) at least as large as their `count`-th largest, ties
    kept, compiled (two passes over the row); None where the library is not here, the row is not contiguous
    float32, more than `room` ids are that large, or fewer than `count` are above -inf."""
    if LIBRARY is None or not readable(logits):
        return None
    ids, values, order = np.empty(room, np.int64), np.empty(count, np.float32), np.empty(count, np.int64)
    found = LIBRARY.whole_draw_likeliest(
        logits.ctypes.data, logits.size, count, room, ids.ctypes.data, values.ctypes.data, order.ctypes.data
    )
    return None if found < 0 else ids[:found]


def few_room(size: int) -> int:
    """How many ids a top-k draw of a row of `size` ids works on at most: an eighth of them (likeliest.FEWEST,
    host_draw.FEW); where more are kept, the draw goes over the whole row."""
    return size // 8


def top_k(
    logits: np.ndarray, temperature: float, min_p: float, k: int, top_p: float, uniform: float, banned: np.ndarray
) -> int | None:
    """A top-k draw's id of float32 logits (V,) divided by `temperature` (> 0), the ids `banned` (ascending int64,
    each once) at -inf, compiled: host_draw.draw_among's pick over the ids at least as large as the k-th largest
    but the banned, the very id host_draw.draw picks over the whole row, in two passes over it and a few steps
    over those ids. None where the library is not here, the row is not contiguous float32, or draw_among
    would not pick from the few (more than few_room(V) of them, or fewer than k above -inf)."""
    room = few_room(logits.size)
    if LIBRARY is None or not readable(logits) or not 0 < k <= room:
        return None
    BUFFERS.get(logits.size)
    bans = (banned.ctypes.data, banned.size)
    head = (logits.ctypes.data, logits.size, temperature, min_p, k, top_p, uniform, *bans, room)
    picked = LIBRARY.whole_draw_top_k(*head, *BUFFERS.few_addresses)
    return None if picked < 0 else picked


def scores_rows(
    logits: Sequence[np.ndarray], counts: Sequence[int], banned: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray, float] | None]:
    """scores of several rows, each by its count and bans; with more than one row and DRAW_THREADS > 1,
    shared out between this thread and the pool's, as draws_logits shares its rows (each row's the same)."""
    part = lambda start, end, share: [scores(logits[i], counts[i], banned[i], share) for i in range(start, end)]
    n = len(logits)
    if n < SHARE_FROM or DRAW_THREADS < 2:
        return part(0, n, True)
    half = (n + 1) // 2
    other = POOL.submit(part, half, n, False)
    return part(0, half, False) + other.result()
