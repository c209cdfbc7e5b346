"""A run's int64 inputs (ids, attention mask, positions, a source mask) in buffers allocated once.

Each input has one buffer on the serving device, sized at start-up for the largest run it can
see; a run writes its values there (one copy, queued on the session's stream on CUDA) and binds
the buffer's first elements with the run's shape. No OrtValue and no device memory is allocated
per step, on the CPU and on CUDA alike (IO binding's bind_cpu_input would allocate and copy each
one at every bind). Knows nothing of requests or KV layouts.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .arena import Device


class StepInputs:
    """Named int64 buffers on `device`, each holding up to `sizes[name]` elements."""

    def __init__(self, device: Device, sizes: dict[str, int]):
        self.device = device
        self.buffers = {name: device.allocate((max(1, n),), np.int64) for name, n in sizes.items()}
        self.sizes = dict(sizes)

    def bind(self, binding: ort.IOBinding, name: str, values: np.ndarray) -> None:
        """Write `values` into `name`'s buffer and bind it as the input `name` with their shape."""
        values = np.ascontiguousarray(values, np.int64)
        if values.size > self.sizes[name]:
            raise ValueError(f"input {name} of {values.size} elements exceeds its buffer ({self.sizes[name]})")
        address = self.buffers[name].data_ptr()
        self.device.upload(address, values)
        binding.bind_input(name, self.device.kind, self.device.id, np.int64, list(values.shape), address)
