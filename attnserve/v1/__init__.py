"""attnserve.v1, generated from protos/attnserve/v1/generation.proto by `make protos` (never edited).
Imports only protobuf and grpcio."""
