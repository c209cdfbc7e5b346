"""Import from Hugging Face: a checkpoint directory read as untrusted input, mapped onto the lectures'
model, and proven against transformers before anything is written. Knows nothing of ONNX.

import_cli.py: `attnserve import`, the steps below in order; every refusal one line and exit 2.
files.py: the directory's files, whatever the architecture (bounded JSON, typed fields, safetensors
headers, weights kept inside the directory and checked against a family's Layout).
decoders.py: GPT-2 and the Llama family (Llama, Mistral, Qwen2) onto DecoderLM, with their BPE tokenizer.
marian.py: Marian (OPUS-MT) onto the encoder-decoder, with its SentencePiece tokenizer.
proof.py: a decoder against transformers' own model (a ragged batch's logits, then greedy decoding).
proof_seq2seq.py: the same proof for an encoder-decoder.
"""
