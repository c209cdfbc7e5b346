"""A run's int64 inputs (ids, attention mask, positions, a source mask) in buffers allocated once.

Each input has one buffer, sized at start-up for the largest run it can see; a run writes its
values there and binds the buffer's first elements with the run's shape. No input memory is
allocated per step, on the CPU and on CUDA alike (IO binding's bind_cpu_input of a fresh array
would copy it to the device at every bind on CUDA). Values are written into a host buffer, then
bound where the device wants them:
  - CUDA: device memory, written by one copy queued on the session's stream, bound by address;
  - CPU: the host buffer itself, bound as a numpy view, which ONNX Runtime wraps without copying
    (binding a raw address costs about 8 us more per input there, 7% of a one-stream step on 2 cores).
An input whose shape a binding already holds (a decode step's ids) is only written, not rebound.
Knows nothing of requests or KV layouts.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort

from .arena import Device


class StepInputs:
    """Named int64 buffers on `device`, each holding up to `sizes[name]` elements."""

    def __init__(self, device: Device, sizes: dict[str, int]):
        self.device, self.sizes = device, dict(sizes)
        self.on_host = device.kind == "cpu"
        self.host = {name: np.zeros(max(1, n), np.int64) for name, n in sizes.items()}
        if not self.on_host:
            self.buffers = {name: device.allocate((max(1, n),), np.int64) for name, n in sizes.items()}

    def address(self, name: str) -> int:
        return int(self.host[name].ctypes.data) if self.on_host else self.buffers[name].data_ptr()

    def write(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The first elements of `name`'s host buffer as `shape`, for a run's values; then bind_written."""
        size = math.prod(shape)
        if size > self.sizes[name]:
            raise ValueError(f"input {name} of {size} elements exceeds its buffer ({self.sizes[name]})")
        return self.host[name][:size].reshape(shape)

    def bind_written(self, binding: ort.IOBinding, name: str, view: np.ndarray, bound: bool = False) -> None:
        """Bind what `write` gave and the caller wrote as the input `name` (on CUDA, copied to the
        device first); `bound`: `binding` already binds this buffer with this shape (a decode step's
        ids), so only the values change."""
        if self.on_host:
            if not bound:
                binding.bind_cpu_input(name, view)
            return
        address = self.buffers[name].data_ptr()
        self.device.upload(address, view)
        if not bound:
            binding.bind_input(name, self.device.kind, self.device.id, np.int64, list(view.shape), address)

    def bind(self, binding: ort.IOBinding, name: str, values: np.ndarray, bound: bool = False) -> None:
        """Write `values` into `name`'s buffer and bind it (see bind_written)."""
        values = np.asarray(values)
        view = self.write(name, values.shape)
        view[...] = values
        self.bind_written(binding, name, view, bound)
