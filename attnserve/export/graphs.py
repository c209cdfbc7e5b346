"""PyTorch modules with the exact signature of the exported graphs, and the export call itself.

The KV cache is flattened into one tensor per name (past_key_values.{i}.key, ...), in the
order of runtime/contract.py. Knows nothing of parity, manifests or serving.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from torch.export import Dim

from ..model.lm import DecoderLM
from ..model.seq2seq import EncoderDecoder
from ..runtime import contract
from .activations import fuse_gelus
from .fusions import pack_qkv, pack_siblings
from .gqa import InPlaceAttention, RotaryTables
from .norms import fuse_rms_norms


def pairs(flat) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[k0, v0, k1, v1, ...] -> [(k0, v0), (k1, v1), ...]."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def flatten(kv_pairs) -> list[torch.Tensor]:
    return [t for kv in kv_pairs for t in kv]


class DecoderGraph(nn.Module):
    """(input_ids, attention_mask, position_ids, *past) -> (logits, *present) of a DecoderLM."""

    def __init__(self, model: DecoderLM):
        super().__init__()
        self.model = fuse_rms_norms(model)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        logits, present = self.model(input_ids, attention_mask, position_ids, pairs(past))
        return (logits, *flatten(present))


ROTARY_HEAD_MULTIPLE = 16  # GroupQueryAttention turns q and k itself only for head sizes of a multiple of this


class ArenaDecoderGraph(nn.Module):
    """DecoderGraph's signature over an in-place cache: past and present are one buffer
    (B, H, L, D) per name, right padding, per-row lengths from the attention mask's row sums.
    `rotary_in_op` False writes rotary positions as separate nodes even where the op could turn them
    (the baseline of docs/design/decisions/rotary-in-attention.md)."""

    def __init__(self, model: DecoderLM, rotary_in_op: bool = True):
        super().__init__()
        self.model = fuse_gelus(fuse_rms_norms(model))
        self.rotary_in_op = rotary_in_op

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.model.embedding(input_ids, position_ids)  # (B, T, d_model)
        rotary = self.model.rotary
        if rotary is not None and self.rotary_in_op and self.model.config.d_k % ROTARY_HEAD_MULTIPLE == 0:
            tables = RotaryTables.of(rotary, self.model.config.max_len, position_ids, x.dtype)
            attention, rope = InPlaceAttention(attention_mask, tables), None
        else:
            attention, rope = InPlaceAttention(attention_mask), self.model.rope(position_ids)
        logits, present = self.model.run_layers(x, None, pairs(past), rope, cache=attention)
        return (logits, *flatten(present), greedy_tokens(logits))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: ONNX ArgMax over the vocabulary, first index on ties (as torch and numpy pick).
    Half-precision logits are compared as float32 (exactly: every float16 and bfloat16 is one), after
    the cast to the logits output's dtype: ONNX Runtime's CUDA ArgMax has no bfloat16 kernel, and on
    a CPU without float16 arithmetic ONNX Runtime runs a float16 graph in float32, where an ArgMax
    fed by the last MatMul saw its float32 values, not the float16 logits: two ids tied in float16
    (4.953125 each) gave next_token the higher one and the logits' argmax the first (seen on an AMD
    EPYC of family 26, ONNX Runtime 1.32). The explicit Cast keeps the ArgMax on what the logits hold."""
    if logits.dtype not in (torch.float16, torch.bfloat16):
        return logits.argmax(-1)
    rows = logits.reshape(-1, logits.shape[-1])  # (B*T, V): keeps the Cast below from meeting ORT's own
    return rows.float().argmax(-1).reshape(logits.shape[:-1])


