"""The runtime: an exported model directory driven on ONNX Runtime. Torch-free: onnxruntime, numpy and the
tokenizer only.

contract.py (the manifest and I/O names export writes and everyone reads) -> ort_session.py (sessions on their
provider, dtypes, padding) -> arena.py (the in-place KV arena; cuda_runtime.py the copies it queues itself on
CUDA) and arena_decoder.py (prefill and decode over it; step_inputs.py its input buffers, allocated once;
fixed_steps.py its decode steps as CUDA graphs want them) -> model_sessions.py (a directory's sessions,
checked against what graph_facts.py reads of its graphs) -> arena_runner.py (request keys in the arena's
slots: the engine's SlotRunner; opening.py sizes and opens it; prefix_cache.py keeps prompt blocks' keys and
values beside the arena, indexed by prefix_blocks.py; run_ahead.py runs a burst's steps on a thread of their
own, one step ahead of the engine). logits_pass.py runs the batched logits pass
(logits_pass.<dtype>.onnx, which export/logits_pass_graph.py writes) over a decode step's logits where they
are. ort_decoder.py is the simplest correct greedy loop, which export's parity gate and the benchmarks drive
(benchmarks/concat_runner.py, outside the package, keeps the engine the arena replaced as the KV benchmark's
baseline). tokenize_cli.py is `attnserve tokenize`: a directory's tokenizer from the command line. Knows
nothing of scheduling or gRPC, and samples only as the engine's PassRows say; imports only the engine's seam
(engine/seam.py: ModelSpec, PassRow, Pick).
"""
