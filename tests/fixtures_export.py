"""Session fixtures: the trained tiny checkpoint exported once, float32 (int4 and others on demand)."""

from pathlib import Path

import pytest
from built_once import built_once

CHAT_TEMPLATE = (  # a chat template of the Hugging Face kind, for the tiny BPE model's /v1/chat/completions
    "{% for message in messages %}{{ message.role | capitalize }}: {{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def exported(tmp_path_factory, name: str, checkpoint, **options) -> Path:
    """models/NAME: `checkpoint` exported once per test run (export_checkpoint, imported here, torch
    and onnx, only for the tests that export)."""
    from attnserve.export.onnx_export import export_checkpoint

    return built_once(tmp_path_factory, f"models/{name}", lambda out: export_checkpoint(checkpoint, out, **options))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_checkpoint, tmp_path_factory):
    """A float32 model directory of the trained tiny model; the parity gate has passed."""
    return exported(tmp_path_factory, "tiny", tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_float16_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model exported in float16 (runs on the CPU provider and on CUDA; gated on CUDA where there is one)."""
    return exported(tmp_path_factory, "tiny-float16", tiny_checkpoint, dtype="float16")


@pytest.fixture(scope="session")
def tiny_concat_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model exported with the concat KV cache (the layout before the arena)."""
    return exported(tmp_path_factory, "tiny-concat", tiny_checkpoint, kv_cache="concat")


@pytest.fixture(scope="session")
def tiny_bpe_model_dir(tiny_bpe_checkpoint, tmp_path_factory):
    """The BPE tiny model exported (arena), with its tokenizer.json beside the graph."""
    return exported(tmp_path_factory, "tiny-bpe", tiny_bpe_checkpoint)


@pytest.fixture(scope="session")
def tiny_int4_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model with int4 weights (MatMulNBits, the defaults); its held-out loss gate has passed."""
    return exported(tmp_path_factory, "tiny-int4", tiny_checkpoint, quantize="int4")


@pytest.fixture(scope="session")
def tiny_int8_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model with int8 weights and activations quantized row by row; its gates have passed."""
    return exported(tmp_path_factory, "tiny-int8", tiny_checkpoint, quantize="int8")


@pytest.fixture(scope="session")
def chat_model_dir(tiny_bpe_checkpoint, tmp_path_factory):
    """The tiny BPE model exported with CHAT_TEMPLATE in its tokenizer_config.json."""
    return exported(tmp_path_factory, "tiny-chat", tiny_bpe_checkpoint, chat_template=CHAT_TEMPLATE)
