"""The in-place KV arena: one preallocated buffer per past input, written by ONNX Runtime itself.

Torch-free, shared by the parity gate and the server, so that the gate drives the graph exactly
as serving does. Every buffer is (capacity, H, L, D) with L the context; slot s is row s. A run
over slots [first, first + B) binds the same rows as both `past_key_values.*` and `present.*`
(IO binding, by pointer), so GroupQueryAttention writes each new key where it lives and reads
only a row's real length (README, "The KV arena"). Nothing is copied per step; a row moves only
when a slot is refilled, and then only its used positions. The device is a parameter: the same
code binds host memory on the CPU provider and device memory on CUDA. Knows nothing of requests.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from . import contract
from .ort_session import NP_DTYPES


@dataclass(frozen=True)
class Device:
    """Where the arena lives: "cpu" or "cuda" (with its id), and how bytes move there."""

    kind: str = "cpu"
    id: int = 0

    def allocate(self, shape: tuple[int, ...], dtype) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.kind, self.id)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Copy `nbytes` between two addresses of this device."""
        if self.kind == "cpu":
            ctypes.memmove(dst, src, nbytes)
        else:
            cuda_runtime().copy_device_to_device(dst, src, nbytes)

    def zero(self, address: int, nbytes: int) -> None:
        """Fill `nbytes` at `address` with zeros (once, at allocation: no buffer ever holds garbage)."""
        if self.kind == "cpu":
            ctypes.memset(address, 0, nbytes)
        else:
            cuda_runtime().zero(address, nbytes)


class _CudaRuntime:
    """cudaMemcpy from the CUDA runtime that onnxruntime-gpu loads (device-to-device rows)."""

    def __init__(self):
        self.lib = self.load()
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    @staticmethod
    def load() -> ctypes.CDLL:
        """The first libcudart that loads (its name differs by CUDA version and OS)."""
        for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so", "cudart64_12.dll"):
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
        raise RuntimeError(
            "the CUDA runtime (libcudart) cannot be loaded; it comes with onnxruntime-gpu's CUDA dependencies"
        )

    def copy_device_to_device(self, dst: int, src: int, nbytes: int) -> None:
        self.check("cudaMemcpy", self.lib.cudaMemcpy(dst, src, nbytes, 3))  # 3: cudaMemcpyDeviceToDevice

    def zero(self, address: int, nbytes: int) -> None:
        self.check("cudaMemset", self.lib.cudaMemset(address, 0, nbytes))

    @staticmethod
    def check(call: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")


_cuda: _CudaRuntime | None = None


def cuda_runtime() -> _CudaRuntime:
    global _cuda
    if _cuda is None:
        _cuda = _CudaRuntime()
    return _cuda


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
        self.dtype = NP_DTYPES[dtype]
        self.shape = (capacity, n_heads, context, head_dim)  # (B, H, L, D)
        self.buffers = [device.allocate(self.shape, self.dtype) for _ in range(2 * n_layers)]
        self.lengths = np.zeros(capacity, np.int64)  # positions held per slot
        self.itemsize = np.dtype(self.dtype).itemsize
        self.slot_bytes = n_heads * context * head_dim * self.itemsize  # one slot of one buffer
        for buffer in self.buffers:  # attention masks rows it must not see; they must be finite
            device.zero(buffer.data_ptr(), capacity * self.slot_bytes)

    @staticmethod
    def bytes_needed(n_layers: int, n_heads: int, head_dim: int, context: int, capacity: int, dtype: str) -> int:
        """The arena's size before it is allocated (for --kv-cache-memory and --max-batch auto)."""
        return 2 * n_layers * capacity * n_heads * context * head_dim * np.dtype(NP_DTYPES[dtype]).itemsize

    @property
    def nbytes(self) -> int:
        return len(self.buffers) * self.capacity * self.slot_bytes

    def bind(self, binding: ort.IOBinding, first: int, count: int) -> None:
        """Bind slots [first, first + count) as both past and present of every layer."""
        shape = [count, self.n_heads, self.context, self.head_dim]
        for i, buffer in enumerate(self.buffers):
            address = buffer.data_ptr() + first * self.slot_bytes
            binding.bind_input(self.inputs[i], self.device.kind, self.device.id, self.dtype, shape, address)
            if self.outputs:
                binding.bind_output(self.outputs[i], self.device.kind, self.device.id, self.dtype, shape, address)

    def write(self, slot: int, rows: list[ort.OrtValue], row: int, length: int) -> None:
        """Row `row` of graph outputs (b, H, S, D) on this device, its first `length` positions, into `slot`."""
        head = self.context * self.head_dim * self.itemsize
        for buffer, value in zip(self.buffers, rows):
            s = value.shape()[2]
            src, dst = value.data_ptr() + row * self.n_heads * s * self.head_dim * self.itemsize, buffer.data_ptr()
            for h in range(self.n_heads):
                self.device.copy(
                    dst + slot * self.slot_bytes + h * head,
                    src + h * s * self.head_dim * self.itemsize,
                    length * self.head_dim * self.itemsize,
                )
        self.lengths[slot] = length

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s keys and values into slot `dst` (its used positions only); src becomes empty."""
        used = int(self.lengths[src]) * self.head_dim * self.itemsize  # bytes per head
        head = self.context * self.head_dim * self.itemsize
        for buffer in self.buffers:
            base = buffer.data_ptr()
            for h in range(self.n_heads):
                self.device.copy(base + dst * self.slot_bytes + h * head, base + src * self.slot_bytes + h * head, used)
        self.lengths[dst], self.lengths[src] = self.lengths[src], 0

    def read(self, slot: int) -> list[np.ndarray]:
        """One slot's used positions, (H, n, D) per buffer, on the host (the parity gate's view; CPU only)."""
        n = int(self.lengths[slot])
        return [b.numpy()[slot, :, :n].astype(np.float32) for b in self.buffers]
