from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop", "request_id", "prompt_token_ids", "stream_interval_tokens", "stream_interval_ms", "stop_token_ids", "min_new_tokens", "ignore_eos", "logit_bias", "priority", "logprobs", "prompt_logprobs", "n", "structured_output", "num_beams", "length_penalty", "early_stopping", "num_return_sequences", "min_p", "presence_penalty", "frequency_penalty")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    NUM_BEAMS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stream_interval_tokens: int
    stream_interval_ms: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_new_tokens: int
    ignore_eos: bool
    logit_bias: _containers.ScalarMap[int, float]
    priority: int
    logprobs: int
    prompt_logprobs: int
    n: int
    structured_output: StructuredOutput
    num_beams: int
    length_penalty: float
    early_stopping: str
    num_return_sequences: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, prompt: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., stream_interval_tokens: _Optional[int] = ..., stream_interval_ms: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., min_new_tokens: _Optional[int] = ..., ignore_eos: bool = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., priority: _Optional[int] = ..., logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., n: _Optional[int] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., num_beams: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[str] = ..., num_return_sequences: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "regex")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("index", "text", "token_ids", "finish_reason", "completion_tokens", "logprobs", "score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    completion_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    score: float
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., completion_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., score: _Optional[float] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "text")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    text: str
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "text", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    text: str
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., text: _Optional[str] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "time_to_first_token_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "timings", "logprobs", "prompt_logprobs", "completions", "score")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    score: float
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., score: _Optional[float] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "timings", "logprobs", "prompt_logprobs", "index", "score")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    index: int
    score: float
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_new_tokens", "max_prompt_tokens", "max_batch_size", "max_queue_size", "max_stop_sequences", "max_stop_bytes", "stream_interval_tokens", "stream_interval_ms", "max_stop_token_ids", "max_logit_bias", "max_logprobs", "max_n", "max_structure_bytes")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    MAX_STRUCTURE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    max_prompt_tokens: int
    max_batch_size: int
    max_queue_size: int
    max_stop_sequences: int
    max_stop_bytes: int
    stream_interval_tokens: int
    stream_interval_ms: int
    max_stop_token_ids: int
    max_logit_bias: int
    max_logprobs: int
    max_n: int
    max_structure_bytes: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., max_stop_sequences: _Optional[int] = ..., max_stop_bytes: _Optional[int] = ..., stream_interval_tokens: _Optional[int] = ..., stream_interval_ms: _Optional[int] = ..., max_stop_token_ids: _Optional[int] = ..., max_logit_bias: _Optional[int] = ..., max_logprobs: _Optional[int] = ..., max_n: _Optional[int] = ..., max_structure_bytes: _Optional[int] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("kind", "bos_id", "eos_id", "pad_id", "vocab_size", "bos_prepended")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BOS_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOS_PREPENDED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int
    bos_prepended: bool
    def __init__(self, kind: _Optional[str] = ..., bos_id: _Optional[int] = ..., eos_id: _Optional[int] = ..., pad_id: _Optional[int] = ..., vocab_size: _Optional[int] = ..., bos_prepended: bool = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_name", "architecture", "vocab_size", "d_model", "n_heads", "n_layers", "head_dim", "context_length", "dtype", "quantization", "execution_provider", "limits", "tokenizer", "server_version", "n_encoder_layers", "kv_cache", "kv_cache_bytes", "prefix_cache_bytes")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    D_MODEL_FIELD_NUMBER: _ClassVar[int]
    N_HEADS_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    N_ENCODER_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    architecture: str
    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    head_dim: int
    context_length: int
    dtype: str
    quantization: str
    execution_provider: str
    limits: Limits
    tokenizer: TokenizerInfo
    server_version: str
    n_encoder_layers: int
    kv_cache: str
    kv_cache_bytes: int
    prefix_cache_bytes: int
    def __init__(self, model_name: _Optional[str] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ..., d_model: _Optional[int] = ..., n_heads: _Optional[int] = ..., n_layers: _Optional[int] = ..., head_dim: _Optional[int] = ..., context_length: _Optional[int] = ..., dtype: _Optional[str] = ..., quantization: _Optional[str] = ..., execution_provider: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., server_version: _Optional[str] = ..., n_encoder_layers: _Optional[int] = ..., kv_cache: _Optional[str] = ..., kv_cache_bytes: _Optional[int] = ..., prefix_cache_bytes: _Optional[int] = ...) -> None: ...
