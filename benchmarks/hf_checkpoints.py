"""Hugging Face checkpoint directories made from configs, random weights (nothing downloaded): the
tests' tiny ones of each family and the size benchmark's GPT-2-small and SmolLM-135M-shaped ones.
Each is a directory as transformers' save_pretrained writes it, with a byte-level BPE trained here
on CPython's docs (padded with plain added tokens to the config's vocabulary where that is larger).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


SENTENCEPIECE_SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2; the 256 byte tokens <0x00>..<0xFF> follow


def sentencepiece_tokenizer_json(vocab_size: int = 400) -> str:
    """A BPE as Llama 2's and Mistral's tokenizer.json hold one (converted from SentencePiece): spaces
    normalized to "▁" with one prepended, no pre-tokenizer, the 256 byte tokens <0x00>..<0xFF>
    after <unk>, <s>, </s> for the characters the merges lack (byte fallback), and a decoder that
    maps "▁" back to spaces, bytes back to characters and strips the prepended space."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")  # training only
    first = len(SENTENCEPIECE_SPECIALS) + 256
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - first, limit_alphabet=80, show_progress=False)
    tok.train_from_iterator(["\n".join(list(topics.values())[:200])], trainer)
    spec = json.loads(tok.to_str())
    vocab = {token: i for i, token in enumerate(SENTENCEPIECE_SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(SENTENCEPIECE_SPECIALS) + b for b in range(256)})
    for token, _ in sorted(spec["model"]["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    special = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    spec["model"]["vocab"], spec["pre_tokenizer"] = vocab, None
    spec["added_tokens"] = [{"id": i, "content": t, **special} for i, t in enumerate(SENTENCEPIECE_SPECIALS)]
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    spec["decoder"] = {"type": "Sequence", "decoders": [json.loads(step.__getstate__()) for step in steps]}
    return json.dumps(spec)


def hf_tokenizer(family: str):
    """A fast tokenizer as the family's checkpoints carry one: GPT-2's with <|endoftext|>; Qwen2's own
    class (its pre-tokenizer's regex, no BOS) over the same merges; Llama 3's byte-level BPE with <s>
    and </s>, <s> put first by its post-processor; Mistral's converted from SentencePiece (byte
    fallback, "▁" for spaces, <unk>), <s> first too."""
    from tokenizers import Tokenizer, processors
    from transformers import GPT2Tokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer  # GPT2TokenizerFast's class

    json_text = bpe_tokenizer_json()
    tok, end = Tokenizer.from_str(json_text), "<|endoftext|>"
    if family == "gpt2":
        return GPT2Tokenizer(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end)
    if family == "qwen2":
        bpe = json.loads(json_text)["model"]
        merges: Any = [tuple(pair) for pair in bpe["merges"]]  # pairs, as tokenizer.json holds them
        no_unk: Any = None  # byte-level: no text is unknown
        return Qwen2Tokenizer(
            vocab=bpe["vocab"], merges=merges, unk_token=no_unk, bos_token=None, eos_token=end, pad_token=end
        )
    if family == "mistral":
        tok = Tokenizer.from_str(sentencepiece_tokenizer_json())
    else:
        tok.add_special_tokens(["<s>", "</s>"])
    bos = [("<s>", tok.token_to_id("<s>"))]
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=bos)
    unknown = dict(unk_token="<unk>") if family == "mistral" else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", **unknown)


def hf_model(family: str, vocab_size: int, bos: int, eos: int, **config):
    """The family's model from a config: by default a small one with grouped KV heads (4 query heads,
    2 key/value, head size 16) in the Llama family, Llama with an untied head, Qwen2 with its q/k/v
    biases and a tied head, Mistral with 8 query heads of size 8 (its export turns rotary positions in
    separate nodes: GroupQueryAttention turns them itself only for multiples of 16); `config`
    overrides any field."""
    import transformers as t

    ids = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, initializer_range=INIT_STD)
    if family == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(**{**GPT2_CONFIG, **ids, **config}))
    llama: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    llama.update(num_key_value_heads=2, max_position_embeddings=128, **ids)
    if family == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**{**llama, "tie_word_embeddings": False, **config}))
    if family == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**{**llama, "tie_word_embeddings": True, **config}))
    return t.MistralForCausalLM(
        t.MistralConfig(**{**llama, "sliding_window": None, "num_attention_heads": 8, **config})
    )


