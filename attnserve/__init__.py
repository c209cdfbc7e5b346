"""attnserve: a transformer from a PyTorch training run to a measured gRPC endpoint on ONNX Runtime.

The layers, in the order a model passes through them (docs/design/index.md draws which may import which):
model/ (the Transformer in PyTorch: training, import, reference decoding), export/ (a checkpoint into an ONNX
model directory, gated by parity), runtime/ (a model directory on ONNX Runtime), engine/ (continuous batching
over a slot runner), core/ (the engine on its loaded model, in a thread or a process of its own), server/
(the serving process and its three front doors) and clients/ (the Python clients and their commands).
Beside them: tokenizer/ (the tokenizers, below everything), tracing/ (OpenTelemetry traces of requests),
ray_serve/ (attnserve.v1 on Ray Serve, one engine a replica), and the generated gRPC protocols v1/ (attnserve.v1),
inference/ (the Open Inference Protocol) and health/ (grpc.health.v1).

Modules: cli.py (the `attnserve` command: it imports only the subcommand asked for), flags.py (command-line
flags from dataclass fields), request_fields.py (a request's fields, declared once), request_ranges.py (the
ranges of a field's values that need no model) and report_stamp.py (every benchmark's stamp and report).
Each needs only the standard library, so that a client host can import it.
"""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it), `attnserve --version`
