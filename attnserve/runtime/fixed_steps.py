"""Decode steps with one address and one shape per batch size: what CUDA graphs need.

ONNX Runtime's CUDA provider can capture a run as a CUDA graph and replay it as one launch
(enable_cuda_graph), when every node runs on CUDA and every input and output is bound at the same
address with the same shape on every replay. An arena decode step over slots [0, B) is that, but
for two things: the attention mask's width (longest held + 1) and logits bound to host memory.
Here the mask is as wide as the context (ones up to each slot's length: GroupQueryAttention reads
each row's length from it), logits (and a picked step's greedy ids) go to device buffers read
back after the run, all rows or the sampling rows only, and each batch size is its own graph
(one per batch size and outputs; ONNX Runtime captures it after its first runs).

Replayed graphs make a decode step several times faster on a GPU, with the same greedy tokens but
for float16 ties (docs/design/decisions/cuda-graph-steps.md). The same code runs on the CPU
provider, where there is no graph to capture (the tests drive it there).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from . import contract


class FixedSteps:
    """Decode steps of an ArenaDecoder through `session` (enable_cuda_graph on CUDA)."""

    def __init__(self, session: ort.InferenceSession, decoder):
        self.session, self.decoder = session, decoder
        self.ids = decoder.device.allocate((decoder.arena.capacity, 1), np.int64)  # NEXT_TOKEN of picked steps
        self.positions = np.arange(decoder.context)[None, :]
        self.bindings: dict[tuple[int, bool], tuple[ort.IOBinding, ort.RunOptions]] = {}  # (B, picked) -> graph's

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One token for each of slots [0, B); logits (B, V) float32 on the host."""
        d = self.decoder
        self.run(tokens, picked=False)
        return d.read_rows(d.step_logits.data_ptr(), len(tokens), None)

    def decode_picked(self, tokens: np.ndarray, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """ArenaDecoder.decode_picked through a graph of its own per batch size: B ids and the logits
        of `rows` cross the bus."""
        d = self.decoder
        picked = self.step_ids(tokens)
        return picked, d.read_rows(d.step_logits.data_ptr(), len(tokens), rows)

    def step_ids(self, tokens: np.ndarray) -> np.ndarray:
        """One picked step: each slot's greedy token (B,) on the host; the logits stay on the device."""
        d, b = self.decoder, len(tokens)
        self.run(tokens, picked=True)
        return d.device.read(self.ids.data_ptr(), d.next_ids[:b]).copy()

    def run(self, tokens: np.ndarray, picked: bool) -> None:
        d, b = self.decoder, len(tokens)
        held = d.arena.lengths[:b]
        bound = (b, picked) in self.bindings
        binding, options = self.bindings[b, picked] if bound else self.bind(b, picked)
        mask = (self.positions <= held[:, None]).astype(np.int64)  # (B, L) at every step
        d.inputs.bind(binding, contract.INPUT_IDS, np.asarray(tokens).reshape(b, 1), bound)
        d.inputs.bind(binding, contract.ATTENTION_MASK, mask, bound)
        d.inputs.bind(binding, contract.POSITION_IDS, held.reshape(b, 1), bound)
        self.session.run_with_iobinding(binding, options)
        d.arena.lengths[:b] += 1

    def bind(self, b: int, picked: bool) -> tuple[ort.IOBinding, ort.RunOptions]:
        """Batch size b's binding: slots [0, b) of the arena, the first b rows of the logits buffer
        (and of the ids buffer for a picked step)."""
        d = self.decoder
        binding = self.session.io_binding()
        d.arena.bind(binding, 0, b)
        kind, device = d.device.kind, d.device.id
        shape = [b, 1, d.vocab_size]
        binding.bind_output(contract.LOGITS, kind, device, d.arena.dtype, shape, d.step_logits.data_ptr())
        if picked:
            binding.bind_output(contract.NEXT_TOKEN, kind, device, np.int64, [b, 1], self.ids.data_ptr())
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(2 * b + picked))  # one graph per (B, outputs)
        self.bindings[b, picked] = (binding, options)
        return binding, options
