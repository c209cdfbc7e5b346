"""Export to ONNX and the model-directory contract.

`contract` is torch-free and read by the server; the other modules here import torch.
"""
