"""The engine core: the engine (attnserve/engine/) on its loaded model (attnserve/runtime/), as one
unit the server runs in a thread of its own process or in a process of its own, as vLLM's v1
engine core sits apart from its entrypoints. No gRPC, no protobuf, no front door here.

Reading order: config.py (CoreConfig: what the core reads of the server's configuration) ->
starting.py (the core started in either mode, as one value) -> loading.py (the session, tokenizer
and arena) -> process.py (the core's own process: its main, its engine delivering through
step_writer.py, the front end's messages through the engine's public calls) -> protocol.py (the
messages; observations.py, the engine's reports in them) over channel.py (one Unix socket) ->
client.py (the front end's EngineClient: the engine's calls, answered by the core's process; its
receiver naps by naps.py). traced_outbox.py is the engine's outbox with tracing on (the core's spans
of each request that ended); log_lines.py writes both processes' log lines (text or JSON).
slow_steps.py is a test's brake.
"""
