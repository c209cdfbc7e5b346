"""The attnserve gRPC server: an exported model directory served on ONNX Runtime.

Reading order, outside in: app.py (start-up, health, drain) -> interceptors.py (status codes,
auth) -> servicer.py (protobuf <-> domain) -> validation.py -> engine.py (continuous batching)
-> sequence.py, sampling.py, streaming.py (one request's tokens and text) -> runners.py ->
arena_runner.py (request keys in the slots of export/arena.py's in-place KV arena; concat_runner.py
and kv_cache.py for concat directories) -> model_runner.py (the sessions, on their provider). A serving host needs no torch: nothing here
imports it, and the model is read through the torch-free export contract only.
"""
