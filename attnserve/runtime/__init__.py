"""The runtime: an exported model directory driven on ONNX Runtime. Torch-free: onnxruntime, numpy
and the tokenizer only.

contract.py (the manifest and I/O names export writes and everyone reads) -> ort_session.py
(sessions on their provider, dtypes, padding) -> arena.py (the in-place KV arena) and
arena_decoder.py (prefill and decode over it) -> model_sessions.py (a directory's sessions, checked
against what graph_facts.py reads of its graphs) ->
arena_runner.py (request keys in the arena's slots: the engine's SlotRunner; opening.py sizes and
opens it). ort_decoder.py is the simplest correct greedy loop, which export's parity gate and the
benchmarks drive (benchmarks/concat_runner.py, outside the package, keeps the engine the arena
replaced as the KV benchmark's baseline). Knows nothing of scheduling, sampling or gRPC; imports
only the engine's seam (engine/seam.py's ModelSpec).
"""