class Seq2SeqEncoderGraph(nn.Module):
    """(input_ids, attention_mask) of the source -> cross-attention keys/values of every decoder layer."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return tuple(flatten(self.model.cross_kv(self.model.encode(input_ids, attention_mask))))


class Seq2SeqDecoderGraph(nn.Module):
    """One decoder step: (ids, mask, positions, source mask, *self past, *cross kv) -> (logits, *present)."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, encoder_attention_mask, *caches):
        n = 2 * self.model.config.n_layers
        logits, present = self.model.decode(
            input_ids, attention_mask, position_ids, encoder_attention_mask, pairs(caches[n:]), pairs(caches[:n])
        )
        return (logits, *flatten(present))


class ArenaSeq2SeqDecoderGraph(nn.Module):
    """Seq2SeqDecoderGraph's signature over an in-place self-attention cache (B, H, L, D), right
    padding; the cross-attention keys/values are the arena's per-slot segment (B, H, S, D). Its outputs
    end with each position's greedy token, as the decoder-only arena graph's do."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, encoder_attention_mask, *caches):
        n = 2 * self.model.config.n_layers
        x = self.model.embedding(input_ids, position_ids)  # (B, T, d_model)
        logits, present = self.model.run_layers(
            x,
            None,
            pairs(caches[:n]),
            pairs(caches[n:]),
            encoder_attention_mask,
            cache=InPlaceAttention(attention_mask),
        )
        return (logits, *flatten(present), greedy_tokens(logits))


def seq2seq_sample_inputs(config, dtype: torch.dtype, batch: int = 2, src: int = 5, seq: int = 3, past: int = 4):
    """(encoder inputs, decoder inputs) to trace with, every dynamic size >= 2."""
    kv = lambda length: torch.randn((batch, config.kv_heads, length, config.d_k), dtype=dtype)
    n = 2 * config.n_layers
    encoder = (torch.randint(0, 256, (batch, src)), torch.ones(batch, src, dtype=torch.long))
    decoder = (
        torch.randint(0, 256, (batch, seq)),
        torch.ones(batch, past + seq, dtype=torch.long),
        torch.arange(past, past + seq).repeat(batch, 1),
        torch.ones(batch, src, dtype=torch.long),
        *[kv(past) for _ in range(n)],
        *[kv(src) for _ in range(n)],
    )
    return encoder, decoder


def seq2seq_dynamic_shapes(n_layers: int) -> tuple[tuple, tuple]:
    d, n = Dim.DYNAMIC, 2 * n_layers
    encoder = ({0: d, 1: d}, {0: d, 1: d})
    decoder = ({0: d, 1: d}, {0: d, 1: d}, {0: d, 1: d}, {0: d, 1: d}, tuple({0: d, 2: d} for _ in range(2 * n)))
    return encoder, decoder


def decoder_sample_inputs(config, dtype: torch.dtype, batch: int = 2, seq: int = 3, past: int = 4) -> tuple:
    """Inputs to trace with: sizes >= 2 so that no axis is specialised (0 and 1 would be)."""
    shape = (batch, config.kv_heads, past, config.d_k)  # (B, H_kv, P, D)
    return (
        torch.randint(0, 256, (batch, seq)),
        torch.ones(batch, past + seq, dtype=torch.long),
        torch.arange(past, past + seq).repeat(batch, 1),
        *[torch.randn(shape, dtype=dtype) for _ in range(2 * config.n_layers)],
    )


def decoder_dynamic_shapes(n_layers: int) -> tuple:
    """torch.export dynamic shapes; the contract's axis names are applied to the ONNX file afterwards."""
    d = Dim.DYNAMIC
    return ({0: d, 1: d}, {0: d, 1: d}, {0: d, 1: d}, tuple({0: d, 2: d} for _ in range(2 * n_layers)))


def name_axes(path: Path, axes: dict[str, dict[int, str]]) -> None:
    """Give the dynamic axes of the graph's inputs and outputs the contract's names."""
    proto = onnx.load(str(path))
    for value in [*proto.graph.input, *proto.graph.output]:
        for index, name in axes.get(value.name, {}).items():
            value.type.tensor_type.shape.dim[index].dim_param = name
    onnx.save(proto, str(path))


