"""A run's int64 inputs (ids, attention mask, positions, a source mask) in buffers allocated once.

Each input has one buffer, sized at start-up for the largest run it can see; a run writes its
values there and binds the buffer's first elements with the run's shape. No input memory is
allocated per step, on the CPU and on CUDA alike (IO binding's bind_cpu_input of a fresh array
would copy it to the device at every bind on CUDA). Where the buffer lives is the device's:
  - CUDA: device memory, written by one copy queued on the session's stream, bound by address;
  - CPU: host memory, bound as a numpy view, which ONNX Runtime wraps without copying (binding a
    raw address costs about 8 us more per input there, 7% of a one-stream step on 2 cores).
A decode step's ids and positions keep their shape, so a cached binding is only written, not rebound.
Knows nothing of requests or KV layouts.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .arena import Device


class StepInputs:
    """Named int64 buffers on `device`, each holding up to `sizes[name]` elements."""

    def __init__(self, device: Device, sizes: dict[str, int]):
        self.device, self.sizes = device, dict(sizes)
        self.on_host = device.kind == "cpu"
        if self.on_host:
            self.host = {name: np.zeros(max(1, n), np.int64) for name, n in sizes.items()}
        else:
            self.buffers = {name: device.allocate((max(1, n),), np.int64) for name, n in sizes.items()}

    def address(self, name: str) -> int:
        return int(self.host[name].ctypes.data) if self.on_host else self.buffers[name].data_ptr()

    def bind(self, binding: ort.IOBinding, name: str, values: np.ndarray, bound: bool = False) -> None:
        """Write `values` into `name`'s buffer and bind it as the input `name` with their shape;
        `bound`: `binding` already binds this buffer with this shape (a decode step's ids), so the
        write is all a run needs."""
        values = np.asarray(values, np.int64)
        if values.size > self.sizes[name]:
            raise ValueError(f"input {name} of {values.size} elements exceeds its buffer ({self.sizes[name]})")
        if self.on_host:
            view = self.host[name][: values.size].reshape(values.shape)
            view[...] = values
            if not bound:
                binding.bind_cpu_input(name, view)
            return
        address = self.buffers[name].data_ptr()
        self.device.upload(address, np.ascontiguousarray(values))
        if not bound:
            binding.bind_input(name, self.device.kind, self.device.id, np.int64, list(values.shape), address)
