"""attnserve's gRPC services as Ray's proxy takes them, and their messages made picklable.

Ray's proxy builds its services by calling the add_*_to_server functions named in its gRPC
options, importing them by name in its own process, and pickles each request to hand it to a
replica. Our generated message classes carry the name of their .proto file's module
(`attnserve.v1.generation_pb2`), not of the module they live in
(`attnserve.protos.attnserve.v1.generation_pb2`), so pickle cannot find them by name: importing
this module registers, with copyreg, a reducer that sends a message as its full name and wire
bytes instead. The proxy imports it through the functions below; replicas through deployment.py.
"""

from __future__ import annotations

import copyreg
from typing import Any

from google.protobuf.message import Message

from ..protos.attnserve.v1 import generation_pb2, generation_pb2_grpc
from ..protos.health.v1 import health_pb2, health_pb2_grpc

# The servicer functions, by the names main.py gives Ray's gRPC options.
add_TextGenerationServicer_to_server = generation_pb2_grpc.add_TextGenerationServicer_to_server
add_HealthServicer_to_server = health_pb2_grpc.add_HealthServicer_to_server

MESSAGES: dict[str, type[Message]] = {
    descriptor.full_name: getattr(module, name)
    for module in (generation_pb2, health_pb2)
    for name, descriptor in module.DESCRIPTOR.message_types_by_name.items()
}


def rebuild(full_name: str, data: bytes) -> Message:
    """A message from its full name (attnserve.v1.GenerateRequest) and wire bytes."""
    return MESSAGES[full_name].FromString(data)


def reduce(message: Message) -> tuple[Any, tuple[str, bytes]]:
    return rebuild, (message.DESCRIPTOR.full_name, message.SerializeToString())


for message_class in MESSAGES.values():
    copyreg.pickle(message_class, reduce)
