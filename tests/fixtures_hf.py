"""Session fixtures: a Hugging Face GPT-2 checkpoint directory made from a config at test time (random
weights, a byte-level BPE trained here on CPython's docs: nothing downloaded), imported into attnserve
and exported, each once."""

from __future__ import annotations

import json
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


def hf_tokenizer(family: str):
    """A fast tokenizer as the family's checkpoints carry one: GPT-2's with <|endoftext|>; Qwen2's own
    class (its pre-tokenizer's regex, no BOS) over the same merges; Llama's and Mistral's with <s> and
    </s>, Llama's putting <s> first (its post-processor)."""
    from tokenizers import Tokenizer, processors
    from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast, Qwen2Tokenizer

    json_text = bpe_tokenizer_json()
    tok, end = Tokenizer.from_str(json_text), "<|endoftext|>"
    if family == "gpt2":
        return GPT2TokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end)
    if family == "qwen2":
        bpe = json.loads(json_text)["model"]
        merges = [tuple(pair) for pair in bpe["merges"]]
        return Qwen2Tokenizer(
            vocab=bpe["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token=end, pad_token=end
        )
    tok.add_special_tokens(["<s>", "</s>"])
    if family == "llama":
        bos = [("<s>", tok.token_to_id("<s>"))]
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=bos)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def hf_model(family: str, vocab_size: int, bos: int, eos: int, **config):
    """The family's model from a small config: grouped KV heads (8 query heads, 2 key/value) in the Llama
    family, Llama with an untied head, Qwen2 with its q/k/v biases and a tied head."""
    import transformers as t

    ids = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, initializer_range=INIT_STD)
    if family == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(**ids, **{**GPT2_CONFIG, **config}))
    llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8)
    llama.update(num_key_value_heads=2, max_position_embeddings=128, **ids, **config)
    if family == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**llama, tie_word_embeddings=False))
    if family == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**llama, tie_word_embeddings=True))
    return t.MistralForCausalLM(t.MistralConfig(**llama, sliding_window=None))


def save_hf(out: Path, family: str, **config) -> Path:
    """A checkpoint directory of `family` as transformers saves one, random weights (biases and norm
    weights drawn too, which transformers starts at 0 and 1, so that their mapping shows)."""
    import torch

    tokenizer = hf_tokenizer(family)
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    model = hf_model(family, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, **config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if "weight" in name else 0.0))
    model.save_pretrained(out)
    return out


FAMILIES = ("gpt2", "llama", "qwen2", "mistral")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """A Hugging Face GPT-2 checkpoint directory: config.json, model.safetensors, tokenizer.json, ..."""
    return save_hf(tmp_path_factory.mktemp("hf") / "gpt2-tiny", "gpt2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A Hugging Face Llama checkpoint directory (grouped KV heads, an untied head, BOS first)."""
    return save_hf(tmp_path_factory.mktemp("hf") / "llama-tiny", "llama")


@pytest.fixture(scope="session", params=FAMILIES)
def hf_dir(request, tmp_path_factory, gpt2_dir, llama_dir):
    """A checkpoint directory of each family in turn."""
    made = {"gpt2": gpt2_dir, "llama": llama_dir}
    family = request.param
    return made.get(family) or save_hf(tmp_path_factory.mktemp("hf") / f"{family}-tiny", family)


@pytest.fixture(scope="session")
def hf_checkpoint(hf_dir, tmp_path_factory):
    """runs/NAME/checkpoint.pt of the imported directory; its proof against transformers has passed."""
    from attnserve.model.import_cli import run

    out = tmp_path_factory.mktemp("runs") / hf_dir.name
    run(hf_dir, out, steps=64)
    return out / "checkpoint.pt"


@pytest.fixture(scope="session")
def hf_model_dir(hf_checkpoint, tmp_path_factory):
    """The imported model exported (float32, the arena); the export's parity gate has passed."""
    from attnserve.export.onnx_export import export_checkpoint

    out = tmp_path_factory.mktemp("models") / hf_checkpoint.parent.name
    export_checkpoint(hf_checkpoint, out)
    return out
