"""The attnserve gRPC server: an exported model directory served on ONNX Runtime.

Reading order, outside in: app.py (start-up, health, drain) -> interceptors.py (status codes,
auth) -> servicer.py (protobuf <-> domain) -> validation.py -> engine.py (continuous batching,
over slot_runner.py's seam: a ModelSpec and a SlotRunner) -> sequence.py, sampling.py,
streaming.py (one request's tokens and text) -> runners.py ->
arena_runner.py (request keys in the slots of the in-place KV arena, export/arena_decoder.py)
-> model_runner.py (the sessions, on their provider). kv_benchmark.py measures the arena
against concat_runner.py and kv_cache.py, the engine it replaced. A serving host needs no
torch: nothing here imports it, and the model is read through the torch-free export contract.
"""
