"""`attnserve export`: checkpoint -> model directory, written only if the parity gate passes.

The directory is built in a staging folder beside --out and moved into place at the end, so a
failed export (bad checkpoint, parity failure, crash) leaves nothing usable behind.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..flags import check_directory
from ..model.checkpoint import LanguageModel, build_model, checked_config, load_state
from ..runtime import contract
from ..runtime.ort_decoder import OrtDecoder, OrtSeq2Seq
from ..runtime.ort_session import cuda_available
from ..tokenizer import Tokenizer, TokenizerError, from_state, manifest_entry
from ..tokenizer.bpe import BpeTokenizer
from ..tokenizer.chat_template import ChatTemplate, ChatTemplateError
from ..tokenizer.sentencepiece import SentencePieceTokenizer
from .genai import genai_config
from .graphs import EXPORTS, export_graph
from .invariance import invariance_failure, invariance_line, invariance_report
from .parity import ParityError, failure_message, format_report, run_decoder_gate
from .parity_arena import run_arena_gate
from .parity_beams import beam_report
from .parity_seq2seq import run_seq2seq_arena_gate, run_seq2seq_gate
from .quantize import INT4_DEFAULTS, Int4Options, quantize, quantized_gate

TOKENIZER_FILE = "tokenizer.json"  # Hugging Face tokenizers' format (BPE models)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # its companion, read by onnxruntime-genai and transformers
DEFAULT_PARITY_STEPS = 64  # greedy decode steps the gate compares
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ExportError(Exception):
    """A one-line reason the export cannot go on (bad input, unwritable output)."""


def say(message: str) -> None:
    print(f"[export] {message}", file=sys.stderr, flush=True)


def check_replaceable(out: Path) -> None:
    """Only an empty folder or an earlier model directory may be replaced: never a user's other files."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / contract.MANIFEST_FILE).is_file():
        raise ExportError(
            f"--out {out} is a non-empty directory without {contract.MANIFEST_FILE}; refusing to replace it"
        )


def staging_dir(out: Path) -> Path:
    """A fresh folder beside `out`; raises ExportError if the parent cannot be written."""
    try:
        check_directory("--out", out)
    except ValueError as e:
        raise ExportError(str(e)) from None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    except OSError as e:
        raise ExportError(f"cannot write --out {out}: {e.strerror or e}") from None
    return staging


