"""A Marian checkpoint directory (`MarianMTModel`: the OPUS-MT translation models) read into attnserve's
encoder-decoder, the lectures' Transformer with what Marian does beyond it set in its config: norms after
each residual sum and none at the stacks' ends, an ungated SiLU feed-forward ("swish"), the sinusoid's
sin and cos in halves, a bias on the logits, and the decoder starting from the pad id.

Reads config.json, the weights (files.py, checked against marian_layout) and the tokenizer's files
(source.spm, target.spm, vocab.json). What the model cannot express is refused in one line naming the
field. Knows nothing of transformers: the proof against it is proof_seq2seq.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...tokenizer import TokenizerError
from ...tokenizer.sentencepiece import SentencePieceTokenizer
from ..config import ENCODER_DECODER, ModelConfig
from .decoders import HEAD_DIM_MULTIPLE
from .files import Dim, HFImportError, Layout, Shape, flag, integer, read_json, short, text

MARIAN = "MarianMTModel"
MARIAN_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}
# A layer's modules, ours -> Marian's (model.encoder.layers.{i}. or model.decoder.layers.{i}. before theirs)
ATTENTION = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
ENCODER_LAYER = {"ln_1": "self_attn_layer_norm", "ffn.w_1": "fc1", "ffn.w_2": "fc2", "ln_2": "final_layer_norm"}
DECODER_LAYER = {
    "ln_1": "self_attn_layer_norm",
    "ln_2": "encoder_attn_layer_norm",
    "ffn.w_1": "fc1",
    "ffn.w_2": "fc2",
    "ln_3": "final_layer_norm",
}
EMBEDDINGS = ("model.shared.weight", "model.decoder.embed_tokens.weight", "model.encoder.embed_tokens.weight")
MAX_POSITIONS = 1 << 16  # the sinusoid's table (max_position_embeddings x d_model) is built in memory; OPUS-MT's: 512


def marian_config(c: dict, path: Path) -> ModelConfig:
    """Marian's config.json as an encoder-decoder ModelConfig (post-LN, Marian's sinusoid, a logits bias)."""
    refuse = lambda field, why: HFImportError(f"{path}: {field} {short(c.get(field))}: {why}")
    activation = text(c, path, "activation_function", "gelu")
    if activation not in MARIAN_ACTIVATIONS:
        raise refuse("activation_function", f"not one of {', '.join(MARIAN_ACTIVATIONS)}")
    if not c.get("share_encoder_decoder_embeddings", True):
        raise refuse("share_encoder_decoder_embeddings", "separate source and target vocabularies are not implemented")
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for encoder_field, decoder_field in pairs:
        if c.get(encoder_field) != c.get(decoder_field):
            raise refuse(encoder_field, f"differs from {decoder_field} {c.get(decoder_field)!r}: not implemented")
    d_model, n_heads = integer(c, path, "d_model"), integer(c, path, "decoder_attention_heads")
    if d_model % n_heads or (d_model // n_heads) % HEAD_DIM_MULTIPLE:
        raise refuse("d_model", f"/ {n_heads} heads must be a multiple of {HEAD_DIM_MULTIPLE} (GroupQueryAttention)")
    max_len = integer(c, path, "max_position_embeddings")
    if max_len > MAX_POSITIONS:
        raise refuse("max_position_embeddings", f"over {MAX_POSITIONS}, the most the sinusoid's table is built for")
    return ModelConfig(
        arch=ENCODER_DECODER,
        vocab_size=integer(c, path, "vocab_size"),
        d_model=d_model,
        n_heads=n_heads,
        n_layers=integer(c, path, "decoder_layers"),
        n_encoder_layers=integer(c, path, "encoder_layers"),
        d_ff=integer(c, path, "decoder_ffn_dim"),
        max_len=max_len,
        positional="sinusoidal",
        sinusoid="halves",
        activation=MARIAN_ACTIVATIONS[activation],
        embed_scale=flag(c, path, "scale_embedding", False),
        norm_position="post",
        tie_head=flag(c, path, "tie_word_embeddings", True),
        logits_bias=True,
    )


def marian_layout(m: ModelConfig) -> Layout:
    """MarianMTModel's tensors as config.json sizes them (nn.Linear keeps (out, in))."""
    d, v = Dim(m.d_model, "d_model"), Dim(m.vocab_size, "vocab_size")
    attention = lambda kind: (
        {f"{kind}.{p}.weight": (d, d) for p in ATTENTION.values()}
        | {f"{kind}.{p}.bias": (d,) for p in ATTENTION.values()}
    )
    norm = lambda name: {f"{name}.weight": (d,), f"{name}.bias": (d,)}

    def layer(stack: str, cross: bool) -> dict[str, Shape]:
        f = Dim(m.d_ff, f"{stack}_ffn_dim")
        ffn = {"fc1.weight": (f, d), "fc1.bias": (f,), "fc2.weight": (d, f), "fc2.bias": (d,)}
        crossed = {**attention("encoder_attn"), **norm("encoder_attn_layer_norm")} if cross else {}
        return {**attention("self_attn"), **norm("self_attn_layer_norm"), **crossed, **ffn, **norm("final_layer_norm")}

    stacks = {
        "model.encoder.layers": (m.n_encoder_layers, "encoder_layers", layer("encoder", cross=False)),
        "model.decoder.layers": (m.n_layers, "decoder_layers", layer("decoder", cross=True)),
    }
    embeddings: dict[str, Shape] = dict.fromkeys((*EMBEDDINGS, "lm_head.weight"), (v, d))
    return Layout(stacks, {"final_logits_bias": (Dim(1, "vocab_size", m.vocab_size), v)}, embeddings)


