"""The export contract: architectures, file names, graph I/O names, dynamic axes and the manifest.

Torch-free: export writes the model directory through this module and the server reads it
through this module, so neither hard-codes a name. The I/O names follow onnxruntime-genai
and Hugging Face Optimum (past_key_values.{i}.key -> present.{i}.key). Knows nothing of ONNX
Runtime (runtime/ort_session.py opens the graphs) or of onnxruntime-genai (export/genai.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

EXPORTER = "torch.onnx.export(dynamo=True)"  # the one exporter we use, stated once
OPSET = 18
FORMAT_VERSION = 2  # version 2 names its kv_cache always; version 1 (still read) left concat out
READABLE_VERSIONS = (1, FORMAT_VERSION)

DECODER_ONLY, ENCODER_DECODER = "decoder", "encoder-decoder"  # the manifest's "architecture"
ARCHITECTURES = (DECODER_ONLY, ENCODER_DECODER)
ENCODER, DECODER = "encoder", "decoder"  # the roles of the graphs (the manifest's "graphs" keys)

MODEL_FILE = "model.onnx"  # decoder-only graph
ENCODER_FILE = "encoder.onnx"  # encoder-decoder: source -> cross-attention keys/values
DECODER_FILE = "decoder.onnx"  # encoder-decoder: one decoder step
MANIFEST_FILE = "attnserve.json"
GENAI_CONFIG_FILE = "genai_config.json"

# Axis names of the dynamic dimensions.
BATCH, SEQ, PAST, TOTAL, SRC = "batch", "sequence", "past_sequence", "total_sequence", "source_sequence"
CACHE = "max_sequence"  # the arena's buffer length: past and present are one buffer of this length

# KV cache layouts of a decoder graph (the manifest's "kv_cache"):
KV_ARENA = "arena"  # GroupQueryAttention, past and present one in-place buffer, right padding
KV_CONCAT = "concat"  # present = concat(past, new), left padding (directories older than the arena)
KV_LAYOUTS = (KV_ARENA, KV_CONCAT)
DTYPES = ("float32", "float16", "bfloat16")  # of the KV cache and logits
QUANTIZATIONS = ("int8", "int4")  # the manifest's "quantization" of the weights, when not None
CPU_PROVIDER, CUDA_PROVIDER = "cpu", "cuda"  # the manifest's "providers" (--provider's names)


def providers_for(dtype: str, kv_cache: str) -> tuple[str, ...]:
    """The ONNX Runtime providers that run a graph of this dtype and KV layout, best first.

    CUDA's GroupQueryAttention is registered for float16 and bfloat16 only: a float32 arena node
    would fall back to the CPU with copies at its boundary, reading a stale host copy of the cache.
    The CPU has no bfloat16 kernels for it (nor for MatMul); float16 runs on both."""
    if dtype == "bfloat16":
        return (CUDA_PROVIDER,)
    if dtype == "float32" and kv_cache == KV_ARENA:
        return (CPU_PROVIDER,)
    return (CUDA_PROVIDER, CPU_PROVIDER)


class ModelDirError(Exception):
    """The model directory is missing, incomplete, corrupt or tampered with."""


# Graph I/O names (onnxruntime-genai's and Optimum's), in the order the graphs take them.
INPUT_IDS, ATTENTION_MASK, POSITION_IDS = "input_ids", "attention_mask", "position_ids"
ENCODER_ATTENTION_MASK = "encoder_attention_mask"  # encoder-decoder: the source's mask, seen by the decoder
LOGITS = "logits"
NEXT_TOKEN = "next_token"  # arena decoder graphs: argmax of logits (B, T) int64, first index on ties
PAST_NAME = "past_key_values.{i}{seg}.{kv}"  # seg "", ".decoder" or ".encoder"; kv "key" or "value"
PRESENT_NAME = "present.{i}{seg}.{kv}"


def past_names(n_layers: int, part: str = "") -> list[str]:
    """past_key_values.{i}.key / .value (part "decoder"/"encoder" adds a segment: Optimum's seq2seq names)."""
    seg = f".{part}" if part else ""
    return [PAST_NAME.format(i=i, seg=seg, kv=kv) for i in range(n_layers) for kv in ("key", "value")]


def present_names(n_layers: int, part: str = "") -> list[str]:
    seg = f".{part}" if part else ""
    return [PRESENT_NAME.format(i=i, seg=seg, kv=kv) for i in range(n_layers) for kv in ("key", "value")]


def decoder_inputs(n_layers: int) -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(n_layers)]


def decoder_outputs(n_layers: int) -> list[str]:
    return [LOGITS, *present_names(n_layers)]


