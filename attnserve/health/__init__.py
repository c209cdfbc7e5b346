"""gRPC's health protocol (grpc.health.v1), generated into v1/ from protos/attnserve/health/ by `make protos`."""
