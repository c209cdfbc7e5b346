"""The attnserve serving process: three front doors over one engine core, on an exported model directory.

Rooms, outside in: app.py (start-up, health, drain; assembly.py the functions that build its parts
from the config and the engine core's facts; config.py its settings, health.py, metrics.py,
stats_log.py and http_serving.py the process's; test_switches.py a test's: the step delay the core
reads from the environment, and the leaking interceptor the soak passes in) -> the doors, each a
room that speaks one protocol: grpc_v1/ (attnserve.v1), grpc_oip/ (the Open Inference Protocol) and
http_openai/ (OpenAI's HTTP API) -> session/ (what every door shares: the request value, validation,
the run through the engine, vLLM's field names) -> the engine core (attnserve/core/): by default in
a process of its own, reached through core/client.py's EngineClient, else in a thread of this one
(--engine-core thread); front_ends.py starts --api-server-count's front ends more, each a process
with all of the above over the same core, on the same ports. The gRPC doors stand behind
grpc_boundary/ (error statuses, auth, undecodable bytes, slow readers); every door checks a bearer
token with bearer.py. No door imports another. benchmarks/serving.py and benchmarks/kv.py (outside
the package) measure it. A serving host needs no torch: nothing here imports it;
checkpoint_exports.py serves a Hugging Face checkpoint directory by running `attnserve import` and
`export` once, in child processes, into a cache.
"""
