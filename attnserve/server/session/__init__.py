"""The request session every door shares: one request value, its checks, its run through the engine.

request.py is the plain value each door builds at its edge (RequestFields); validation.py turns it
into the engine's GenerationRequest or an InvalidRequest naming the field as the caller sent it,
and its limit (the ranges that need no model are attnserve/request_ranges.py's, which the client's
command line reads too); events.py runs it through the engine (submit, events, release) and
gathers what comes back, whole or as a stream's messages (the engine holds them to the stream
interval); vllm_names.py reads vLLM's names for the fields, which the Open Inference Protocol and
the OpenAI API share. No gRPC and no HTTP here.
"""
