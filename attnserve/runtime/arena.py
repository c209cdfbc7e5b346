"""The in-place KV arena: one preallocated buffer per past input, written by ONNX Runtime itself.

Torch-free, shared by the parity gate and the server, so that the gate drives the graph exactly
as serving does. Every buffer is (capacity, H, L, D) with L the context; slot s is row s. A run
over slots [first, first + B) binds the same rows as both `past_key_values.*` and `present.*`
(IO binding, by pointer), so GroupQueryAttention writes each new key where it lives and reads
only a row's real length (docs/guides/export.md). Nothing is copied per step; a row moves only
when a slot is refilled, and then only its used positions. The device is a parameter: the same
code binds host memory on the CPU provider and device memory on CUDA. Knows nothing of requests.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from . import contract
from .cuda_runtime import cuda_runtime
from .ort_session import ELEMENT_TYPES, HOST_DTYPES, compute_stream, to_float32


@dataclass(frozen=True)
class Device:
    """Where the arena and the run inputs live: "cpu" or "cuda" (with its id), and how bytes move there.

    On CUDA every copy is queued on `stream`, the stream the session computes on (ort_session.
    create_session makes the session use one of ours), so a copy queued between two runs cannot
    race either: it starts after the kernels queued before it and ends before those after it."""

    kind: str = "cpu"
    id: int = 0
    stream: int = 0  # CUDA only

    def allocate(self, shape: tuple[int, ...], element_type) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), element_type, self.kind, self.id)

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        """`rows` runs of `width` bytes, `*_pitch` bytes apart, between two places on this device: one
        2D copy on CUDA, a memmove per row on the host."""
        if self.kind == "cpu":  # a memmove per row: several times faster than numpy's strided byte copy
            for row in range(rows):
                ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)
        else:
            cuda_runtime().copy_rows(dst, dst_pitch, src, src_pitch, width, rows, self.stream)

    def upload(self, address: int, values: np.ndarray) -> None:
        """A contiguous host array's bytes to `address` (a run's inputs)."""
        if self.kind == "cpu":
            ctypes.memmove(address, values.ctypes.data, values.nbytes)
        else:
            cuda_runtime().upload(address, values.ctypes.data, values.nbytes, self.stream)

    def read(self, address: int, out: np.ndarray) -> np.ndarray:
        """The bytes at `address` into the contiguous host array `out` (a step's logits under CUDA
        graphs; the cache only in the parity gate's and the tests' reads), after all queued work."""
        if self.kind == "cpu":
            ctypes.memmove(out.ctypes.data, address, out.nbytes)
        else:
            cuda_runtime().download(out.ctypes.data, address, out.nbytes, self.stream)
        return out

    def host_view(self, value: ort.OrtValue, dtype: npt.DTypeLike) -> np.ndarray | None:
        """A buffer of this device read where it is, as a read-only host array of `dtype` in its shape:
        on the host, no copy (valid while the buffer lives; what a run writes there shows through); None on
        CUDA, whose bytes must be read (read)."""
        if self.kind != "cpu":
            return None
        shape = value.shape()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        view = (
            np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(value.data_ptr())).view(dtype).reshape(shape)
        )
        view.flags.writeable = False
        return view

    def free_bytes(self) -> int:
        """Memory that can still be allocated here: the host's MemAvailable, or the GPU's free bytes."""
        if self.kind == "cpu":
            return host_available()
        return cuda_runtime().free_memory()

    def filled_as_used(self, address: int, nbytes: int) -> None:
        """A buffer written a little at a time while serving (the prefix cache's pool): on the host, kept out of
        transparent huge pages. Where the kernel gives large mappings huge pages (THP always) or malloc asks
        for them, each first write would fault in and zero 2 MiB while a request waits (GPT-2 124M int8, 16
        streams: time to first token 1.0 s against 0.33 in the first round) and grow the resident set by whole
        huge pages (+0.9 GiB)."""
        if self.kind == "cpu":
            small_pages(address, nbytes)

    def zero(self, address: int, nbytes: int) -> None:
        """Fill `nbytes` at `address` with zeros (once, at allocation: no buffer ever holds garbage)."""
        if self.kind == "cpu":
            ctypes.memset(address, 0, nbytes)
        else:
            cuda_runtime().zero(address, nbytes)


MADV_NOHUGEPAGE = 15  # Linux's madvise advice: no transparent huge pages in this range
HUGE_PAGE = 2 << 20


def small_pages(address: int, nbytes: int) -> None:
    """Keep the host memory at `address` out of transparent huge pages (Linux; elsewhere nothing): the whole
    huge pages inside it, which is all THP could make of it."""
    start, end = -(-address // HUGE_PAGE) * HUGE_PAGE, (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if sys.platform.startswith("linux") and end > start:
        ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_NOHUGEPAGE)


def host_available() -> int:
    """The host's available memory (MemAvailable in /proc/meminfo; free pages where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_of(session: ort.InferenceSession) -> Device:
    """The device a session runs on, with the stream it computes on."""
    stream = compute_stream(session)
    return Device("cuda", 0, stream) if stream else Device()


class KVArena:
    """The keys and values of `capacity` slots: 2 buffers per layer, (capacity, H, L, D) each, and
    the number of positions each slot holds."""

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        head_dim: int,
        context: int,
        capacity: int,
        dtype: str = "float32",
        device: Device = Device(),
        inputs: list[str] | None = None,
        outputs: list[str] | None = None,
    ):
        """`inputs`/`outputs`: the graph names bound to the buffers (default: the decoder's past and
        present); no outputs binds the buffers as inputs only (cross-attention keys and values)."""
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.inputs = inputs or contract.past_names(n_layers)
        self.outputs = outputs if outputs is not None else contract.present_names(n_layers)
        self.context, self.capacity, self.device = context, capacity, device
        self.dtype_name, self.dtype = dtype, ELEMENT_TYPES[dtype]  # the manifest's name, IO binding's type
        self.shape = (capacity, n_heads, context, head_dim)  # (B, H, L, D)
        self.buffers = [device.allocate(self.shape, self.dtype) for _ in range(2 * n_layers)]
        self.lengths = np.zeros(capacity, np.int64)  # positions held per slot
        self.itemsize = np.dtype(HOST_DTYPES[dtype]).itemsize
        self.width = context  # positions a head's row is laid out and bound with (refit: fewer)
        self.scratch: ort.OrtValue | None = None  # one buffer's room, where refit moves a buffer through
        for buffer in self.buffers:  # attention masks rows it must not see; they must be finite
            device.zero(buffer.data_ptr(), capacity * self.slot_bytes)

    @staticmethod
    def bytes_needed(n_layers: int, n_heads: int, head_dim: int, context: int, capacity: int, dtype: str) -> int:
        """The arena's size before it is allocated (for --kv-cache-memory and --max-batch auto)."""
        return 2 * n_layers * capacity * n_heads * context * head_dim * np.dtype(HOST_DTYPES[dtype]).itemsize

    @property
    def nbytes(self) -> int:
        return self.bytes_needed(
            self.n_layers, self.n_heads, self.head_dim, self.context, self.capacity, self.dtype_name
        )

    @property
    def head_bytes(self) -> int:
        """The bytes between one head's row of positions and the next (a slot's H rows, then the next slot's)."""
        return self.width * self.head_dim * self.itemsize

    @property
    def slot_bytes(self) -> int:
        """One slot of one buffer, at `width`."""
        return self.n_heads * self.head_bytes

    def refit(self, width: int) -> None:
        """Lay every slot out with `width` positions a head (at most the context, at least the longest slot
        holds): the slots' used positions move, the buffer stays. A graph that reads every position it is
        bound with (an encoder-decoder's cross-attention) then reads `width` of them, not the context's
        (docs/design/decisions/cross-arena-width.md). Each buffer goes through `scratch` (one dense copy
        out, one strided copy back), so no copy reads what another has written, on any device. The
        bindings made before must be made again (the shapes and the slots' addresses change)."""
        assert int(self.lengths.max(initial=0)) <= width <= self.context, "a refit keeps every slot's positions"
        if width == self.width:
            return
        used = np.flatnonzero(self.lengths)
        slots = int(used[-1]) + 1 if len(used) else 0
        rows, old_pitch, kept = slots * self.n_heads, self.head_bytes, min(width, self.width)
        self.width = width
        if not rows:
            return
        if self.scratch is None:
            self.scratch = self.device.allocate(self.shape, self.dtype)
        room, span = self.scratch.data_ptr(), rows * old_pitch
        for buffer in self.buffers:
            base = buffer.data_ptr()
            self.device.copy_rows(room, span, base, span, span, 1)  # a pitch below the width: CUDA refuses it
            self.device.copy_rows(base, self.head_bytes, room, old_pitch, kept * self.head_dim * self.itemsize, rows)

    def bind(self, binding: ort.IOBinding, first: int, count: int) -> None:
        """Bind slots [first, first + count) as both past and present of every layer."""
        shape = [count, self.n_heads, self.width, self.head_dim]
        for i, buffer in enumerate(self.buffers):
            address = buffer.data_ptr() + first * self.slot_bytes
            binding.bind_input(self.inputs[i], self.device.kind, self.device.id, self.dtype, shape, address)
            if self.outputs:
                binding.bind_output(self.outputs[i], self.device.kind, self.device.id, self.dtype, shape, address)

    def write(self, slot: int, rows: list[ort.OrtValue], row: int, length: int) -> None:
        """Row `row` of graph outputs (b, H, S, D) on this device, its first `length` positions, into
        `slot`: one strided copy per buffer (a head's positions are contiguous in both)."""
        assert length <= self.width, "refit the arena first: a row longer than its width"
        head = self.head_bytes
        for buffer, value in zip(self.buffers, rows):
            s = value.shape()[2]
            src = value.data_ptr() + row * self.n_heads * s * self.head_dim * self.itemsize
            dst = buffer.data_ptr() + slot * self.slot_bytes
            width = length * self.head_dim * self.itemsize
            self.device.copy_rows(dst, head, src, s * self.head_dim * self.itemsize, width, self.n_heads)
        self.lengths[slot] = length

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s keys and values into slot `dst` (copy); src becomes empty."""
        self.copy(src, dst)
        self.lengths[src] = 0

    def copy(self, src: int, dst: int) -> None:
        """Slot `src`'s keys and values into slot `dst`, its used positions only, one strided copy per
        buffer (n_heads rows of the used bytes); src keeps them (n completions of one prefilled prompt)."""
        used = int(self.lengths[src]) * self.head_dim * self.itemsize  # bytes per head
        head = self.head_bytes
        if used:
            for buffer in self.buffers:
                base = buffer.data_ptr()
                to, start = base + dst * self.slot_bytes, base + src * self.slot_bytes
                self.device.copy_rows(to, head, start, head, used, self.n_heads)
        self.lengths[dst] = self.lengths[src]

    def read(self, slot: int) -> list[np.ndarray]:
        """One slot's used positions, (H, n, D) float32 per buffer, on the host (the parity gate's view)."""
        n = int(self.lengths[slot])
        host = HOST_DTYPES[self.dtype_name]
        out = []
        for buffer in self.buffers:
            raw = self.device.read(
                buffer.data_ptr() + slot * self.slot_bytes, np.empty(self.slot_bytes, np.uint8)
            ).view(host)
            out.append(to_float32(raw.reshape(self.n_heads, self.width, self.head_dim)[:, :n], self.dtype_name))
        return out
