"""A Hugging Face checkpoint directory's files read as untrusted input, before anything is built from them:
JSON bounded in size and depth, config.json's fields typed, safetensors headers parsed here (names, shapes,
dtypes; no tensor loaded), every weight file kept inside the directory, the weights' layer count and
shapes compared with those the config implies, and every tensor loaded checked finite. Each refusal is
one HFImportError line naming the file and the field. Knows no architecture: each family's Layout is
decoders.py's or marian.py's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..checkpoint import layers_held

CONFIG_FILE = "config.json"
SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
MAX_JSON_BYTES = 64 << 20  # any JSON file read: config.json is kilobytes, a big tokenizer_config.json megabytes
MAX_HEADER_BYTES = 100 << 20  # a safetensors header (the safetensors library's own bound)
MAX_SIZE = 2**31 - 1  # any size config.json gives (ONNX Runtime's int32 positions)
# Bytes per element of each safetensors dtype; the weights attnserve imports are of FLOATS
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2}
DTYPE_BYTES.update({"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8})
FLOATS = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


class HFImportError(Exception):
    """A checkpoint directory attnserve cannot import, in one line naming the file or the field."""


def short(value: Any) -> str:
    """A value for a one-line message: its repr, cut."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


def read_json(path: Path, required: bool = True) -> dict:
    """A JSON object file; {} where absent and not required."""
    if not path.is_file():
        if required:
            raise HFImportError(f"{path}: not found")
        return {}
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise HFImportError(f"{path}: over {MAX_JSON_BYTES >> 20} MiB")
        found = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise HFImportError(f"{path}: not readable JSON (nested too deep)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise HFImportError(f"{path}: not readable JSON ({one_line(e)})") from None
    if not isinstance(found, dict):
        raise HFImportError(f"{path}: not a JSON object")
    return found


# config.json's fields, each of one type; `where` is the file (and the object) they are read from


def present(c: dict, where: Any, name: str, default: Any) -> bool:
    """Whether `name` is given (null counts as absent); refused where it is absent and has no default."""
    if c.get(name) is not None:
        return True
    if default is None:
        raise HFImportError(f"{where}: {name}: missing")
    return False


def integer(c: dict, where: Any, name: str, default: int | None = None) -> int:
    """A size: an integer from 1 to MAX_SIZE."""
    if not present(c, where, name, default):
        return default  # type: ignore[return-value]
    value = c[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise HFImportError(f"{where}: {name} {short(value)}: not an integer from 1 to {MAX_SIZE}")
    return value


def number(c: dict, where: Any, name: str, default: float | None = None) -> float:
    if not present(c, where, name, default):
        return default  # type: ignore[return-value]
    value = c[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HFImportError(f"{where}: {name} {short(value)}: not a finite number")
    return float(value)


def text(c: dict, where: Any, name: str, default: str | None = None) -> str:
    if not present(c, where, name, default):
        return default  # type: ignore[return-value]
    if not isinstance(c[name], str):
        raise HFImportError(f"{where}: {name} {short(c[name])}: not a string")
    return c[name]


def flag(c: dict, where: Any, name: str, default: bool) -> bool:
    value = default if c.get(name) is None else c[name]
    if not isinstance(value, bool):
        raise HFImportError(f"{where}: {name} {short(value)}: not true or false")
    return value


def table(c: dict, where: Any, name: str) -> dict:
    """A JSON object field; {} where absent or null."""
    value = c.get(name)
    if value is not None and not isinstance(value, dict):
        raise HFImportError(f"{where}: {name} {short(value)}: not a JSON object")
    return value or {}


# The weights' files and headers


class Tensor(NamedTuple):
    """A tensor as a header declares it: where, what, how big."""

    file: Path
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: "F32", "BF16", ...


def safetensors_header(path: Path) -> dict[str, Tensor]:
    """The tensors a safetensors file declares, each checked against the file's size; nothing loaded."""
    try:
        with path.open("rb") as f:
            prefix = f.read(8)
            size = path.stat().st_size
            if len(prefix) < 8:
                raise HFImportError(f"{path}: shorter than a safetensors header ({size} bytes)")
            length = int.from_bytes(prefix, "little")
            if length > size - 8 or length > MAX_HEADER_BYTES:
                raise HFImportError(
                    f"{path}: safetensors header length {length} runs past the end of the file ({size} bytes)"
                )
            raw = f.read(length)
    except OSError as e:
        raise HFImportError(f"{path}: not readable ({e.strerror})") from None
    try:
        header = json.loads(raw)
    except RecursionError:
        raise HFImportError(f"{path}: safetensors header: not JSON (nested too deep)") from None
    except ValueError as e:  # bad UTF-8 or bad JSON
        raise HFImportError(f"{path}: safetensors header: not JSON ({one_line(e)})") from None
    if not isinstance(header, dict):
        raise HFImportError(f"{path}: safetensors header: not a JSON object")
    data = size - 8 - length
    return {name: declared(path, name, entry, data) for name, entry in header.items() if name != "__metadata__"}


def declared(path: Path, name: str, entry: Any, data: int) -> Tensor:
    """One header entry: a known dtype, a shape of sizes, and offsets inside the data that hold it exactly."""
    where = f"{path}: safetensors header: {name}"
    entry = entry if isinstance(entry, dict) else {}
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise HFImportError(f"{where} dtype {short(dtype)}: not a safetensors dtype")
    sizes = lambda v: isinstance(v, list) and all(type(i) is int and i >= 0 for i in v)
    if not sizes(shape):
        raise HFImportError(f"{where} shape {short(shape)}: not a list of sizes")
    if not sizes(offsets) or len(offsets) != 2 or not offsets[0] <= offsets[1] <= data:
        raise HFImportError(f"{where} data_offsets {short(offsets)}: not within the file's {data} bytes of data")
    needs = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != needs:
        raise HFImportError(
            f"{where} data_offsets {offsets}: {offsets[1] - offsets[0]} bytes, shape {shape} of {dtype} needs {needs}"
        )
    return Tensor(path, name, tuple(shape), dtype)


def outside(hf_dir: Path, name: str) -> str | None:
    """Why hf_dir/name is not a file of the directory (absolute, `..`, or a link out of it); None if it is.
    A Hugging Face cache's snapshot (hub/models--x/snapshots/REV) links into the repository's blobs/."""
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return f"outside {hf_dir}"
    root = hf_dir.resolve()
    homes = [root, root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [root]
    try:
        target = (hf_dir / name).resolve()
    except (OSError, RuntimeError):  # a loop of links
        return "a loop of links"
    if not any(target.is_relative_to(home) for home in homes):
        return f"which resolves outside {hf_dir}"
    return None


def weight_files(hf_dir: Path) -> list[Path]:
    """The weights' files: the shards the index names, else model.safetensors, else pytorch_model.bin."""
    index_path = hf_dir / SAFETENSORS_INDEX
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HFImportError(f"{index_path}: weight_map {short(weight_map)}: not a JSON object of tensor -> file")
        for tensor, name in weight_map.items():
            if not isinstance(name, str) or not name or "\0" in name:
                raise HFImportError(f"{index_path}: weight_map {tensor} {short(name)}: not a file name")
            why = outside(hf_dir, name)
            if why:
                raise HFImportError(f"{index_path}: weight_map names {name!r}, {why}")
        return [hf_dir / name for name in sorted(set(weight_map.values()))]
    for name in (SAFETENSORS, TORCH_BIN):
        if (hf_dir / name).is_file():
            why = outside(hf_dir, name)
            if why:
                raise HFImportError(f"{hf_dir / name}: a link {why}")
            return [hf_dir / name]
    raise HFImportError(f"{hf_dir}: no weights ({SAFETENSORS}, its shards, or {TORCH_BIN})")


def load_bin(path: Path) -> dict[str, torch.Tensor]:
    """pytorch_model.bin through torch.load(weights_only=True), mapped rather than read where it can be."""
    try:
        try:
            found = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (not zip) format cannot be mapped
            found = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises several types for a corrupt file)
        raise HFImportError(f"{path}: not readable ({type(e).__name__})") from None
    if not isinstance(found, dict) or not all(isinstance(t, torch.Tensor) for t in found.values()):
        raise HFImportError(f"{path}: not a state dict of tensors")
    return found


def read_headers(hf_dir: Path) -> dict[str, Tensor]:
    """Every tensor the weights' files declare, by its Hugging Face name; no safetensors tensor loaded."""
    files = weight_files(hf_dir)
    if files[0].name == TORCH_BIN:
        dtypes = {torch_dtype: name for name, torch_dtype in FLOATS.items()}
        return {
            name: Tensor(files[0], name, tuple(t.shape), dtypes.get(t.dtype, str(t.dtype)))
            for name, t in load_bin(files[0]).items()
        }
    found: dict[str, Tensor] = {}
    for path in files:
        if not path.is_file():
            raise HFImportError(f"{hf_dir / SAFETENSORS_INDEX}: weight_map names {path.name!r}: not found")
        for name, tensor in safetensors_header(path).items():
            if name in found:
                raise HFImportError(f"{path}: {name} is in {found[name].file.name} too")
            found[name] = tensor
    return found


def read_weights(headers: dict[str, Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of the headers' files, each checked finite."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in dict.fromkeys(t.file for t in headers.values()):
        try:
            tensors = load_bin(path) if path.name == TORCH_BIN else load_file(str(path))
        except HFImportError:
            raise
        except Exception as e:  # noqa: BLE001 (safetensors' own refusal of a file its header passed)
            raise HFImportError(f"{path}: not readable ({one_line(e)})") from None
        for name, t in tensors.items():
            if t.is_floating_point():
                bad = t.numel() - int(torch.isfinite(t).sum())
                if bad:
                    raise HFImportError(f"{path}: {name}: {bad} of {t.numel()} values are NaN or infinite")
        weights.update(tensors)
    return weights


# The tensors a config implies


class Dim(NamedTuple):
    """One size of a tensor, and the config.json field (with its value) that sets it."""

    size: int
    field: str
    value: int | None = None  # the field's value where the size is derived from it (3 x n_embd); else size


Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class Layout:
    """The tensors a family's config implies, by name (after `prefix`)."""

    stacks: dict[str, tuple[int, str, dict[str, Shape]]]  # "h" -> (layers, their config field, a layer's tensors)
    tensors: dict[str, Shape]  # outside the stacks, each required
    optional: dict[str, Shape] = field(default_factory=dict)  # checked where present
    prefix: str = ""  # dropped from the weights' names first (GPT-2's "transformer.")


def check_layout(headers: dict[str, Tensor], layout: Layout, config_path: Path) -> None:
    """The weights against the config: each stack's layer count first (a config of a million layers is
    refused before a million are listed), then every tensor's presence, dtype and shape."""
    named = {name.removeprefix(layout.prefix): t for name, t in headers.items()}
    for stack, (count, field_name, _) in layout.stacks.items():
        held = layers_held(named, stack)
        if held != count:
            raise HFImportError(f"{config_path}: {field_name} {count}: the weights hold {held} layers")
    required = dict(layout.tensors)
    for stack, (count, _, layer) in layout.stacks.items():
        required.update({f"{stack}.{i}.{name}": shape for i in range(count) for name, shape in layer.items()})
    for name, shape in required.items():
        if name not in named:
            raise HFImportError(f"{config_path.parent}: the weights lack {name}")
        check_tensor(named[name], shape, config_path)
    for name, shape in layout.optional.items():
        if name in named:
            check_tensor(named[name], shape, config_path)


def check_tensor(t: Tensor, shape: Shape, config_path: Path) -> None:
    if t.dtype not in FLOATS:
        raise HFImportError(f"{t.file}: {t.name} dtype {t.dtype}: not a floating-point tensor")
    wanted = [d.size for d in shape]
    if list(t.shape) != wanted:
        parted = [d for d, size in zip(shape, t.shape) if d.size != size] or list(shape[:1])
        d = parted[0]
        raise HFImportError(
            f"{t.file}: {t.name} has shape {list(t.shape)}, {config_path.name}'s {d.field} "
            f"{d.size if d.value is None else d.value} gives {wanted}"
        )