def seq2seq_encoder_inputs() -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK]


def seq2seq_encoder_outputs(n_layers: int) -> list[str]:
    return present_names(n_layers, "encoder")


def seq2seq_decoder_inputs(n_layers: int) -> list[str]:
    return [
        INPUT_IDS,
        ATTENTION_MASK,
        POSITION_IDS,
        ENCODER_ATTENTION_MASK,
        *past_names(n_layers, "decoder"),
        *past_names(n_layers, "encoder"),
    ]


def seq2seq_decoder_outputs(n_layers: int) -> list[str]:
    return [LOGITS, *present_names(n_layers, "decoder")]


def decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """Axis index -> name for every input and output of the decoder-only graph."""
    axes = {
        INPUT_IDS: {0: BATCH, 1: SEQ},
        ATTENTION_MASK: {0: BATCH, 1: TOTAL},
        POSITION_IDS: {0: BATCH, 1: SEQ},
        LOGITS: {0: BATCH, 1: SEQ},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layers)})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layers)})
    return axes


def arena_decoder_outputs(n_layers: int) -> list[str]:
    """The decoder-only arena graph's outputs: the decoder's, then each position's greedy token, so
    that a step whose rows are all greedy brings back token ids instead of logits."""
    return [*decoder_outputs(n_layers), NEXT_TOKEN]


def arena_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """The arena graph's axes: past and present share one buffer length."""
    axes = decoder_dynamic_axes(n_layers)
    axes[NEXT_TOKEN] = {0: BATCH, 1: SEQ}
    axes.update({name: {0: BATCH, 2: CACHE} for name in [*past_names(n_layers), *present_names(n_layers)]})
    return axes


def arena_seq2seq_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """The encoder-decoder arena graph's axes: self-attention past and present share one buffer length."""
    axes = seq2seq_decoder_dynamic_axes(n_layers)
    axes[NEXT_TOKEN] = {0: BATCH, 1: SEQ}
    axes.update(
        {name: {0: BATCH, 2: CACHE} for name in [*past_names(n_layers, "decoder"), *present_names(n_layers, "decoder")]}
    )
    return axes


def seq2seq_encoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    axes = {INPUT_IDS: {0: BATCH, 1: SRC}, ATTENTION_MASK: {0: BATCH, 1: SRC}}
    axes.update({name: {0: BATCH, 2: SRC} for name in seq2seq_encoder_outputs(n_layers)})
    return axes


def seq2seq_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    axes = {
        INPUT_IDS: {0: BATCH, 1: SEQ},
        ATTENTION_MASK: {0: BATCH, 1: TOTAL},
        POSITION_IDS: {0: BATCH, 1: SEQ},
        ENCODER_ATTENTION_MASK: {0: BATCH, 1: SRC},
        LOGITS: {0: BATCH, 1: SEQ},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layers, "decoder")})
    axes.update({name: {0: BATCH, 2: SRC} for name in past_names(n_layers, "encoder")})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layers, "decoder")})
    return axes


@dataclass(frozen=True)
class GraphSpec:
    """One graph of a model directory: its file and its I/O names, in the graph's order."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def graph_specs(architecture: str, n_layers: int, kv_cache: str = KV_CONCAT) -> dict[str, GraphSpec]:
    """Role -> file and I/O names of an architecture's graphs: what export writes and runtimes check."""
    n = n_layers
    if architecture == DECODER_ONLY:
        outputs = arena_decoder_outputs(n) if kv_cache == KV_ARENA else decoder_outputs(n)
        return {DECODER: GraphSpec(MODEL_FILE, tuple(decoder_inputs(n)), tuple(outputs))}
    outputs = [*seq2seq_decoder_outputs(n), NEXT_TOKEN] if kv_cache == KV_ARENA else seq2seq_decoder_outputs(n)
    return {
        ENCODER: GraphSpec(ENCODER_FILE, tuple(seq2seq_encoder_inputs()), tuple(seq2seq_encoder_outputs(n))),
        DECODER: GraphSpec(DECODER_FILE, tuple(seq2seq_decoder_inputs(n)), tuple(outputs)),
    }