def export_graph(
    module: nn.Module,
    args: tuple,
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes,
    axes: dict[str, dict[int, str]],
    verbose: bool = False,
) -> None:
    """Export with the dynamo exporter at the contract's opset, name the axes, then fuse (fusions.py)."""
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    logging.getLogger("torch.onnx").setLevel(logging.INFO if verbose else logging.ERROR)
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=True,
            opset_version=contract.OPSET,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            verbose=verbose,
        )
    name_axes(path, axes)
    pack_qkv(path)
    pack_siblings(path)


def arena_decoder_sample_inputs(config, dtype: torch.dtype) -> tuple:
    """An arena decoder's inputs to trace with: past and present are the (B, H, L, D) buffers; a mask
    wider than the new tokens and a buffer longer than both, so that torch.export ties none of the
    three lengths together (3 new tokens, a mask 5 wide, a buffer 8 long)."""
    ids, _, _, *past = decoder_sample_inputs(config, dtype, batch=2, seq=3, past=8)
    return (ids, torch.ones(2, 5, dtype=torch.long), torch.arange(2, 5).repeat(2, 1), *past)


def arena_seq2seq_decoder_sample_inputs(config, dtype: torch.dtype) -> tuple:
    """As the decoder-only arena's: a mask 5 wide, a self-attention buffer 8 long."""
    ids, _, _, src_mask, *caches = seq2seq_sample_inputs(config, dtype, past=8)[1]
    return (ids, torch.ones(2, 5, dtype=torch.long), torch.arange(2, 5).repeat(2, 1), src_mask, *caches)


@dataclass(frozen=True)
class GraphExport:
    """How one graph of a model directory is exported (its file and I/O names are the contract's
    graph_specs): the module wrapping the model, the inputs it is traced with (config, dtype), and
    torch.export's dynamic shapes and the contract's axis names for a model of n layers."""

    module: Callable[[Any], nn.Module]
    sample_inputs: Callable[[Any, torch.dtype], tuple]
    dynamic_shapes: Callable[[int], Any]
    axes: Callable[[int], dict[str, dict[int, str]]]


ENCODER_EXPORT = GraphExport(
    Seq2SeqEncoderGraph,
    lambda config, dtype: seq2seq_sample_inputs(config, dtype)[0],
    lambda n: seq2seq_dynamic_shapes(n)[0],
    contract.seq2seq_encoder_dynamic_axes,
)
# (architecture, KV cache layout) -> role -> how that graph is exported
EXPORTS: dict[tuple[str, str], dict[str, GraphExport]] = {
    (contract.DECODER_ONLY, contract.KV_CONCAT): {
        contract.DECODER: GraphExport(
            DecoderGraph, decoder_sample_inputs, decoder_dynamic_shapes, contract.decoder_dynamic_axes
        ),
    },
    (contract.DECODER_ONLY, contract.KV_ARENA): {
        contract.DECODER: GraphExport(
            ArenaDecoderGraph, arena_decoder_sample_inputs, decoder_dynamic_shapes, contract.arena_decoder_dynamic_axes
        ),
    },
    (contract.ENCODER_DECODER, contract.KV_CONCAT): {
        contract.ENCODER: ENCODER_EXPORT,
        contract.DECODER: GraphExport(
            Seq2SeqDecoderGraph,
            lambda config, dtype: seq2seq_sample_inputs(config, dtype)[1],
            lambda n: seq2seq_dynamic_shapes(n)[1],
            contract.seq2seq_decoder_dynamic_axes,
        ),
    },
    (contract.ENCODER_DECODER, contract.KV_ARENA): {
        contract.ENCODER: ENCODER_EXPORT,
        contract.DECODER: GraphExport(
            ArenaSeq2SeqDecoderGraph,
            arena_seq2seq_decoder_sample_inputs,
            lambda n: seq2seq_dynamic_shapes(n)[1],
            contract.arena_seq2seq_decoder_dynamic_axes,
        ),
    },
}
