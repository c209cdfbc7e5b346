"""Open Inference Protocol tensors and parameters <-> Python values, one element at a time.

A request's input arrives either in its typed `contents` field or as raw little-endian bytes in
`raw_input_contents` (what tritonclient sends); BYTES elements are raw as a 4-byte little-endian
length followed by the bytes. Every input attnserve takes holds one element, so this reads one
scalar per tensor and refuses anything else with InvalidRequest naming the tensor. Outputs go
out raw, as Triton's server sends them. No gRPC, no engine.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

from ...engine.domain import InvalidRequest
from ...inference import grpc_service_pb2 as oip

BYTES, BOOL, UINT32 = "BYTES", "BOOL", "UINT32"
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the served model, as ModelMetadata lists it."""

    name: str
    datatype: str
    shape: tuple[int, ...] = (1,)

    def metadata(self) -> oip.ModelMetadataResponse.TensorMetadata:
        return oip.ModelMetadataResponse.TensorMetadata(name=self.name, datatype=self.datatype, shape=self.shape)


def read_inputs(request: oip.ModelInferRequest, specs: Mapping[str, TensorSpec]) -> dict[str, Any]:
    """Each input's one element, by name: str for BYTES (UTF-8), bool for BOOL."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(
            "raw_input_contents", f"{len(raw)} entries for {len(request.inputs)} inputs: give one per input, in order"
        )
    values: dict[str, Any] = {}
    for i, tensor in enumerate(request.inputs):
        spec = specs.get(tensor.name)
        if spec is None:
            known = ", ".join(specs)
            raise InvalidRequest(f"inputs[{i}]", f"unknown input {tensor.name!r} (this model takes {known})")
        if tensor.name in values:
            raise InvalidRequest(tensor.name, "given twice")
        if tensor.datatype != spec.datatype:
            raise InvalidRequest(tensor.name, f"datatype {tensor.datatype or '(none)'}, expected {spec.datatype}")
        if prod(tensor.shape) != 1 or not tensor.shape:
            raise InvalidRequest(tensor.name, f"shape {list(tensor.shape)}, expected one element ([1])")
        values[tensor.name] = raw_element(tensor.name, spec.datatype, raw[i]) if raw else typed_element(tensor, spec)
    return values


def raw_element(name: str, datatype: str, data: bytes) -> Any:
    """The one element of a raw tensor."""
    if datatype == BOOL:
        if len(data) != 1:
            raise InvalidRequest(name, f"{len(data)} raw bytes for one BOOL (expected 1)")
        return data[0] != 0
    if len(data) < _LENGTH.size or _LENGTH.unpack_from(data)[0] != len(data) - _LENGTH.size:
        raise InvalidRequest(
            name, f"{len(data)} raw bytes are not one BYTES element (a 4-byte little-endian length, then the bytes)"
        )
    return utf8(name, data[_LENGTH.size :])


def typed_element(tensor: oip.ModelInferRequest.InferInputTensor, spec: TensorSpec) -> Any:
    """The one element of a tensor sent in its typed contents field."""
    contents = tensor.contents
    elements: Any = contents.bytes_contents if spec.datatype == BYTES else contents.bool_contents
    if len(elements) != 1:
        field = "bytes_contents" if spec.datatype == BYTES else "bool_contents"
        raise InvalidRequest(tensor.name, f"{len(elements)} elements in contents.{field}, expected 1")
    return utf8(tensor.name, elements[0]) if spec.datatype == BYTES else bool(elements[0])


def utf8(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(name, f"not UTF-8 text (byte {e.start})") from None


def parameter_value(parameter: oip.InferParameter) -> Any:
    """The Python value of one InferParameter (None when it holds none)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def raw_output(name: str, datatype: str, value: str | int) -> tuple[oip.ModelInferResponse.InferOutputTensor, bytes]:
    """One output of one element: its tensor and its raw bytes (BYTES: UTF-8 text, UINT32: an int)."""
    tensor = oip.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=[1])
    if datatype == UINT32:
        return tensor, _LENGTH.pack(value)
    data = str(value).encode("utf-8")
    return tensor, _LENGTH.pack(len(data)) + data
