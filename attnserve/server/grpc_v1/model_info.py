"""GetModelInfo's answer, built once at start-up: the model, its execution provider, the server's limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from ...runtime.contract import Manifest
from ...tokenizer import Tokenizer
from ...v1 import generation_pb2 as pb
from ..session.validation import RequestLimits


@dataclass(frozen=True)
class ModelFacts:
    """What GetModelInfo tells of the model: its directory, its manifest, the provider its session got."""

    model_dir: Path
    manifest: Manifest
    provider: str
    provider_note: str = ""  # why the session is not on the provider asked for (--provider auto's fallback)
    served_name: str | None = None  # --served-model-name

    @property
    def name(self) -> str:
        """The name clients see: --served-model-name, or the directory's."""
        return self.served_name or self.model_dir.resolve().name


def model_info(
    facts: ModelFacts,
    tokenizer: Tokenizer,
    limits: RequestLimits,
    max_batch: int,
    max_queue: int,
    kv_cache_bytes: int,
    prefix_cache_bytes: int,
) -> pb.ModelInfo:
    """GetModelInfo's answer, built once at start-up."""
    m = facts.manifest
    return pb.ModelInfo(
        model_name=facts.name,
        architecture=m.architecture,
        vocab_size=m.vocab_size,
        d_model=m.d_model,
        n_heads=m.n_heads,
        n_layers=m.n_layers,
        n_encoder_layers=m.n_encoder_layers,
        head_dim=m.head_dim,
        context_length=m.context_length,
        dtype=m.dtype,
        quantization=m.quantization or "",
        execution_provider=f"{facts.provider} ({facts.provider_note})" if facts.provider_note else facts.provider,
        kv_cache=m.kv_cache,
        kv_cache_bytes=kv_cache_bytes,
        prefix_cache_bytes=prefix_cache_bytes,
        limits=pb.Limits(
            max_new_tokens=limits.max_new_tokens,
            max_prompt_tokens=limits.max_prompt_tokens,
            max_batch_size=max_batch,
            max_queue_size=max_queue,
            max_stop_sequences=limits.max_stop_sequences,
            max_stop_bytes=limits.max_stop_bytes,
            stream_interval_tokens=limits.stream_interval.tokens,
            stream_interval_ms=limits.stream_interval.ms,
            max_stop_token_ids=limits.max_stop_token_ids,
            max_logit_bias=limits.max_logit_bias,
            max_logprobs=limits.max_logprobs,
            max_n=limits.max_n,
            max_structure_bytes=limits.max_structure_bytes,
        ),
        tokenizer=pb.TokenizerInfo(
            kind=tokenizer.kind,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            vocab_size=tokenizer.vocab_size,
            bos_prepended=tokenizer.add_bos,
        ),
        server_version=__version__,
    )
