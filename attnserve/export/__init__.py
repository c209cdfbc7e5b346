"""Export to ONNX: a checkpoint becomes a model directory, written by the contract in runtime/contract.py and
gated by parity against PyTorch, driven through the runtime exactly as serving drives it. The modules here
import torch, except genai.py, quantize.py, int8_rows.py, fusions.py, gate_lengths.py and logits_pass_graph.py.

export_cli.py (`attnserve export`: flags, one-line errors) -> onnx_export.py (the export run: checkpoint in,
model directory out once the gates pass) -> graphs.py (modules with the exported graphs' signatures, and the
export call), whose layers become ONNX Runtime's fused ops through gqa.py (GroupQueryAttention over the
in-place KV cache), norms.py (RMSNorm) and activations.py (GELU); fusions.py packs each attention's three
projections into one MatMul. The gates: parity.py (a decoder's graphs against PyTorch, and the report every
gate shares; gate_lengths.py fits its prompts into a short context), parity_arena.py (an arena graph,
driven as the server drives it), parity_seq2seq.py (an
encoder-decoder's graphs), parity_beams.py (beam search, hypothesis for hypothesis), invariance.py (a
request's tokens alone, in any batch and in any chunks, the same) and quantize.py (int8 and int4 weights,
gated by held-out loss; int8_rows.py quantizes int8 activations row by row). genai.py writes genai_config.json
for onnxruntime-genai. logits_pass_graph.py builds the serving runtime's batched logits pass
(runtime/logits_pass.py runs it), checked into the package, not written per export.
"""