def embedding(w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The one token embedding source, target and (tied) output share."""
    found = [w[name] for name in EMBEDDINGS if name in w]
    if not found:
        raise HFImportError(f"the weights lack the token embedding ({EMBEDDINGS[0]})")
    if any(not torch.equal(found[0], other) for other in found[1:]):
        raise HFImportError("the encoder's and decoder's token embeddings differ: separate ones are not implemented")
    return found[0]


def marian_state(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """EncoderDecoder's state dict from MarianMTModel's tensors (nn.Linear's layout on both sides)."""
    w = {name: t.float() for name, t in weights.items()}
    embed = embedding(w)
    state = {"embedding.embed.weight": embed, "embedding.logits_bias": w["final_logits_bias"].reshape(-1)}
    head = w.get("lm_head.weight")
    if config.tie_head:
        if head is not None and not torch.equal(head, embed):
            raise HFImportError("lm_head.weight differs from the token embedding, and tie_word_embeddings is true")
    elif head is not None:
        state["lm_head.weight"] = head
    stacks = [
        ("encoder_layers", "encoder", config.n_encoder_layers, ENCODER_LAYER),
        ("layers", "decoder", config.n_layers, DECODER_LAYER),
    ]
    for ours, theirs, count, modules in stacks:
        for i in range(count):
            mine, hf = f"{ours}.{i}.", f"model.{theirs}.layers.{i}."
            attention = {f"self_attn.{a}": f"self_attn.{b}" for a, b in ATTENTION.items()}
            if theirs == "decoder":
                attention.update({f"cross_attn.{a}": f"encoder_attn.{b}" for a, b in ATTENTION.items()})
            for module, their_module in {**modules, **attention}.items():
                for kind in ("weight", "bias"):
                    found = w.get(f"{hf}{their_module}.{kind}")
                    if found is not None:
                        state[f"{mine}{module}.{kind}"] = found
    return state


def suppressed(hf_dir: Path, config: dict) -> tuple[int, ...]:
    """The ids transformers' generate never picks for this model: generation_config.json's (else
    config.json's) bad_words_ids of one token each (OPUS-MT's: [[pad]]) and suppress_tokens."""
    generation = read_json(hf_dir / "generation_config.json", required=False)
    given = "bad_words_ids" in generation or "suppress_tokens" in generation
    source, where = (generation, "generation_config.json") if given else (config, "config.json")
    listed = {name: source.get(name) or [] for name in ("bad_words_ids", "suppress_tokens")}
    for name, found in listed.items():
        if not isinstance(found, list):
            raise HFImportError(f"{hf_dir / where}: {name} {short(found)}: not a list")
    ids = []
    for words in listed["bad_words_ids"]:
        if not (isinstance(words, list) and len(words) == 1 and isinstance(words[0], int)):
            raise HFImportError(f"{hf_dir}: bad_words_ids {short(words)}: only single ids are implemented")
        ids.append(words[0])
    ids += [i for i in listed["suppress_tokens"] if isinstance(i, int)]
    return tuple(sorted(set(ids)))


def marian_tokenizer(hf_dir: Path, config: dict) -> SentencePieceTokenizer:
    """source.spm, target.spm and vocab.json, the decoder starting from config.json's start id, and the
    ids its generation config bans."""
    token_config = read_json(hf_dir / "tokenizer_config.json", required=False)
    if token_config.get("separate_vocabs"):
        raise HFImportError(f"{hf_dir}: tokenizer_config.json separate_vocabs true: not implemented")
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    if not isinstance(start, int):
        raise HFImportError(f"{hf_dir / 'config.json'}: no decoder_start_token_id")
    try:
        tokenizer = SentencePieceTokenizer.from_files(hf_dir, start, suppressed(hf_dir, config))
    except TokenizerError as e:
        raise HFImportError(str(e)) from None
    for field in ("eos_token_id", "pad_token_id"):
        said, ours = config.get(field), getattr(tokenizer, field.replace("_token", ""))
        if isinstance(said, int) and said != ours:
            raise HFImportError(f"{hf_dir / 'config.json'}: {field} {said}, vocab.json's {ours}")
    return tokenizer
