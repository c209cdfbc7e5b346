"""genai_config.json: the manifest restated for onnxruntime-genai, so that it runs model.onnx unchanged.

Torch-free and derived from the manifest only (contract.py), never from the checkpoint, so the two
files cannot disagree. Decoder-only models; onnxruntime-genai's own names, only fields it knows.
"""

from __future__ import annotations

from typing import Any

from ..runtime import contract


def genai_io_names() -> tuple[dict[str, str], dict[str, str]]:
    """genai's input and output name maps: the contract's names, %d standing for the layer."""
    past = {kv: contract.PAST_NAME.format(i="%d", seg="", kv=kv) for kv in ("key", "value")}
    present = {kv: contract.PRESENT_NAME.format(i="%d", seg="", kv=kv) for kv in ("key", "value")}
    inputs = {
        "input_ids": contract.INPUT_IDS,
        "attention_mask": contract.ATTENTION_MASK,
        "position_ids": contract.POSITION_IDS,
        "past_key_names": past["key"],
        "past_value_names": past["value"],
    }
    outputs = {"logits": contract.LOGITS, "present_key_names": present["key"], "present_value_names": present["value"]}
    return inputs, outputs


# Families whose model type genai's builder writes for this graph's layout (separate past keys and values,
# GroupQueryAttention); genai's "gpt2" type is the older converter's GPT-2, one combined past per layer.
BUILDER_TYPES = ("llama", "mistral", "qwen2")
GENERIC_TYPE = "decoder"


def genai_model_type(manifest: contract.Manifest) -> str:
    """The imported family's model type as genai's builder writes it; "decoder" for any other model."""
    family = manifest.config.get("family", "")
    return family if family in BUILDER_TYPES else GENERIC_TYPE


def genai_config(manifest: contract.Manifest) -> dict[str, Any]:
    """genai_config.json for onnxruntime-genai (decoder-only), using only fields it knows; the model
    type is the Hugging Face family's, as genai's model builder writes it, for an imported model."""
    inputs, outputs = genai_io_names()
    return {
        "model": {
            "bos_token_id": manifest.bos_id,
            "eos_token_id": manifest.eos_id,
            "pad_token_id": manifest.pad_id,
            "context_length": manifest.context_length,
            "vocab_size": manifest.vocab_size,
            "type": genai_model_type(manifest),
            "decoder": {
                "filename": manifest.graphs[contract.DECODER].file,
                "head_size": manifest.head_dim,
                "hidden_size": manifest.d_model,
                "num_attention_heads": manifest.n_heads,
                "num_key_value_heads": manifest.n_kv_heads,
                "num_hidden_layers": manifest.n_layers,
                "session_options": {"log_id": "attnserve"},
                "inputs": inputs,
                "outputs": outputs,
            },
        },
        "search": {
            "do_sample": False,
            "max_length": manifest.context_length,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": manifest.kv_cache == contract.KV_ARENA,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
