"""Session fixtures: a Hugging Face GPT-2 checkpoint directory made from a config at test time (random
weights, a byte-level BPE trained here on CPython's docs: nothing downloaded), imported into attnserve
and exported, each once."""

from __future__ import annotations

from pathlib import Path

import pytest

GPT2_CONFIG = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128)
# Random weights drawn wider than GPT-2's 0.02, so that greedy decoding meets few near ties
# (a tie decided by the last bit differs between any two implementations, the reference included).
INIT_STD = 0.3


def bpe_tokenizer_json(vocab_size: int = 400) -> str:
    """A GPT-2-style byte-level BPE with one special token, <|endoftext|>, as id 0."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["\n".join(list(topics.values())[:200])], trainer)
    return tok.to_str()


def save_gpt2(out: Path, **config) -> Path:
    """GPT2LMHeadModel(GPT2Config(...)) and its tokenizer, saved as transformers saves them."""
    import torch
    from tokenizers import Tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tokenizer = GPT2TokenizerFast(
        tokenizer_object=Tokenizer.from_str(bpe_tokenizer_json()),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    settings = {**GPT2_CONFIG, "initializer_range": INIT_STD, **config}
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos, **settings))
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """A Hugging Face GPT-2 checkpoint directory: config.json, model.safetensors, tokenizer.json, ..."""
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2-tiny")


@pytest.fixture(scope="session")
def gpt2_checkpoint(gpt2_dir, tmp_path_factory):
    """runs/NAME/checkpoint.pt of the imported GPT-2; its proof against transformers has passed."""
    from attnserve.model.import_cli import run

    out = tmp_path_factory.mktemp("runs") / "gpt2-tiny"
    run(gpt2_dir, out, steps=64)
    return out / "checkpoint.pt"


@pytest.fixture(scope="session")
def gpt2_model_dir(gpt2_checkpoint, tmp_path_factory):
    """The imported GPT-2 exported (float32, the arena); the export's parity gate has passed."""
    from attnserve.export.onnx_export import export_checkpoint

    out = tmp_path_factory.mktemp("models") / "gpt2-tiny"
    export_checkpoint(gpt2_checkpoint, out)
    return out
