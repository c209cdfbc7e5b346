"""The attnserve gRPC process: front doors over one engine, on an exported model directory.

Reading order, outside in: app.py (start-up, health, drain) -> interceptors.py (status codes,
auth) -> servicer.py (attnserve.v1: protobuf <-> domain) and oip_servicer.py (the Open
Inference Protocol) -> validation.py -> the engine core (attnserve/core/): by default in a process of its own,
reached through core/client.py's EngineClient, else in a thread of this one (--engine-core
thread). stream_pacing.py and slow_readers.py pace and guard the streams;
config.py, health.py and metrics.py are the process's. benchmarks/serving.py and benchmarks/kv.py
(outside the package) measure it. A serving host needs no torch: nothing here imports it.
"""
