"""The request session every door shares: its checks, its run through the engine, its pacing.

validation.py turns a request into the engine's GenerationRequest or an InvalidRequest naming the
field and its limit; events.py runs it through the engine (submit, events, release) and gathers or
paces what comes back (pacing.py); vllm_names.py reads vLLM's names for the fields, which the Open
Inference Protocol and the OpenAI API share. No gRPC and no HTTP here.
"""
