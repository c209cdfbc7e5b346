"""A Hugging Face checkpoint directory read into attnserve's model: GPT-2 (`GPT2LMHeadModel`) and the
Llama family (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`).

Reads config.json, the tokenizer (tokenizer.json with tokenizer_config.json and
generation_config.json) and the weights (files.py reads and checks them against each family's
Layout here), and maps them onto a ModelConfig and DecoderLM's state dict. What the model cannot
express is refused in one line naming the field, and so is a checkpoint that names code of its own.
Knows nothing of transformers: the proof against it is proof.py, the command import_cli.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ...tokenizer import TokenizerError
from ...tokenizer.bpe import BpeTokenizer, library_tokenizer
from ...tokenizer.chat_template import token_text
from ..config import DECODER, ModelConfig
from ..positional import ROPE_SCALINGS
from .files import Dim, HFImportError, Layout, Shape, flag, integer, number, read_json, short, table, text

TOKENIZER_FILE, TOKENIZER_CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
GPT2 = "GPT2LMHeadModel"
LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ARCHITECTURES = (GPT2, *LLAMA_FAMILY)
# Each architecture's family: the model_type transformers writes, and the model type onnxruntime-genai's builder uses
MODEL_TYPES = {GPT2: "gpt2", "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}  # HF -> ours
# A layer's modules, ours -> GPT-2's (q, k and v come out of its c_attn); the feed-forward's norm is
# our ln_3 (ln_2 is an encoder-decoder's cross-attention norm).
GPT2_LAYER = {
    "self_attn.w_o": "attn.c_proj",
    "ffn.w_1": "mlp.c_fc",
    "ffn.w_2": "mlp.c_proj",
    "ln_1": "ln_1",
    "ln_3": "ln_2",
}
# A Llama layer's modules, ours -> theirs (model.layers.{i}. before theirs).
LLAMA_LAYER = {
    "self_attn.w_q": "self_attn.q_proj",
    "self_attn.w_k": "self_attn.k_proj",
    "self_attn.w_v": "self_attn.v_proj",
    "self_attn.w_o": "self_attn.o_proj",
    "ffn.w_1": "mlp.gate_proj",
    "ffn.w_3": "mlp.up_proj",
    "ffn.w_2": "mlp.down_proj",
    "ln_1": "input_layernorm",
    "ln_3": "post_attention_layernorm",
}
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
HEAD_DIM_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention, which the export's KV arena runs on


def architecture(config: dict, path: Path, known: tuple[str, ...] = ARCHITECTURES) -> str:
    """The one architecture config.json names, if attnserve imports it (one of `known`)."""
    names = config.get("architectures")
    if not isinstance(names, list) or len(names) != 1 or names[0] not in known:
        raise HFImportError(f"{path}: architectures {short(names)}: attnserve imports {', '.join(known)}")
    return names[0]


def own_code(config: dict, path: Path, kinds: dict[str, str], arch: str) -> None:
    """Refuses a config that would have transformers look for the checkpoint's own code: a model_type
    other than its architecture's (`kinds`), or an auto_map (attnserve proves against transformers' code)."""
    if config.get("model_type") != kinds[arch]:
        raise HFImportError(
            f"{path}: model_type {short(config.get('model_type'))} is not one attnserve imports "
            f"({', '.join(sorted(set(kinds.values())))}; {arch} is {kinds[arch]!r})"
        )
    if "auto_map" in config:
        raise HFImportError(f"{path}: auto_map names custom code, which attnserve never runs")


def gpt2_config(c: dict, path: Path) -> ModelConfig:
    """GPT-2's config.json as a ModelConfig: learned positions, unscaled embeddings, tanh GELU, tied head."""
    refuse = lambda field, why: HFImportError(f"{path}: {field} {short(c.get(field))}: {why}")
    activation = text(c, path, "activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise refuse("activation_function", f"not one of {', '.join(GPT2_ACTIVATIONS)}")
    for field, fine in (("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False)):
        if c.get(field, fine) != fine:
            raise refuse(field, "not implemented")
    if c.get("scale_attn_weights", True) is not True:
        raise refuse("scale_attn_weights", "attention without the 1/sqrt(head size) scale is not implemented")
    if c.get("tie_word_embeddings", True) is not True:
        raise refuse("tie_word_embeddings", "an untied output head is not implemented for GPT-2")
    d_model, n_heads = integer(c, path, "n_embd"), integer(c, path, "n_head")
    if d_model % n_heads or (d_model // n_heads) % HEAD_DIM_MULTIPLE:
        raise refuse("n_embd", f"/ n_head {n_heads} must be a multiple of {HEAD_DIM_MULTIPLE} (GroupQueryAttention)")
    return ModelConfig(
        arch=DECODER,
        vocab_size=integer(c, path, "vocab_size"),
        d_model=d_model,
        n_heads=n_heads,
        n_layers=integer(c, path, "n_layer"),
        d_ff=integer(c, path, "n_inner", 4 * d_model),
        max_len=integer(c, path, "n_positions"),
        positional="learned",
        activation=GPT2_ACTIVATIONS[activation],
        embed_scale=False,
        norm_eps=number(c, path, "layer_norm_epsilon", 1e-5),
    )


def gpt2_layout(m: ModelConfig) -> Layout:
    """GPT2LMHeadModel's tensors as config.json sizes them (its Conv1D keeps (in, out))."""
    d, v, f = Dim(m.d_model, "n_embd"), Dim(m.vocab_size, "vocab_size"), Dim(m.d_ff, "n_inner")
    qkv = Dim(3 * m.d_model, "n_embd", m.d_model)
    layer: dict[str, Shape] = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.c_attn.weight": (d, qkv),
        "attn.c_attn.bias": (qkv,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "mlp.c_fc.weight": (d, f),
        "mlp.c_fc.bias": (f,),
        "mlp.c_proj.weight": (f, d),
        "mlp.c_proj.bias": (d,),
    }
    top = {"wte.weight": (v, d), "wpe.weight": (Dim(m.max_len, "n_positions"), d), "ln_f.weight": (d,)}
    top["ln_f.bias"] = (d,)
    return Layout({"h": (m.n_layers, "n_layer", layer)}, top, {"lm_head.weight": (v, d)}, prefix="transformer.")


def conv1d(weight: torch.Tensor) -> torch.Tensor:
    """GPT-2's Conv1D keeps (in, out); nn.Linear keeps (out, in)."""
    return weight.t().contiguous()


def gpt2_state(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """DecoderLM's state dict from GPT2LMHeadModel's tensors (q, k, v split out of c_attn)."""
    w = {name.removeprefix("transformer."): t.float() for name, t in weights.items()}
    state = {
        "embedding.embed.weight": w["wte.weight"],
        "embedding.position.table.weight": w["wpe.weight"][: config.max_len],  # --context-length may cut it
        "ln_f.weight": w["ln_f.weight"],
        "ln_f.bias": w["ln_f.bias"],
    }
    for i in range(config.n_layers):
        h, ours = f"h.{i}.", f"layers.{i}."
        q, k, v = conv1d(w[h + "attn.c_attn.weight"]).chunk(3, dim=0)
        qb, kb, vb = w[h + "attn.c_attn.bias"].chunk(3)
        for name, weight, bias in (("w_q", q, qb), ("w_k", k, kb), ("w_v", v, vb)):
            state[f"{ours}self_attn.{name}.weight"], state[f"{ours}self_attn.{name}.bias"] = weight, bias
        for mine, theirs in GPT2_LAYER.items():
            weight = w[f"{h}{theirs}.weight"]
            state[f"{ours}{mine}.weight"] = conv1d(weight) if weight.dim() == 2 else weight  # LayerNorms: 1-D
            state[f"{ours}{mine}.bias"] = w[f"{h}{theirs}.bias"]
    head = w.get("lm_head.weight")
    if head is not None and not torch.equal(head.float(), state["embedding.embed.weight"]):
        raise HFImportError("lm_head.weight differs from wte.weight: an untied output head is not implemented")
    return state


def rope(c: dict, path: Path) -> tuple[float, dict | None]:
    """The rotary base and scaling (None: the default rope); refused for a scaling not implemented."""
    parameters = table(c, path, "rope_parameters")
    field = "rope_parameters" if parameters else "rope_scaling"
    scaling = {**table(c, path, "rope_scaling"), **parameters}
    where = f"{path}: {field}"
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind not in ("default", *ROPE_SCALINGS):
        raise HFImportError(f"{where} rope_type {short(kind)}: not one of default, {', '.join(ROPE_SCALINGS)}")
    if number(scaling, where, "partial_rotary_factor", 1.0) != 1.0:
        raise HFImportError(f"{where} partial_rotary_factor: rotary positions on part of a head")
    theta = number(scaling, where, "rope_theta", 0.0) or number(c, path, "rope_theta", 0.0) or 10000.0
    if kind == "default":
        return theta, None
    keys = ("factor",) if kind == "linear" else LLAMA3_KEYS
    missing = [key for key in keys if key not in scaling]
    if missing:
        raise HFImportError(f"{where} rope_type {kind!r} lacks {', '.join(missing)}")
    for key in keys:
        number(scaling, where, key)  # each a finite number
    return theta, {"rope_type": kind, **{key: scaling[key] for key in keys}}


def llama_config(c: dict, path: Path) -> ModelConfig:
    """A Llama-family config.json as a ModelConfig: rotary positions, RMSNorm, SwiGLU, grouped KV heads."""
    refuse = lambda field, why: HFImportError(f"{path}: {field} {short(c.get(field))}: {why}")
    if text(c, path, "hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "the feed-forward must be SwiGLU (silu)")
    d_model, n_heads = integer(c, path, "hidden_size"), integer(c, path, "num_attention_heads")
    if c.get("head_dim") not in (None, d_model // n_heads):
        raise refuse("head_dim", f"must be hidden_size / num_attention_heads ({d_model // n_heads})")
    if d_model % n_heads or (d_model // n_heads) % HEAD_DIM_MULTIPLE:
        raise refuse(
            "hidden_size", f"/ {n_heads} heads must be a multiple of {HEAD_DIM_MULTIPLE} (GroupQueryAttention)"
        )
    n_kv_heads = integer(c, path, "num_key_value_heads", n_heads)
    if n_heads % n_kv_heads:
        raise refuse("num_key_value_heads", f"must divide num_attention_heads {n_heads}")
    max_len = integer(c, path, "max_position_embeddings")
    if flag(c, path, "use_sliding_window", True) and integer(c, path, "sliding_window", max_len) < max_len:
        raise refuse("sliding_window", "sliding-window attention is not implemented")
    qwen = c["architectures"][0] == "Qwen2ForCausalLM"
    theta, scaling = rope(c, path)
    attention_bias = flag(c, path, "attention_bias", False)
    return ModelConfig(
        arch=DECODER,
        vocab_size=integer(c, path, "vocab_size"),
        d_model=d_model,
        n_heads=n_heads,
        n_layers=integer(c, path, "num_hidden_layers"),
        d_ff=integer(c, path, "intermediate_size"),
        max_len=max_len,
        positional="rotary",
        activation="swiglu",
        embed_scale=False,
        norm="rmsnorm",
        norm_eps=number(c, path, "rms_norm_eps", 1e-6),
        n_kv_heads=n_kv_heads,
        qkv_bias=qwen or attention_bias,
        o_bias=attention_bias and not qwen,
        ffn_bias=flag(c, path, "mlp_bias", False),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_head=flag(c, path, "tie_word_embeddings", False),
    )


def llama_layout(m: ModelConfig) -> Layout:
    """A Llama-family model's tensors as config.json sizes them (nn.Linear keeps (out, in))."""
    d, v, f = Dim(m.d_model, "hidden_size"), Dim(m.vocab_size, "vocab_size"), Dim(m.d_ff, "intermediate_size")
    kv = Dim(m.kv_heads * m.d_k, "num_key_value_heads", m.kv_heads)
    linears: dict[str, tuple[Shape, bool]] = {  # each nn.Linear's (out, in), and whether it has a bias
        "self_attn.q_proj": ((d, d), m.qkv_bias),
        "self_attn.k_proj": ((kv, d), m.qkv_bias),
        "self_attn.v_proj": ((kv, d), m.qkv_bias),
        "self_attn.o_proj": ((d, d), m.o_bias),
        "mlp.gate_proj": ((f, d), m.ffn_bias),
        "mlp.up_proj": ((f, d), m.ffn_bias),
        "mlp.down_proj": ((d, f), m.ffn_bias),
    }
    layer: dict[str, Shape] = {f"{name}.weight": shape for name, (shape, _) in linears.items()}
    layer.update({f"{name}.bias": shape[:1] for name, (shape, bias) in linears.items() if bias})
    layer.update({"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,)})
    top: dict[str, Shape] = {"embed_tokens.weight": (v, d), "norm.weight": (d,)}
    head: dict[str, Shape] = {"lm_head.weight": (v, d)}
    stacks = {"layers": (m.n_layers, "num_hidden_layers", layer)}
    if m.tie_head:
        return Layout(stacks, top, optional=head, prefix="model.")
    return Layout(stacks, {**top, **head}, prefix="model.")


def llama_state(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """DecoderLM's state dict from a Llama-family model's tensors (nn.Linear's layout on both sides)."""
    w = {name.removeprefix("model."): t.float() for name, t in weights.items()}
    state = {"embedding.embed.weight": w["embed_tokens.weight"], "ln_f.weight": w["norm.weight"]}
    if not config.tie_head:
        state["lm_head.weight"] = w["lm_head.weight"]
    for i in range(config.n_layers):
        for mine, theirs in LLAMA_LAYER.items():
            for kind in ("weight", "bias"):
                found = w.get(f"layers.{i}.{theirs}.{kind}")
                if found is not None:
                    state[f"layers.{i}.{mine}.{kind}"] = found
    return state


def config_ids(sources: list[dict], name: str) -> list[int]:
    """`name`_token_id of the first of generation_config.json and config.json that gives one: one id or
    several (Llama 3's instruct models end at any of three)."""
    for source in sources:
        found = source.get(f"{name}_token_id")
        ids = [i for i in (found if isinstance(found, list) else [found]) if isinstance(i, int)]
        if ids:
            return ids
    return []


def special_id(lookup: Callable[[str], int | None], name: str, sources: list[dict], token_config: dict) -> int | None:
    """The (first) `name`_token_id the model's configs give, else tokenizer_config.json's token."""
    ids = config_ids(sources, name)
    if ids:
        return ids[0]
    text = token_text(token_config.get(f"{name}_token"))
    return lookup(text) if text else None


def adds_bos(token_config: dict, library, bos: int) -> bool:
    """tokenizer_config.json's add_bos_token where it says, else whether tokenizer.json's post-processor
    puts BOS first (Llama's TemplateProcessing does; GPT-2's and Qwen2's do not)."""
    said = token_config.get("add_bos_token")
    if isinstance(said, bool):
        return said
    with_specials = library.encode("a", add_special_tokens=True).ids
    return bool(with_specials) and with_specials[0] == bos != library.encode("a", add_special_tokens=False).ids[0]


def read_tokenizer(hf_dir: Path, config: dict) -> BpeTokenizer:
    """tokenizer.json with the special ids and BOS rule its model's files give."""
    path = hf_dir / TOKENIZER_FILE
    if not path.is_file():
        raise HFImportError(f"{path}: not found (attnserve reads a fast tokenizer's tokenizer.json)")
    token_config = read_json(hf_dir / TOKENIZER_CONFIG_FILE, required=False)
    sources = [read_json(hf_dir / GENERATION_CONFIG_FILE, required=False), config]
    try:
        json_text = path.read_text(encoding="utf-8")
        library = library_tokenizer(json_text)
        ids = {name: special_id(library.token_to_id, name, sources, token_config) for name in ("bos", "eos", "pad")}
        eos = ids["eos"]
        if eos is None:
            raise HFImportError(f"{hf_dir}: no EOS id (generation_config.json, config.json, tokenizer_config.json)")
        bos = eos if ids["bos"] is None else ids["bos"]
        special: dict[str, Any] = {
            "bos_id": bos,
            "eos_id": eos,
            "pad_id": eos if ids["pad"] is None else ids["pad"],  # padding is masked: any id will do
            "add_bos": adds_bos(token_config, library, bos),
        }
        eos_ids = config_ids(sources, "eos")
        if len(eos_ids) > 1:
            special["eos_ids"] = eos_ids
        return BpeTokenizer(json_text, special, token_config or {"tokenizer_class": "PreTrainedTokenizerFast"})
    except (OSError, UnicodeDecodeError, TokenizerError) as e:
        raise HFImportError(f"{path}: {e}") from None


class Family(NamedTuple):
    """How an architecture is read: its config.json as a ModelConfig, the tensors that config implies, and
    the state dict its weights map to."""

    config: Callable[[dict, Path], ModelConfig]
    layout: Callable[[ModelConfig], Layout]
    state: Callable[[dict[str, torch.Tensor], ModelConfig], dict]


FAMILIES: dict[str, Family] = {
    GPT2: Family(gpt2_config, gpt2_layout, gpt2_state),
    **dict.fromkeys(LLAMA_FAMILY, Family(llama_config, llama_layout, llama_state)),
}
