"""Load tests run against a real `attnserve serve` process: soak (many streams for a long time,
with misbehaving clients) and overload (open-loop arrivals above capacity). Clients only: no torch,
no ONNX Runtime; they speak gRPC to the server and read its /metrics and /proc entry."""
