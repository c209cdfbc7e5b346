"""The export contract: file names, graph I/O names, dynamic axes and the manifest.

Torch-free: export writes the model directory through this module and the server reads it
through this module, so neither hard-codes a name. The I/O names follow onnxruntime-genai
and Hugging Face Optimum (past_key_values.{i}.key -> present.{i}.key).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

EXPORTER = "torch.onnx.export(dynamo=True)"  # the one exporter we use, stated once
OPSET = 18
FORMAT_VERSION = 1

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


class ModelDirError(Exception):
    """The model directory is missing, incomplete, corrupt or tampered with."""


def past_names(n_layers: int, part: str = "") -> list[str]:
    """past_key_values.{i}.key / .value (part "decoder"/"encoder" adds a segment: Optimum's seq2seq names)."""
    seg = f".{part}" if part else ""
    return [f"past_key_values.{i}{seg}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


def present_names(n_layers: int, part: str = "") -> list[str]:
    seg = f".{part}" if part else ""
    return [f"present.{i}{seg}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


def decoder_inputs(n_layers: int) -> list[str]:
    return ["input_ids", "attention_mask", "position_ids", *past_names(n_layers)]


def decoder_outputs(n_layers: int) -> list[str]:
    return ["logits", *present_names(n_layers)]


def decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """Axis index -> name for every input and output of the decoder-only graph."""
    axes = {
        "input_ids": {0: BATCH, 1: SEQ},
        "attention_mask": {0: BATCH, 1: TOTAL},
        "position_ids": {0: BATCH, 1: SEQ},
        "logits": {0: BATCH, 1: SEQ},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layers)})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layers)})
    return axes


def arena_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """The arena graph's axes: past and present share one buffer length."""
    axes = decoder_dynamic_axes(n_layers)
    axes.update({name: {0: BATCH, 2: CACHE} for name in [*past_names(n_layers), *present_names(n_layers)]})
    return axes


def arena_seq2seq_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """The encoder-decoder arena graph's axes: self-attention past and present share one buffer length."""
    axes = seq2seq_decoder_dynamic_axes(n_layers)
    axes.update(
        {name: {0: BATCH, 2: CACHE} for name in [*past_names(n_layers, "decoder"), *present_names(n_layers, "decoder")]}
    )
    return axes


def kv_layout(manifest: dict) -> str:
    """The decoder graph's KV cache layout (directories exported before the arena are concat)."""
    return manifest.get("kv_cache", KV_CONCAT)


def seq2seq_encoder_inputs() -> list[str]:
    return ["input_ids", "attention_mask"]


def seq2seq_encoder_outputs(n_layers: int) -> list[str]:
    return present_names(n_layers, "encoder")


def seq2seq_decoder_inputs(n_layers: int) -> list[str]:
    return [
        "input_ids",
        "attention_mask",
        "position_ids",
        "encoder_attention_mask",
        *past_names(n_layers, "decoder"),
        *past_names(n_layers, "encoder"),
    ]


def seq2seq_decoder_outputs(n_layers: int) -> list[str]:
    return ["logits", *present_names(n_layers, "decoder")]


def seq2seq_encoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    axes = {"input_ids": {0: BATCH, 1: SRC}, "attention_mask": {0: BATCH, 1: SRC}}
    axes.update({name: {0: BATCH, 2: SRC} for name in seq2seq_encoder_outputs(n_layers)})
    return axes


def seq2seq_decoder_dynamic_axes(n_layers: int) -> dict[str, dict[int, str]]:
    axes = {
        "input_ids": {0: BATCH, 1: SEQ},
        "attention_mask": {0: BATCH, 1: TOTAL},
        "position_ids": {0: BATCH, 1: SEQ},
        "encoder_attention_mask": {0: BATCH, 1: SRC},
        "logits": {0: BATCH, 1: SEQ},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layers, "decoder")})
    axes.update({name: {0: BATCH, 2: SRC} for name in past_names(n_layers, "encoder")})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layers, "decoder")})
    return axes


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(model_dir: str | Path, manifest: dict) -> Path:
    path = Path(model_dir) / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(model_dir: str | Path, verify: bool = True) -> dict:
    """The manifest of a model directory; with `verify`, every file's sha256 is checked."""
    model_dir = Path(model_dir)
    path = model_dir / MANIFEST_FILE
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory not found: {model_dir}")
    if not path.is_file():
        raise ModelDirError(f"{model_dir} has no {MANIFEST_FILE}: not an exported attnserve model")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path} is not valid JSON ({e.__class__.__name__})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{path}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    if verify:
        verify_files(model_dir, manifest)
    return manifest


def verify_files(model_dir: str | Path, manifest: dict) -> None:
    """Raise ModelDirError naming the first file that is missing or whose sha256 differs."""
    for name, expected in sorted(manifest.get("files", {}).items()):
        path = Path(model_dir) / name
        if not path.is_file():
            raise ModelDirError(f"{path} is missing")
        if sha256_file(path) != expected:
            raise ModelDirError(f"{path} does not match the sha256 in {MANIFEST_FILE}: corrupt or tampered")


def build_manifest(
    config: dict,
    graphs: dict[str, dict],
    tokenizer: dict,
    dtype: str,
    quantization: str | None,
    files: dict[str, str],
    parity: dict,
    source_checkpoint: dict,
    kv_cache: str = KV_CONCAT,
) -> dict:
    """The manifest written by export: everything a runtime needs to drive the graphs."""
    return {
        "format_version": FORMAT_VERSION,
        "architecture": config["arch"],
        "config": config,  # ModelConfig fields: d_model, n_heads, n_layers, max_len, ...
        "head_dim": config["d_model"] // config["n_heads"],
        "tokenizer": tokenizer,  # kind, vocab_size, bos_id, eos_id, pad_id
        "dtype": dtype,  # of the KV cache and logits
        "quantization": quantization,  # None or "int8" (dynamic, weights only)
        "kv_cache": kv_cache,  # "arena" (in place, right padding) or "concat" (left padding)
        "opset": OPSET,
        "exporter": EXPORTER,
        "graphs": graphs,  # role ("decoder", "encoder") -> {file, inputs, outputs}
        "files": files,  # file name -> sha256
        "parity": parity,
        "source_checkpoint": source_checkpoint,
    }


def genai_config(manifest: dict) -> dict:
    """genai_config.json for onnxruntime-genai (decoder-only), using only fields it knows."""
    cfg, tok = manifest["config"], manifest["tokenizer"]
    inputs = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    outputs = {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    return {
        "model": {
            "bos_token_id": tok["bos_id"],
            "eos_token_id": tok["eos_id"],
            "pad_token_id": tok["pad_id"],
            "context_length": cfg["max_len"],
            "vocab_size": cfg["vocab_size"],
            "type": "decoder",
            "decoder": {
                "filename": manifest["graphs"]["decoder"]["file"],
                "head_size": manifest["head_dim"],
                "hidden_size": cfg["d_model"],
                "num_attention_heads": cfg["n_heads"],
                "num_key_value_heads": cfg["n_heads"],
                "num_hidden_layers": cfg["n_layers"],
                "session_options": {"log_id": "attnserve"},
                "inputs": inputs,
                "outputs": outputs,
            },
        },
        "search": {
            "do_sample": False,
            "max_length": cfg["max_len"],
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": kv_layout(manifest) == KV_ARENA,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
