"""The Open Inference Protocol (package inference), generated from protos/attnserve/inference/ by `make protos`."""