def io_name_problems(
    architecture: str, n_layers: int, graphs: Mapping[str, tuple[Sequence[str], Sequence[str]]]
) -> list[str]:
    """Differences between graphs' I/O names (role -> (inputs, outputs)) and the contract's, as messages.
    A decoder graph may end its outputs with NEXT_TOKEN (arena exports do; earlier ones do not, and no
    encoder-decoder's did before the batched logits pass took its beams)."""
    problems = []
    for role, spec in graph_specs(architecture, n_layers).items():
        got_inputs, got_outputs = graphs.get(role, ((), ()))
        if role == DECODER and list(got_outputs)[-1:] == [NEXT_TOKEN]:
            got_outputs = list(got_outputs)[:-1]
        for kind, got, want in (("inputs", got_inputs, spec.inputs), ("outputs", got_outputs, spec.outputs)):
            if list(got) != list(want):
                problems.append(f"{role} graph {kind} {list(got)} differ from the contract's {list(want)}")
    return problems


@dataclass(frozen=True)
class Manifest:
    """attnserve.json: everything a runtime needs to drive the graphs. Field names are the JSON keys."""

    architecture: str  # DECODER_ONLY or ENCODER_DECODER
    config: dict[str, Any]  # ModelConfig fields as exported: d_model, n_heads, n_layers, max_len, ...
    head_dim: int  # d_model // n_heads
    tokenizer: dict[str, Any]  # the tokenizer package's entry: kind, vocab_size, bos_id, eos_id, pad_id, ...
    dtype: str  # of the KV cache and logits
    quantization: (
        str | None
    )  # None or of QUANTIZATIONS: int8 (activations quantized per row), int4 (weight-only blocks)
    kv_cache: str  # KV_ARENA (in place, right padding) or KV_CONCAT (left padding)
    graphs: dict[str, GraphSpec]  # role (ENCODER, DECODER) -> file and I/O names
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    parity: dict[str, Any] = field(default_factory=dict)  # the parity gate's report
    source_checkpoint: dict[str, Any] = field(default_factory=dict)  # path and sha256
    opset: int = OPSET
    exporter: str = EXPORTER
    providers: tuple[str, ...] = ()  # providers_for(dtype, kv_cache): where these graphs may run

    @property
    def n_layers(self) -> int:
        """Decoder layers (an encoder-decoder's encoder has n_encoder_layers)."""
        return int(self.config["n_layers"])

    @property
    def n_encoder_layers(self) -> int:
        return int(self.config.get("n_encoder_layers", 0))

    @property
    def n_heads(self) -> int:
        return int(self.config["n_heads"])

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads, which the KV cache holds (fewer than n_heads under grouped-query attention)."""
        return int(self.config.get("n_kv_heads") or self.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.config["d_model"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def context_length(self) -> int:
        """Positions 0 .. context_length - 1: the KV cache's length."""
        return int(self.config["max_len"])

    @property
    def bos_id(self) -> int:
        return int(self.tokenizer["bos_id"])

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer["eos_id"])

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer["pad_id"])

    @property
    def seq2seq(self) -> bool:
        return self.architecture == ENCODER_DECODER

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to attnserve.json."""
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        """Raises KeyError, TypeError or ValueError on a malformed object (read_manifest names the file)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if raw.get("format_version") == 1:
            values.setdefault("kv_cache", KV_CONCAT)  # version 1: directories exported before the arena
        elif "kv_cache" not in values:
            raise KeyError("kv_cache")
        values["providers"] = tuple(values.get("providers") or providers_for(values["dtype"], values["kv_cache"]))
        values["graphs"] = {
            role: GraphSpec(g["file"], tuple(g["inputs"]), tuple(g["outputs"])) for role, g in raw["graphs"].items()
        }
        return cls(**values)

    def problems(self) -> list[str]:
        """What makes this manifest unusable: unknown values, missing dims, names off the contract."""
        for kind, value, allowed in (
            ("architecture", self.architecture, ARCHITECTURES),
            ("dtype", self.dtype, DTYPES),
            ("kv_cache", self.kv_cache, KV_LAYOUTS),
        ):
            if value not in allowed:
                return [f"unknown {kind} {value!r} (expected one of {', '.join(allowed)})"]
        for dim in ("n_layers", "n_heads", "d_model", "vocab_size", "context_length", "bos_id", "eos_id", "pad_id"):
            getattr(self, dim)  # KeyError or ValueError if missing or not a number
        recorded = {role: (g.inputs, g.outputs) for role, g in self.graphs.items()}
        return io_name_problems(self.architecture, self.n_layers, recorded)


