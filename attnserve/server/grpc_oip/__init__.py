"""The Open Inference Protocol door (KServe v2, Triton's gRPC API): servicer.py over the engine,
request.py (a ModelInferRequest read as Triton's vLLM backend reads it), tensors.py (tensors and
parameters <-> Python values).
"""
