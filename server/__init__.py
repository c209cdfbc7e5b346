"""The attnserve gRPC server: an exported model directory served on ONNX Runtime.

Reading order, outside in: app.py (start-up, health, drain) -> interceptors.py (status codes,
auth) -> servicer.py (protobuf <-> domain) -> validation.py -> engine.py (continuous batching)
-> sequence.py, sampling.py, streaming.py (one request's tokens and text) -> kv_cache.py and
model_runner.py (the cache and the session). A serving host needs no torch: nothing here
imports it, and the model is read through the torch-free export contract only.
"""
