"""host_draw's draw over whole rows, compiled (whole_draw.c, built at install as attnserve.engine._whole_draw
and loaded here with ctypes): rows with no top-k, under min-p, top-p or neither, picked in a few passes
over each row instead of numpy's dozen (16 flat rows of 50,257 ids: about 3 ms against 10). Its picks are
the definition's (tests/test_sampling.py), as numpy's are; the two may part only where a uniform number
falls within about 1e-15 of an id's edge, so wherever the library loads every row it takes is drawn by it,
alone or in a batch (host_draw.draw and batch_draw.draws both ask it first).

Where the library is not built (no C compiler at install) or the CPU lacks what it was built for (AVX2
and FMA on x86-64), or ATTNSERVE_WHOLE_DRAW=numpy is set, `available()` is False and numpy draws.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable

import numpy as np

ENV = "ATTNSERVE_WHOLE_DRAW"  # "numpy": leave every row to host_draw's numpy draw


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
    pointer, count = ctypes.c_void_p, ctypes.c_int64
    library.whole_draws.argtypes = (pointer, count, count, count, *[pointer] * 7)
    library.whole_draws_logits.argtypes = (pointer, count, count, count, *[pointer] * 8)
    library.whole_draws.restype = library.whole_draws_logits.restype = None
    return library


LIBRARY = load()


def available() -> bool:
    """Whether the compiled draw runs here (otherwise numpy's draws every row)."""
    return LIBRARY is not None


class Buffers(threading.local):
    """Each thread's buffers for rows of one size (V,): the weights (float64), each id's bucket of value and
    the crossing bucket's ids (int32 each)."""

    size = -1

    def get(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if size != self.size:
            self.size, self.weights = size, np.empty(size)
            self.buckets, self.members = np.empty(size, np.int32), np.empty(size, np.int32)
        return self.weights, self.buckets, self.members


BUFFERS = Buffers()


def draws(scaled: np.ndarray, min_p: np.ndarray, top_p: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Each temperature-scaled row's id (n,) int64 of rows (n, V) float64 (rows contiguous), with no top-k,
    by its min-p, top-p and uniform number (n,) each: host_draw.draw's; -1 for a row left to numpy's draw
    (min-p keeping at most V / FEW ids, every id -inf, or memory short)."""
    assert LIBRARY is not None and scaled.dtype == np.float64 and scaled.strides[1] == 8
    return call(LIBRARY.whole_draws, scaled, (), min_p, top_p, uniform)


def draws_logits(
    logits: np.ndarray, temperature: np.ndarray, min_p: np.ndarray, top_p: np.ndarray, uniform: np.ndarray
) -> np.ndarray:
    """draws' ids of float32 logits (n, V) divided by their temperatures (n,) > 0: those of the rows as
    sampling.processed_row divides them (in float64), without the copy: each row is read as it is."""
    assert LIBRARY is not None and logits.dtype == np.float32 and logits.strides[1] == 4
    return call(LIBRARY.whole_draws_logits, logits, (temperature,), min_p, top_p, uniform)


def call(
    function: Callable[..., None], rows: np.ndarray, before: tuple[np.ndarray, ...], *per_row: np.ndarray
) -> np.ndarray:
    """One of the library's draws over rows (n, V): its per-row float64 arguments, this thread's buffers, and
    the ids it writes (-1 for a row it leaves to numpy)."""
    n, size = rows.shape
    weights, buckets, members = BUFFERS.get(size)
    ids = np.empty(n, np.int64)
    arguments = [np.ascontiguousarray(a, np.float64) for a in (*before, *per_row)]
    stride = rows.strides[0] // rows.itemsize if n > 1 else size
    function(
        rows.ctypes.data,
        n,
        size,
        stride,
        *(a.ctypes.data for a in arguments),
        weights.ctypes.data,
        buckets.ctypes.data,
        members.ctypes.data,
        ids.ctypes.data,
    )
    return np.where(ids < 0, -1, ids)


def draw(scaled: np.ndarray, min_p: float, top_p: float, uniform: float) -> int | None:
    """One row's (V,) id as draws gives it; None where the library is not here or leaves the row to numpy."""
    if LIBRARY is None:
        return None
    row = scaled if scaled.dtype == np.float64 and scaled.strides[0] == 8 else np.ascontiguousarray(scaled, np.float64)
    picked = int(draws(row[None], np.array([min_p]), np.array([top_p]), np.array([uniform]))[0])
    return None if picked < 0 else picked


def draw_logits(logits: np.ndarray, temperature: float, min_p: float, top_p: float, uniform: float) -> int | None:
    """One float32 row's (V,) id as draws_logits gives it; None where the library is not here or leaves the row
    to numpy, or the row is not contiguous float32."""
    if LIBRARY is None or logits.dtype != np.float32 or logits.strides[0] != 4:
        return None
    values = (np.array([v]) for v in (temperature, min_p, top_p, uniform))
    picked = int(draws_logits(logits[None], *values)[0])
    return None if picked < 0 else picked
