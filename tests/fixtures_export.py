"""Session fixtures: the trained tiny checkpoint exported once, float32 (int4 and others on demand)."""

import pytest

CHAT_TEMPLATE = (  # a chat template of the Hugging Face kind, for the tiny BPE model's /v1/chat/completions
    "{% for message in messages %}{{ message.role | capitalize }}: {{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def exported(checkpoint, out, **options) -> None:
    """export_checkpoint, imported here (torch and onnx) only for the tests that export."""
    from attnserve.export.onnx_export import export_checkpoint

    export_checkpoint(checkpoint, out, **options)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_checkpoint, tmp_path_factory):
    """A float32 model directory of the trained tiny model; the parity gate has passed."""
    out = tmp_path_factory.mktemp("models") / "tiny"
    exported(tiny_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def tiny_float16_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model exported in float16 (runs on the CPU provider and on CUDA; gated on CUDA where there is one)."""
    out = tmp_path_factory.mktemp("models") / "tiny-float16"
    exported(tiny_checkpoint, out, dtype="float16")
    return out


@pytest.fixture(scope="session")
def tiny_concat_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model exported with the concat KV cache (the layout before the arena)."""
    out = tmp_path_factory.mktemp("models") / "tiny-concat"
    exported(tiny_checkpoint, out, kv_cache="concat")
    return out


@pytest.fixture(scope="session")
def tiny_bpe_model_dir(tiny_bpe_checkpoint, tmp_path_factory):
    """The BPE tiny model exported (arena), with its tokenizer.json beside the graph."""
    out = tmp_path_factory.mktemp("models") / "tiny-bpe"
    exported(tiny_bpe_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def tiny_int4_model_dir(tiny_checkpoint, tmp_path_factory):
    """The same model with int4 weights (MatMulNBits, the defaults); its held-out loss gate has passed."""
    out = tmp_path_factory.mktemp("models") / "tiny-int4"
    exported(tiny_checkpoint, out, quantize="int4")
    return out


@pytest.fixture(scope="session")
def chat_model_dir(tiny_bpe_checkpoint, tmp_path_factory):
    """The tiny BPE model exported with CHAT_TEMPLATE in its tokenizer_config.json."""
    out = tmp_path_factory.mktemp("models") / "tiny-chat"
    exported(tiny_bpe_checkpoint, out, chat_template=CHAT_TEMPLATE)
    return out
