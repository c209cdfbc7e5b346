"""attnserve: a transformer from a PyTorch training run to a measured gRPC endpoint on ONNX Runtime."""

__version__ = "0.1.0"
