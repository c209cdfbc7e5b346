"""Generated gRPC code of the attnserve protocol. Imports only protobuf and grpcio."""