def write_tokenizer(staging: Path, tokenizer: Tokenizer, context_length: int, chat_template: str | None = None) -> dict:
    """The manifest's tokenizer entry; a BPE's tokenizer.json and tokenizer_config.json (with the chat
    template, if given), or a translation model's SentencePiece files, are written beside."""
    entry = manifest_entry(tokenizer)
    if isinstance(tokenizer, SentencePieceTokenizer):
        entry["files"] = tokenizer.write(staging)
    if isinstance(tokenizer, BpeTokenizer):
        (staging / TOKENIZER_FILE).write_text(tokenizer.json, encoding="utf-8")
        config = tokenizer.tokenizer_config(context_length)
        if chat_template is not None:
            config["chat_template"] = chat_template
        (staging / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        entry.update(file=TOKENIZER_FILE, sha256=contract.sha256_file(staging / TOKENIZER_FILE))
    return entry


def publish(staging: Path, manifest: contract.Manifest, tokenizer: Tokenizer) -> contract.Manifest:
    """genai_config.json (decoder-only), then the manifest with the sha256 of every file: written once, last."""
    names = [graph.file for graph in manifest.graphs.values()]
    if tokenizer.kind == "bpe":
        names += [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]
    names += manifest.tokenizer.get("files", [])  # a translation model's SentencePiece files
    if not manifest.seq2seq:
        (staging / contract.GENAI_CONFIG_FILE).write_text(json.dumps(genai_config(manifest), indent=2) + "\n")
        names.append(contract.GENAI_CONFIG_FILE)
    manifest = contract.with_files(staging, manifest, names)
    contract.write_manifest(staging, manifest)
    return manifest


def check_chat_template(text: str, tokenizer: Tokenizer) -> None:
    """ExportError unless the chat template compiles and the tokenizer keeps a tokenizer_config.json."""
    if not isinstance(tokenizer, BpeTokenizer):
        raise ExportError(
            "--chat-template: a chat template lives in a BPE model's tokenizer_config.json; this checkpoint "
            f"has the {tokenizer.kind} tokenizer"
        )
    try:
        ChatTemplate(text)
    except ChatTemplateError as e:
        raise ExportError(f"--chat-template: {e}") from None


def export_graphs(model, staging: Path, dtype: str, kv_cache: str) -> None:
    """Every graph of the model's architecture, in `dtype`, with the decoder's KV cache layout: one
    loop over graphs.EXPORTS' row for them, each graph's file and names the contract's."""
    cfg, n = model.config, model.config.n_layers
    torch_dtype = TORCH_DTYPES[dtype]
    model = copy.deepcopy(model).to(torch_dtype) if dtype != "float32" else model
    specs = contract.graph_specs(cfg.arch, n, kv_cache)
    for role, graph in EXPORTS[(cfg.arch, kv_cache)].items():
        spec = specs[role]
        export_graph(
            graph.module(model),
            graph.sample_inputs(cfg, torch_dtype),
            staging / spec.file,
            list(spec.inputs),
            list(spec.outputs),
            graph.dynamic_shapes(n),
            graph.axes(n),
        )


def gate_provider(dtype: str, kv_cache: str) -> str:
    """Where the gate runs the graphs: on CUDA where they may run there and this onnxruntime has it
    (a CUDA export is proven on the device that serves it), otherwise on the CPU."""
    suits = contract.providers_for(dtype, kv_cache)
    if contract.CUDA_PROVIDER in suits and cuda_available():
        return contract.CUDA_PROVIDER
    if contract.CPU_PROVIDER not in suits:
        raise ExportError(
            f"--dtype {dtype} runs only on ONNX Runtime's CUDA provider, which this onnxruntime lacks, so its "
            "parity gate cannot run here (install onnxruntime-gpu on a CUDA host; float16 runs on both)"
        )
    return contract.CPU_PROVIDER


def run_gate(model, staging: Path, manifest: contract.Manifest, steps: int) -> dict:
    """The gate of the manifest's architecture and KV cache layout, over the graphs in `staging`."""
    arena = manifest.kv_cache == contract.KV_ARENA
    provider = gate_provider(manifest.dtype, manifest.kv_cache)
    runtime: OrtSeq2Seq | OrtDecoder
    if manifest.seq2seq:
        runtime = OrtSeq2Seq(staging, manifest=manifest, provider=provider)
        report = (run_seq2seq_arena_gate if arena else run_seq2seq_gate)(model, runtime, steps)
    else:
        runtime = decoder = OrtDecoder(staging, manifest=manifest, provider=provider)
        report = (run_arena_gate if arena else run_decoder_gate)(model, runtime, steps)
        if arena:  # a request's tokens alone, in any batch, in any chunks
            report["invariance"] = invariance_report(decoder, steps)
            report["passed"] = report["passed"] and report["invariance"]["passed"]
    if arena:  # the server's beam groups: served beams against the PyTorch model's
        start = manifest.bos_id if manifest.seq2seq else None
        report["beams"] = beam_report(model, runtime, manifest.dtype, manifest.eos_id, start)
        report["passed"] = report["passed"] and report["beams"]["ok"]
    return {**report, "provider": runtime.provider}


def load_model(checkpoint: Path) -> tuple[LanguageModel, Tokenizer, dict]:
    """The checkpoint's model (eval mode), its tokenizer, and where it came from."""
    state = load_state(checkpoint)
    model = build_model(checked_config(state, checkpoint))
    model.load_state_dict(state["model"])
    try:
        tokenizer = from_state(state.get("tokenizer"))
    except TokenizerError as e:
        raise ExportError(f"{checkpoint}: {e}") from None
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ExportError(
            f"{checkpoint}: the tokenizer has {tokenizer.vocab_size} ids, the model {model.config.vocab_size}"
        )
    return model.eval(), tokenizer, {"path": str(checkpoint), "sha256": contract.sha256_file(checkpoint)}


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    dtype: str = contract.DTYPES[0],
    quantize: str | None = None,
    parity_steps: int = DEFAULT_PARITY_STEPS,
    heldout: bytes | None = None,
    kv_cache: str | None = None,
    chat_template: str | None = None,
    int4: Int4Options = INT4_DEFAULTS,
) -> contract.Manifest:
    """Export, gate and publish; returns the manifest. Raises ExportError, CheckpointError or ParityError.
    `chat_template`: a Jinja chat template for tokenizer_config.json (BPE tokenizers only); `int4`: the
    blocks of `quantize="int4"`."""
    checkpoint, out = Path(checkpoint), Path(out)
    if parity_steps < 1:
        raise ExportError(f"--parity-steps must be at least 1, got {parity_steps}")
    if quantize and dtype != "float32":
        raise ExportError(f"--quantize {quantize} starts from float32 weights; drop --dtype {dtype}")
    kv_cache = kv_cache or contract.KV_ARENA
    if dtype == "bfloat16" and kv_cache != contract.KV_ARENA:
        raise ExportError("--dtype bfloat16 is for the arena KV cache (CUDA); drop --kv-cache concat")
    gate_provider(dtype, kv_cache)  # refuses before the work if the gate cannot run here
    model, tokenizer, source = load_model(checkpoint)
    if chat_template is not None:
        check_chat_template(chat_template, tokenizer)
    if quantize and model.config.arch != contract.DECODER_ONLY:
        raise ExportError(f"--quantize {quantize} is for decoder-only models")
    if kv_cache == contract.KV_ARENA and model.config.d_k % 8:
        raise ExportError(
            f"head dim {model.config.d_k} (d_model / n_heads) is not a multiple of 8, which "
            "ONNX Runtime's GroupQueryAttention requires; use --kv-cache concat"
        )
    check_replaceable(out)
    staging = staging_dir(out)
    try:
        manifest = build_in(
            staging, model, tokenizer, source, dtype, quantize, parity_steps, heldout, kv_cache, chat_template, int4
        )
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_in(
    staging: Path,
    model,
    tokenizer: Tokenizer,
    source: dict,
    dtype: str,
    quantize: str | None,
    steps: int,
    heldout: bytes | None,
    kv_cache: str,
    chat_template: str | None = None,
    int4: Int4Options = INT4_DEFAULTS,
) -> contract.Manifest:
    """Export into `staging`, run the gate, and write the manifest (once, when the gate has passed)."""
    t0 = time.perf_counter()
    say(
        f"exporting {model.config.arch} ({model.num_parameters():,} parameters) to ONNX, "
        f"opset {contract.OPSET}, {dtype}, {kv_cache} KV cache ..."
    )
    export_graphs(model, staging, dtype, kv_cache)
    say(
        f"exported in {time.perf_counter() - t0:.1f} s; running the parity gate ({steps} greedy steps) "
        f"on the {gate_provider(dtype, kv_cache).upper()} provider ..."
    )
    entry = write_tokenizer(staging, tokenizer, model.config.max_len, chat_template)
    manifest = contract.build_manifest(model.config.to_dict(), entry, dtype, kv_cache, source)
    report = run_gate(model, staging, manifest, steps)
    print(format_report(report), flush=True)
    if quantize:
        report = gate_quantized(quantize, int4, staging, model, tokenizer, manifest, report, steps, heldout)
    if not report["passed"]:
        raise ParityError(quantized_failure(quantize, report) if quantize else failure_message(report), report)
    manifest = publish(staging, replace(manifest, quantization=quantize, parity=report), tokenizer)
    say(f"parity gate passed in {time.perf_counter() - t0:.1f} s total")
    return manifest


