"""gRPC's health protocol (grpc.health.v1), generated from protos/attnserve/health/ by `make protos`."""
