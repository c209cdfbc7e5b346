"""Model configuration: one typed dataclass, built once at the command line and passed down whole.

Knows nothing of training, ONNX or serving; presets are a dict literal of overrides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..tokenizer.utf8 import VOCAB_SIZE

# The manifest spells them the same way (runtime/contract.py; tests/test_export.py checks they agree).
DECODER, ENCODER_DECODER = "decoder", "encoder-decoder"
ARCHITECTURES = (DECODER, ENCODER_DECODER)
POSITIONALS = ("sinusoidal", "learned", "rotary")
# the lectures' ReLU; GPT-2's tanh GELU; Llama's SwiGLU; Marian's SiLU ("swish", ungated)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu", "silu")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")  # a sub-layer's norm before it (GPT-2, Llama, the lectures') or after the residual sum
SINUSOIDS = ("interleaved", "halves")  # sin and cos in alternate columns (Vaswani et al.), or sin then cos (Marian)


# Entries of a positional table (max_len x its width) at most: 1 GiB in float64 as a sinusoid is built.
# A Llama of 128K positions (head size 128) holds 16.8M; a checkpoint claiming a billion positions is refused.
MAX_POSITION_TABLE = 1 << 27


@dataclass(frozen=True)
class ModelConfig:
    arch: str = DECODER  # "decoder" (language model) or "encoder-decoder"
    vocab_size: int = VOCAB_SIZE  # the tokenizer's, set by training (byte-level: 256 bytes + BOS, EOS, PAD)
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # attention heads; d_k = d_model // n_heads
    n_layers: int = 4  # decoder layers
    n_encoder_layers: int = 0  # encoder layers (encoder-decoder only)
    d_ff: int = 512  # hidden width of the position-wise feed-forward
    max_len: int = 256  # context length in tokens (positions 0..max_len-1)
    dropout: float = 0.0  # dropout on attention weights and residual branches
    positional: str = "sinusoidal"  # "sinusoidal" (Vaswani et al.), "learned" (GPT-2) or "rotary" (Llama)
    activation: str = "relu"  # the feed-forward's: "relu", "gelu", "gelu_tanh" (GPT-2's) or "swiglu" (Llama's)
    embed_scale: bool = True  # token embeddings times sqrt(d_model) (Vaswani et al.); GPT-2 and Llama: unscaled
    norm: str = "layernorm"  # "layernorm", or "rmsnorm" (Llama's)
    norm_eps: float = 1e-5  # the norms' epsilon
    n_kv_heads: int = 0  # key/value heads, each shared by n_heads / n_kv_heads query heads (GQA); 0: n_heads
    qkv_bias: bool = True  # biases on the query, key and value projections (Llama: none, Qwen2: these only)
    o_bias: bool = True  # a bias on the attention's output projection
    ffn_bias: bool = True  # biases in the feed-forward
    rope_theta: float = 10000.0  # rotary positions' base
    rope_scaling: dict | None = None  # rotary scaling (positional.py's ROPE_SCALINGS), as config.json gives it
    tie_head: bool = True  # the output head is the token embedding's weight; False: a head of its own
    norm_position: str = "pre"  # "pre" (x + f(norm(x)), final norms) or "post" (norm(x + f(x)), none: Marian's)
    sinusoid: str = "interleaved"  # the sinusoidal table's column layout: "interleaved" or "halves" (Marian's)
    logits_bias: bool = False  # a bias added to the logits (Marian's final_logits_bias)
    family: str = ""  # the Hugging Face model_type it was imported from ("gpt2", "llama", ...); "": attnserve's own

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}")
        if self.sinusoid not in SINUSOIDS:
            raise ValueError(f"sinusoid must be one of {SINUSOIDS}, got {self.sinusoid!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.arch == ENCODER_DECODER and self.n_encoder_layers < 1:
            raise ValueError("an encoder-decoder model needs n_encoder_layers >= 1")
        width = self.d_k if self.positional == "rotary" else self.d_model  # a row of its positional table
        if not 1 <= self.max_len <= MAX_POSITION_TABLE // width:
            raise ValueError(
                f"max_len ({self.max_len}) must be 1 to {MAX_POSITION_TABLE // width:,}: its positional table "
                f"of max_len x {width} is built whole"
            )

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: the cache holds these (B, kv_heads, S, d_k)."""
        return self.n_kv_heads or self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        return cls(**d)


# Presets: overrides of ModelConfig. `tiny` is for tests (trains in seconds); `small` is the default
# (1.06M parameters with the default 2048-id BPE: 1.445 bits per byte held out after `attnserve
# train`'s 180 s on 2 CPU cores; docs/reports/tokenizers.md, `make tokenizer-table`).
PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=128),
    "small": dict(d_model=128, n_heads=4, n_layers=4, d_ff=512, max_len=128),
    "numbers": dict(arch=ENCODER_DECODER, d_model=128, n_heads=4, n_layers=3, n_encoder_layers=3, d_ff=512, max_len=72),
    "tiny-seq2seq": dict(
        arch=ENCODER_DECODER, d_model=32, n_heads=2, n_layers=2, n_encoder_layers=2, d_ff=64, max_len=64
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The config of a named preset, with optional field overrides."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(ModelConfig(**PRESETS[name]), **overrides)