def save_hf(out: Path, family: str, vocab_size: int | None = None, draw_all: bool = True, **config) -> Path:
    """A checkpoint directory of `family` as transformers saves one, random weights; `draw_all` draws
    biases and norm weights too (transformers starts them at 0 and 1), so that their mapping shows."""
    import torch

    tokenizer = hf_tokenizer(family)
    if vocab_size is not None and vocab_size > len(tokenizer):
        tokenizer.add_tokens([f"<extra_{i}>" for i in range(vocab_size - len(tokenizer))])
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    model = hf_model(family, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, **config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if draw_all and (name.endswith("bias") or "norm" in name or "ln_" in name):
                parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if "weight" in name else 0.0))
    model.save_pretrained(out)
    return out


# Real sizes: a GPT-2 of 34M parameters (the size ladder's middle rung), GPT-2 small's config (124M
# parameters) and SmolLM-135M's (a Llama: 9 query heads, 3 key/value heads, 30 layers, a tied head),
# with transformers' own initialisation.
SIZES = {
    "gpt2-30m": ("gpt2", dict(n_embd=512, n_layer=8, n_head=8, n_positions=1024, initializer_range=0.02), 16384),
    "gpt2-124m": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, initializer_range=0.02), 50257),
    "smollm-135m": (
        "llama",
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            initializer_range=0.02,
        ),
        49152,
    ),
}


# A Marian translation model (MarianMTModel) as OPUS-MT's are configured (post-LN, "swish", scaled
# embeddings, sinusoidal positions, the pad id as the decoder's start), small for the tests by default;
# OPUS_MT_SHAPE is the real models' (~75M parameters with their 58,101-id vocabulary).
MARIAN_CONFIG = dict(
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    max_position_embeddings=128,
)
OPUS_MT_VOCAB = 58101  # opus-mt-en-de's vocab.json
OPUS_MT_SHAPE = dict(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    max_position_embeddings=512,
)


def sentencepiece_model(lines: list[str], vocab_size: int) -> bytes:
    """A unigram SentencePiece model trained on `lines`, as Marian's source.spm and target.spm are."""
    import io

    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    return out.getvalue()


def corpus_lines(first: int, count: int) -> list[str]:
    """Non-empty lines of CPython's pydoc topics (its docs, shipped with Python), topics first to first+count."""
    from pydoc_data.topics import topics

    texts = list(topics.values())[first : first + count]
    return [line.strip() for text in texts for line in text.splitlines() if line.strip()]


def save_marian(
    out: Path, pieces: int = 300, vocab_size: int | None = None, init_std: float = INIT_STD, **config
) -> Path:
    """A Marian checkpoint directory as transformers saves one: a source and a target SentencePiece model
    trained on two different parts of CPython's docs (`pieces` each), vocab.json their union (</s> 0,
    <unk> 1, <pad> last, as OPUS-MT's; padded with unused pieces to `vocab_size` where that is larger),
    random weights with biases, norms and final_logits_bias drawn."""
    import torch
    import transformers as t

    out.mkdir(parents=True, exist_ok=True)
    models = {"source.spm": sentencepiece_model(corpus_lines(0, 40), pieces)}
    models["target.spm"] = sentencepiece_model(corpus_lines(40, 40), pieces)
    vocab = {"</s>": 0, "<unk>": 1}
    for name, model_bytes in models.items():
        (out / name).write_bytes(model_bytes)
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    for i in range(len(vocab), (vocab_size or 0) - 1):
        vocab[f"<extra_{i}>"] = i
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = t.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"))
    tokenizer.save_pretrained(out)
    pad = vocab["<pad>"]
    settings: dict[str, Any] = dict(activation_function="swish", scale_embedding=True, init_std=init_std)
    settings.update(MARIAN_CONFIG)
    settings.update(vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0)
    settings.update(forced_eos_token_id=0, **config)
    torch.manual_seed(0)
    model = t.MarianMTModel(t.MarianConfig(**settings))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if "weight" in name else 0.0))
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.save_pretrained(out)
    generation = out / "generation_config.json"  # OPUS-MT's bans the pad id (transformers 5 leaves it out)
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "bad_words_ids": [[pad]]}, indent=2))
    return out
