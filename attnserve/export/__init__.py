"""Export to ONNX: a checkpoint becomes a model directory, written by the contract in
runtime/contract.py and gated by parity against PyTorch, driven through the runtime exactly as
serving drives it. The modules here import torch, except genai.py and quantize.py.
"""
