"""The in-place KV arena: one preallocated buffer per past input, written by ONNX Runtime itself.

Torch-free, shared by the parity gate and the server, so that the gate drives the graph exactly
as serving does. Every buffer is (capacity, H, L, D) with L the context; slot s is row s. A run
over slots [first, first + B) binds the same rows as both `past_key_values.*` and `present.*`
(IO binding, by pointer), so GroupQueryAttention writes each new key where it lives and reads
only a row's real length (../shared/KV-ARENA.md). Nothing is copied per step; a row moves only
when a slot is refilled, and then only its used positions. The device is a parameter: the same
code binds host memory on the CPU provider and device memory on CUDA. Knows nothing of requests.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from . import contract

NP_DTYPES = {"float32": np.float32, "float16": np.float16}


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


class _CudaRuntime:
    """cudaMemcpy from the CUDA runtime that onnxruntime-gpu loads (device-to-device rows)."""

    def __init__(self):
        self.lib = None
        for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so", "cudart64_12.dll"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is None:
            raise RuntimeError("the CUDA runtime (libcudart) cannot be loaded; it comes with onnxruntime-gpu's "
                               "CUDA dependencies")
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def copy_device_to_device(self, dst: int, src: int, nbytes: int) -> None:
        status = self.lib.cudaMemcpy(dst, src, nbytes, 3)       # 3: cudaMemcpyDeviceToDevice
        if status != 0:
            raise RuntimeError(f"cudaMemcpy failed with CUDA error {status}")


_cuda: _CudaRuntime | None = None


def cuda_runtime() -> _CudaRuntime:
    global _cuda
    if _cuda is None:
        _cuda = _CudaRuntime()
    return _cuda


class KVArena:
    """The keys and values of `capacity` slots: 2 buffers per layer, (capacity, H, L, D) each, and
    the number of positions each slot holds."""

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, context: int, capacity: int,
                 dtype: str = "float32", device: Device = Device()):
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.context, self.capacity, self.device = context, capacity, device
        self.dtype = NP_DTYPES[dtype]
        self.shape = (capacity, n_heads, context, head_dim)                          # (B, H, L, D)
        self.buffers = [device.allocate(self.shape, self.dtype) for _ in range(2 * n_layers)]
        self.lengths = np.zeros(capacity, np.int64)                                  # positions held per slot
        self.itemsize = np.dtype(self.dtype).itemsize
        self.slot_bytes = n_heads * context * head_dim * self.itemsize               # one slot of one buffer

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
        names = zip(contract.past_names(self.n_layers), contract.present_names(self.n_layers), self.buffers)
        for past, present, buffer in names:
            address = buffer.data_ptr() + first * self.slot_bytes
            binding.bind_input(past, self.device.kind, self.device.id, self.dtype, shape, address)
            binding.bind_output(present, self.device.kind, self.device.id, self.dtype, shape, address)

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s keys and values into slot `dst` (its used positions only); src becomes empty."""
        used = int(self.lengths[src]) * self.head_dim * self.itemsize              # bytes per head
        head = self.context * self.head_dim * self.itemsize
        for buffer in self.buffers:
            base = buffer.data_ptr()
            for h in range(self.n_heads):
                self.device.copy(base + dst * self.slot_bytes + h * head, base + src * self.slot_bytes + h * head, used)
        self.lengths[dst], self.lengths[src] = self.lengths[src], 0


class ArenaDecoder:
    """A decoder-only arena graph driven slot by slot: prefill fresh prompts into empty slots
    (right-padded, together), extend one slot by a chunk, or decode one token for slots [0, B).

    Logits land in one preallocated host buffer of `max_tokens` rows (B * T of any run)."""

    def __init__(self, session: ort.InferenceSession, manifest: dict, capacity: int, max_tokens: int,
                 device: Device = Device()):
        config = manifest["config"]
        self.session, self.pad_id = session, int(manifest["tokenizer"]["pad_id"])
        self.context, self.vocab_size = int(config["max_len"]), int(config["vocab_size"])
        self.arena = KVArena(int(config["n_layers"]), int(config["n_heads"]), int(manifest["head_dim"]),
                             self.context, capacity, manifest["dtype"], device)
        self.max_tokens = max(max_tokens, capacity)
        self.logits = np.empty(self.max_tokens * self.vocab_size, self.arena.dtype)
        self._bindings: dict[tuple[int, int, int], ort.IOBinding] = {}   # (first slot, B, T) -> binding

    def run(self, first: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One run over slots [first, first + B): logits (B, T, V), a view of the host buffer."""
        b, t = ids.shape
        if b * t > self.max_tokens:
            raise ValueError(f"a run of {b} x {t} tokens exceeds the logits buffer ({self.max_tokens} tokens)")
        logits = self.logits[:b * t * self.vocab_size].reshape(b, t, self.vocab_size)
        binding = self._bindings.get((first, b, t))
        if binding is None:
            binding = self.session.io_binding()
            self.arena.bind(binding, first, b)
            binding.bind_output("logits", "cpu", 0, self.arena.dtype, [b, t, self.vocab_size], logits.ctypes.data)
            if t == 1:                        # decode steps repeat these shapes: keep their cache bindings
                self._bindings[(first, b, t)] = binding
        for name, value in (("input_ids", ids), ("attention_mask", mask), ("position_ids", positions)):
            binding.bind_cpu_input(name, np.ascontiguousarray(value, np.int64))
        self.session.run_with_iobinding(binding)
        return logits

    def prefill(self, first: int, prompts: list[list[int]]) -> np.ndarray:
        """Fresh prompts into the empty slots [first, first + b), right-padded; last-token logits (b, V)."""
        lengths = np.array([len(p) for p in prompts])
        assert not self.arena.lengths[first:first + len(prompts)].any(), "prefill into slots that hold state"
        t = int(lengths.max())
        ids = np.full((len(prompts), t), self.pad_id, np.int64)
        mask = np.zeros((len(prompts), t), np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)], mask[row, :len(prompt)] = prompt, 1
        positions = np.broadcast_to(np.arange(t), (len(prompts), t))
        logits = self.run(first, ids, mask, positions)
        self.arena.lengths[first:first + len(prompts)] = lengths
        return logits[np.arange(len(prompts)), lengths - 1].astype(np.float32)

    def extend(self, slot: int, tokens: list[int]) -> np.ndarray:
        """Append a chunk of tokens to one slot that holds state (batch 1); last-token logits (V,)."""
        held = int(self.arena.lengths[slot])
        if not held:
            return self.prefill(slot, [tokens])[0]
        total = held + len(tokens)
        ids = np.array([tokens], np.int64)
        logits = self.run(slot, ids, np.ones((1, total), np.int64), np.arange(held, total)[None])
        self.arena.lengths[slot] = total
        return logits[0, -1].astype(np.float32)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One new token for each of slots [0, B); logits (B, V)."""
        b = len(tokens)
        held = self.arena.lengths[:b]
        width = int(held.max()) + 1
        mask = (np.arange(width)[None, :] <= held[:, None]).astype(np.int64)            # (B, P+1), right-padded
        logits = self.run(0, np.asarray(tokens, np.int64).reshape(b, 1), mask, held.reshape(b, 1))
        self.arena.lengths[:b] += 1
        return logits[:, 0].astype(np.float32)

    def clear(self, slot: int) -> None:
        self.arena.lengths[slot] = 0

    def move(self, src: int, dst: int) -> None:
        self.arena.move(src, dst)