def build_manifest(
    config: dict[str, Any], tokenizer: dict[str, Any], dtype: str, kv_cache: str, source_checkpoint: dict[str, Any]
) -> Manifest:
    """The manifest of a fresh export, before its gate: no quantization, parity or file hashes yet."""
    return Manifest(
        architecture=config["arch"],
        config=config,
        head_dim=config["d_model"] // config["n_heads"],
        tokenizer=tokenizer,
        dtype=dtype,
        quantization=None,
        kv_cache=kv_cache,
        graphs=graph_specs(config["arch"], config["n_layers"], kv_cache),
        parity={"passed": None},
        source_checkpoint=source_checkpoint,
        providers=providers_for(dtype, kv_cache),
    )


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def with_files(model_dir: str | Path, manifest: Manifest, names: Sequence[str]) -> Manifest:
    """The manifest recording the sha256 of these files of `model_dir`."""
    return replace(manifest, files={name: sha256_file(Path(model_dir) / name) for name in names})


def write_manifest(model_dir: str | Path, manifest: Manifest) -> Path:
    path = Path(model_dir) / MANIFEST_FILE
    path.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(model_dir: str | Path, verify: bool = True) -> Manifest:
    """The manifest of a model directory; with `verify`, every file's sha256 is checked."""
    model_dir = Path(model_dir)
    path = model_dir / MANIFEST_FILE
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory not found: {model_dir}")
    if not path.is_file():
        raise ModelDirError(f"{model_dir} has no {MANIFEST_FILE}: not an exported attnserve model")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path} is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(raw, dict) or raw.get("format_version") not in READABLE_VERSIONS:
        version = raw.get("format_version") if isinstance(raw, dict) else None
        readable = " or ".join(map(str, READABLE_VERSIONS))
        raise ModelDirError(f"{path}: format_version {version!r}, expected {readable}")
    try:
        manifest = Manifest.from_dict(raw)
        problems = manifest.problems()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ModelDirError(f"{path} is malformed ({e.__class__.__name__}: {e})") from None
    if problems:
        raise ModelDirError(f"{path}: {problems[0]} (export contract format_version {FORMAT_VERSION})")
    check_named_files(model_dir, manifest)
    if verify:
        verify_files(model_dir, manifest)
    return manifest


def named_files(manifest: Manifest) -> list[tuple[str, Any]]:
    """(manifest field, file name) of every file the manifest names for a runtime to read: the graphs
    and the tokenizer's files (the checksum list's own names are checked beside them)."""
    named: list[tuple[str, Any]] = [(f"graphs.{role}.file", g.file) for role, g in manifest.graphs.items()]
    if "file" in manifest.tokenizer:
        named.append(("tokenizer.file", manifest.tokenizer["file"]))
    listed = manifest.tokenizer.get("files", [])
    named += [
        (f"tokenizer.files[{i}]", name) for i, name in enumerate(listed if isinstance(listed, list) else [listed])
    ]
    return named


def outside(model_dir: Path, name: Any) -> str | None:
    """Why `name` is not a file of `model_dir` (absolute, climbing with .., a symlink out); None if it is."""
    if not isinstance(name, str) or not name:
        return "which is not a file name"
    if Path(name).is_absolute():
        return "an absolute path: a model directory's files are named relative to it"
    if ".." in Path(name).parts:
        return "which climbs out of the directory with .."
    try:
        inside = (model_dir / name).resolve().is_relative_to(model_dir.resolve())
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL in the name
        return f"which does not resolve ({e})"
    return None if inside else f"which resolves outside {model_dir} (a symlink)"


def check_named_files(model_dir: Path, manifest: Manifest) -> None:
    """Raise ModelDirError (one line, the field and the name) unless every file the manifest names is
    inside `model_dir` and has its sha256 in `files`, which may not be empty."""
    path = model_dir / MANIFEST_FILE
    if not isinstance(manifest.files, dict):
        raise ModelDirError(f"{path}: files is {type(manifest.files).__name__}, not an object of name -> sha256")
    named = named_files(manifest)
    for kind, name in [*named, *(("files", name) for name in manifest.files)]:
        problem = outside(model_dir, name)
        if problem is not None:
            raise ModelDirError(f"{path}: {kind} names {name!r}, {problem}")
    if not manifest.files:
        raise ModelDirError(f"{path}: files is empty: every file the manifest names needs its sha256 there")
    for kind, name in named:
        if name not in manifest.files:
            raise ModelDirError(f"{path}: {kind} names {name!r}, which files does not list (no sha256 to check)")


def verify_files(model_dir: str | Path, manifest: Manifest) -> None:
    """Raise ModelDirError naming the first file that is missing or whose sha256 differs."""
    for name, expected in sorted(manifest.files.items()):
        path = Path(model_dir) / name
        if not path.is_file():
            raise ModelDirError(f"{path} is missing")
        if sha256_file(path) != expected:
            raise ModelDirError(f"{path} does not match the sha256 in {MANIFEST_FILE}: corrupt or tampered")
