"""The transformer of the lectures, in PyTorch: layers, models, tokenizer, training.

Knows nothing of ONNX or gRPC.
"""