def gate_quantized(
    kind: str,
    int4: Int4Options,
    staging: Path,
    model,
    tokenizer: Tokenizer,
    manifest: contract.Manifest,
    report: dict,
    steps: int,
    heldout: bytes | None,
) -> dict:
    """Quantize the float32 graph that passed to `kind`, gate it on held-out loss, and put it in place."""
    if not report["passed"]:
        return report
    how = "activations quantized per row" if kind == "int8" else f"weight-only, blocks of {int4.block_size}"
    if kind == "int4" and int4.head_block_size != int4.block_size:
        how += f", the head's of {int4.head_block_size}"
    say(f"quantizing to {kind} ({how}) and measuring held-out loss ...")
    quantized = staging / kind
    quantized.mkdir()
    quantize(kind, staging / contract.MODEL_FILE, quantized / contract.MODEL_FILE, int4)
    prompts = [list(range(97, 97 + n)) for n in (1, 13, 5)]
    text = (heldout or default_heldout()).decode("utf-8", errors="replace")
    quantized_runtime = OrtDecoder(quantized, manifest=replace(manifest, quantization=kind))
    result = quantized_gate(
        kind,
        OrtDecoder(staging, manifest=manifest),
        quantized_runtime,
        tokenizer.encode(text),
        tokenizer.bos_id if tokenizer.add_bos else None,
        tokenizer.byte_lengths(),
        prompts,
        min(steps, model.config.max_len - 13),
        block=min(128, model.config.max_len - 1),
    )
    if kind == "int4":
        result = {**result, "block_size": int4.block_size, "head_block_size": int4.head_block_size}
        result["accuracy_level"] = int4.accuracy_level
    if manifest.kv_cache == contract.KV_ARENA:
        invariance = invariance_report(quantized_runtime, steps)
        result = {**result, "invariance": invariance, "passed": result["passed"] and invariance["passed"]}
    del quantized_runtime
    os.replace(quantized / contract.MODEL_FILE, staging / contract.MODEL_FILE)
    shutil.rmtree(quantized)
    print(
        f"{kind}: held-out {result[f'heldout_bits_per_byte_{kind}']:.4f} bits/byte vs float32 "
        f"{result['heldout_bits_per_byte_float32']:.4f} (ratio {result['loss_ratio']:.4f}, limit "
        f"{result['max_loss_ratio']}); greedy agreement {result['greedy_token_agreement']:.1%} over "
        f"{result['greedy_steps']} steps",
        flush=True,
    )
    if "invariance" in result:
        print(f"{kind}: {invariance_line(result['invariance'])}", flush=True)
    return {"float32_gate": report, kind: result, "passed": result["passed"]}


def quantized_failure(kind: str, report: dict) -> str:
    if kind not in report:
        return failure_message(report)
    r = report[kind]
    if r["loss_ratio"] <= r["max_loss_ratio"]:
        return f"{kind} gate failed: {invariance_failure(r['invariance'])}"
    return (
        f"{kind} gate failed: held-out loss {r[f'heldout_bits_per_byte_{kind}']:.4f} bits/byte is "
        f"{r['loss_ratio']:.4f}x float32's {r['heldout_bits_per_byte_float32']:.4f} (limit {r['max_loss_ratio']}x)"
    )


def default_heldout() -> bytes:
    """The held-out split of the default training corpus."""
    from ..model.data import default_heldout_bytes

    return default_heldout_bytes()
