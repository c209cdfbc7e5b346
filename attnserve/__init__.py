"""attnserve: a transformer from a PyTorch training run to a measured gRPC endpoint on ONNX Runtime."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it), `attnserve --version`
