"""The server's configuration: one dataclass, built once from the command line, passed down whole.

Each setting is declared once, as a field: its type, its default, and in its metadata the help
of its `attnserve serve` flag (plus a parser or choices where the type alone is not enough).
add_cli_args builds the flags from the fields, as vLLM's EngineArgs.add_cli_args does, and
from_args builds the config back; nothing else writes a server default. No gRPC, no ONNX here.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..core.config import MAX_NICE, CoreConfig
from ..engine.ahead_rule import MODES as AHEAD_MODES
from ..engine.speculation import parse_speculation
from ..flags import add_field_flags, check_directory, check_pem, check_text_file, flag, flag_name, shown
from ..request_ranges import MAX_STREAM_INTERVAL_MS
from ..runtime.contract import DTYPES, QUANTIZATIONS
from ..tracing.settings import TraceSettings, trace_settings
from .checkpoint_exports import CACHE_VARIABLE, is_checkpoint

PROVIDERS = ("auto", "cuda", "cpu")
ENGINE_CORES = ("thread", "process")
PREFIX_CACHE = ("off", "on")
SPINNING = ("auto", "off", "on")
LOGITS_PASS = ("auto", "on", "off")
RUN_AHEAD = AHEAD_MODES
LOG_FORMATS = ("text", "json")
MAX_PORT = 65535
MAX_API_SERVERS = 64  # --api-server-count's bound
MAX_WAITING_STEPS = 1024  # --max-waiting-steps' bound: a request waits at most this many decode steps to start
MIN_CONTEXT_LENGTH = 8  # attnserve import's least --context-length (its MIN_CONTEXT)
MODEL_NAME = re.compile(r"[A-Za-z0-9._/-]{1,128}")  # --served-model-name: what fits a URL path and a label
UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}


def parse_bytes(text: str) -> int:
    """ "536870912", "512M", "1.5G" or "512Mi" (SI and binary suffixes, an optional B) as bytes."""
    body = text.strip().upper().removesuffix("B")
    number = body.rstrip("KMGI")
    unit = body[len(number) :]
    if unit not in UNITS:
        raise ValueError(f"{text!r} is not a size: use bytes or a K, M, G (or Ki, Mi, Gi) suffix")
    try:
        return int(float(number) * UNITS[unit])
    except ValueError:
        raise ValueError(f"{text!r} is not a size: use bytes or a K, M, G (or Ki, Mi, Gi) suffix") from None


def parse_max_batch(text: str) -> int:
    """--max-batch: a positive count, or "auto" (0) for as many slots as --kv-cache-memory holds."""
    if text.strip().lower() == "auto":
        return 0
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r}: give a number of requests (at least 1) or auto")
    return int(text)


@dataclass(frozen=True)
class ServerConfig:
    """One server's settings; every field with help is also an `attnserve serve` flag."""

    model: str = field(
        metadata=flag(
            "model directory written by `attnserve export`, e.g. models/NAME; or a Hugging Face checkpoint "
            "directory (GPT-2, Llama, Mistral, Qwen2, Marian: config.json, weights, tokenizer), imported and "
            "exported once into --export-cache, then served"
        )
    )
    dtype: str | None = field(
        default=None,
        metadata=flag(
            "for a Hugging Face checkpoint: the export's dtype, as attnserve export --dtype (an exported model "
            "directory keeps the one it was exported with)",
            choices=DTYPES,
            unset=DTYPES[0],
        ),
    )
    quantize: str | None = field(
        default=None,
        metadata=flag(
            "for a Hugging Face checkpoint: the export's weights, int8 or int4, as attnserve export --quantize",
            choices=QUANTIZATIONS,
        ),
    )
    context_length: int | None = field(
        default=None,
        metadata=flag(
            "for a Hugging Face checkpoint: serve at most N positions, fewer than it was trained for, so that "
            "the KV arena's slots are smaller (attnserve import --context-length; vLLM's max_model_len)",
            metavar="N",
            unset="the config's max_position_embeddings or n_positions",
        ),
    )
    export_cache: str | None = field(
        default=None,
        metadata=flag(
            "folder keeping the exports of Hugging Face checkpoints, one per checkpoint's files and export "
            "flags, so that the next start serves it at once",
            metavar="DIR",
            unset=f"${CACHE_VARIABLE}, else ~/.cache/attnserve ($XDG_CACHE_HOME/attnserve if set)",
        ),
    )
    served_model_name: str | None = field(
        default=None,
        metadata=flag(
            "the model's name in GetModelInfo, the Open Inference Protocol (requests must name it) and the "
            "metrics' model label",
            metavar="NAME",
            unset="the directory's name",
        ),
    )
    host: str = field(default="127.0.0.1", metadata=flag("interface to listen on; 0.0.0.0 for all"))
    port: int = field(default=50051, metadata=flag("gRPC port; 0 picks a free one and prints it"))
    provider: str = field(
        default="auto",
        metadata=flag(
            "ONNX Runtime execution provider; auto takes CUDA only if a session really runs on it", choices=PROVIDERS
        ),
    )
    threads: int = field(
        default=0,
        metadata=flag(
            "ONNX Runtime intra-op threads; 0: every core for a model of 32 MiB or more (graphs and weights), "
            "all cores but one (left to the gRPC front end) for a smaller one"
        ),
    )
    core_nice: int = field(
        default=0,
        metadata=flag(
            "how much lower the engine core process's CPU priority is than the front end's (Unix nice, 0 to "
            "19): on CPUs that are short under overload, the front end, which admits, refuses and streams "
            "every call, runs first and the core takes the rest; 0: the same priority. Ignored with "
            "--engine-core thread"
        ),
    )
    intra_op_spinning: str = field(
        default="auto",
        metadata=flag(
            "on: ONNX Runtime's idle intra-op threads spin between a run's parallel nodes instead of sleeping "
            "(faster steps with 2 threads or more, cores kept busy while a step runs), and sleep once it returns; "
            "off: they sleep; auto: on for a model of 32 MiB or more",
            choices=SPINNING,
        ),
    )
    no_cuda_graphs: bool = field(
        default=False,
        metadata=flag(
            "on CUDA, launch decode steps node by node instead of replaying them as CUDA graphs (one per batch "
            "size, captured at its first steps; 1.6-2.9x faster steps on an H100)"
        ),
    )
    logits_pass: str = field(
        default="auto",
        metadata=flag(
            "where a decode step's sampled, logprobs and banned-id rows are picked: on, in one batched pass on "
            "the model's device (a small ONNX graph over the step's logits, where they are); off, each row on "
            "the host in numpy; auto: on CUDA every row in the pass, on the CPU the rows whose host work costs "
            "more, where together they pay for a run (a large vocabulary's sampling and logprobs rows, a few at once), "
            "a row the pass could not pick on the host for "
            "the next 16 steps",
            choices=LOGITS_PASS,
        ),
    )
    run_ahead: str = field(
        default="auto",
        metadata=flag(
            "run-ahead decoding: while every request decodes in a burst (greedy, or drawn: sampling, logprobs), "
            "the next decode step runs on a thread of its "
            "own while the engine takes the last step's tokens (their text, stops and events), one step ahead "
            "(a request that ends never shows the extra token); on, off, or auto: where the engine takes a token "
            "a step or more (streams at interval 1, not unary calls) and its thread has a core to itself on the CPU "
            "(--threads at most the cores less 2; never on a GPU, where it measured no gain)",
            choices=RUN_AHEAD,
        ),
    )
    speculative_config: str | None = field(
        default=None,
        metadata=flag(
            'speculative decoding, as vLLM\'s JSON: \'{"method": "ngram", "num_speculative_tokens": 4, '
            '"prompt_lookup_max": 4, "prompt_lookup_min": 1, "disable_by_batch_size": 1}\' (prompt lookup: a '
            "request's next ids proposed from its prompt and output, checked in one run, the right ones kept; "
            "the same tokens, greedy or seeded, in fewer steps where the output repeats its context), or "
            '\'{"model": DIR, "num_speculative_tokens": 4}\' (a draft model: an exported model directory with '
            "the same tokenizer proposes by its greedy steps)",
            metavar="JSON",
            unset="off",
        ),
    )
    engine_core: str = field(
        default="process",
        metadata=flag(
            "where the engine runs: process (a process of its own beside the gRPC front end: neither waits "
            "for the other's GIL) or thread (in the server's process)",
            choices=ENGINE_CORES,
        ),
    )
    api_server_count: int = field(
        default=1,
        metadata=flag(
            "front-end processes over the one engine core (vLLM's flag): each serves the gRPC port (and "
            "--http-port) through SO_REUSEPORT, the kernel spreading connections over them; front end i serves "
            "its metrics on --metrics-port + i (docs/guides/serving.md)",
            metavar="N",
        ),
    )
    max_batch: int = field(
        default=16,
        metadata=flag(
            "requests decoded together, one KV arena slot each; auto: as many as --kv-cache-memory holds",
            type=parse_max_batch,
            metavar="N|auto",
        ),
    )
    kv_cache_memory: int | None = field(
        default=None,
        metadata=flag(
            "cap on the KV arena's size, e.g. 512M or 2Gi; a --max-batch that does not fit is refused at start-up",
            type=parse_bytes,
            metavar="BYTES",
            unset="no cap",
        ),
    )
    prefix_cache: str = field(
        default="on",
        metadata=flag(
            "automatic prefix caching: a prompt whose first 16-token blocks were prefilled before gets "
            "their keys and values copied into its slot and prefills only the rest (off for an "
            "encoder-decoder); on is as fast without shared prefixes and far faster with them",
            choices=PREFIX_CACHE,
        ),
    )
    prefix_cache_memory: int | None = field(
        default=None,
        metadata=flag(
            "bytes of cached prefixes, e.g. 256M, least recently used evicted first; refused at start-up "
            "when it holds no block or the device has not that much free",
            type=parse_bytes,
            metavar="BYTES",
            unset="as large as the KV arena",
        ),
    )
    prefill_chunk: int = field(
        default=256,
        metadata=flag(
            "prompt tokens per prefill run; longer prompts are prefilled in chunks between decode "
            "steps, so one delays the running batch by at most a chunk"
        ),
    )
    max_waiting_steps: int = field(
        default=0,
        metadata=flag(
            "while requests decode, one that could start waits up to this many decode steps, so that arrivals "
            "are prefilled together (one pause of the running batch for several), less once as many wait as "
            "decode; 0: each starts at the next step (TGI's --max-waiting-tokens)"
        ),
    )
    stream_interval_tokens: int = field(
        default=1,
        metadata=flag(
            "streams send a message once this many tokens wait (after the first, sent at once), or once "
            "--stream-interval-ms has passed, whichever first; requests may set their own"
        ),
    )
    stream_interval_ms: int = field(
        default=0,
        metadata=flag("streams send waiting tokens once this many milliseconds have passed; 0: no time bound"),
    )
    max_queue: int = field(default=64, metadata=flag("requests waiting for a batch slot before RESOURCE_EXHAUSTED"))
    stream_buffer_events: int = field(
        default=64,
        metadata=flag(
            "decoded events a stream may leave unwritten (its client having read nothing for a second) before "
            "its request is cancelled, freeing its batch slot"
        ),
    )
    write_timeout: float = field(
        default=30.0,
        metadata=flag("seconds a stream's write may wait for a client that reads nothing before it is cancelled"),
    )
    max_concurrent_streams: int = field(
        default=1024,
        metadata=flag("calls one client connection may have open at once (HTTP/2 streams); more wait client-side"),
    )
    max_connection_age: float | None = field(
        default=None,
        metadata=flag(
            "seconds after which a connection is asked to go away (GOAWAY; its calls get "
            "--drain-timeout to finish): clients reconnect and spread over replicas",
            unset="off",
        ),
    )
    max_new_tokens_cap: int = field(
        default=256, metadata=flag("largest max_new_tokens a request may ask for, at most context length - 1")
    )
    log_stats_interval: float = field(
        default=10.0,
        metadata=flag(
            "seconds between log lines of throughput (prompt and generated tokens/s), batch and queue, "
            "written while there is traffic; 0: off"
        ),
    )
    log_format: str = field(
        default="text",
        metadata=flag(
            "how the server and its engine core write their log lines: text, for people, or json, one JSON "
            "object per line (time, level, logger, message, request_id, trace_id), for log collectors",
            choices=LOG_FORMATS,
        ),
    )
    log_requests: bool = field(
        default=False,
        metadata=flag(
            "one INFO line per finished request at every door (logger attnserve.requests): its request id, "
            "status, prompt and completion tokens, finish reasons and time"
        ),
    )
    metrics_port: int | None = field(
        default=None, metadata=flag("serve Prometheus /metrics on this port; 0 picks a free one", unset="off")
    )
    http_port: int | None = field(
        default=None,
        metadata=flag(
            "also serve the OpenAI-compatible HTTP API (/v1/completions, /v1/models, /health) on this port, "
            "with the same TLS and token; 0 picks a free one",
            unset="off",
        ),
    )
    http_max_body_bytes: int = field(
        default=4 * 2**20,  # gRPC's default largest received message
        metadata=flag(
            "largest request body the HTTP API reads, e.g. 4Mi or 16M (as gRPC's 4 MiB message limit); a larger "
            "one is refused with 413 before it is read whole",
            type=parse_bytes,
            metavar="BYTES",
        ),
    )
    otlp_traces_endpoint: str | None = field(
        default=None,
        metadata=flag(
            "send OpenTelemetry traces of every request (its door's span and the engine core's) to this OTLP "
            "collector, e.g. http://127.0.0.1:4317 (gRPC) or http://127.0.0.1:4318/v1/traces (HTTP); the "
            "standard OTEL_* variables also work (docs/guides/tracing.md)",
            metavar="URL",
            unset="off, unless OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set",
        ),
    )
    reflection: bool = field(default=False, metadata=flag("enable gRPC server reflection, for grpcurl and friends"))
    tls_cert: str | None = field(
        default=None, metadata=flag("PEM certificate chain: TLS, with --tls-key", unset="plaintext")
    )
    tls_key: str | None = field(default=None, metadata=flag("PEM private key"))
    tls_client_ca: str | None = field(
        default=None, metadata=flag("PEM CA bundle: require client certificates (mTLS)", unset="no client certificates")
    )
    auth_token_file: str | None = field(
        default=None,
        metadata=flag("file with the bearer token clients must send; health checks are exempt", unset="no auth"),
    )
    drain_timeout: float = field(default=30.0, metadata=flag("seconds in-flight requests get to finish after SIGTERM"))
    warmup: bool = True  # one short generation before health says SERVING; no flag, for code embedding a Server

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """`attnserve serve`'s flags, from the fields: --name, type, default and help each written once."""
        add_field_flags(parser, cls)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """From add_cli_args' namespace."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if "help" in f.metadata}
        return cls(**values)

    def core(self) -> CoreConfig:
        """The engine core's share, as the core reads it."""
        return CoreConfig(
            model=self.model,
            provider=self.provider,
            threads=self.threads,
            nice=self.core_nice,
            intra_op_spinning=self.intra_op_spinning,
            cuda_graphs=not self.no_cuda_graphs,
            logits_pass=self.logits_pass,
            run_ahead=self.run_ahead,
            max_waiting_steps=self.max_waiting_steps,
            speculation=parse_speculation(self.speculative_config) if self.speculative_config is not None else None,
            max_batch=self.max_batch,
            kv_cache_memory=self.kv_cache_memory,
            prefill_chunk=self.prefill_chunk,
            prefix_cache=self.prefix_cache == "on",
            prefix_cache_memory=self.prefix_cache_memory,
            max_queue=self.max_queue,
            engine_core=self.engine_core,
            front_ends=self.api_server_count,
            traces=self.traces(),
            log_format=self.log_format,
        )

    def traces(self) -> TraceSettings | None:
        """Where traces go: --otlp-traces-endpoint, or the OTEL_* variables (None: off); ValueError naming
        the flag or the variable that is wrong."""
        return trace_settings(self.otlp_traces_endpoint, os.environ)

    def check(self) -> None:
        """Raise ValueError with a one-line reason naming the first flag that cannot work, its value
        and what it may be. Values only: the files are check_files'."""
        known = f"{', '.join(PROVIDERS[:-1])} or {PROVIDERS[-1]}"
        together = [
            ((self.tls_cert is None) == (self.tls_key is None), "--tls-cert and --tls-key go together"),
            (not self.tls_client_ca or bool(self.tls_cert), "--tls-client-ca needs --tls-cert and --tls-key"),
            (self.provider in PROVIDERS, f"--provider must be {known}, not {self.provider!r}"),
            (self.engine_core in ENGINE_CORES, f"--engine-core must be thread or process, not {self.engine_core!r}"),
            (
                self.api_server_count == 1 or self.engine_core == "process",
                f"--api-server-count {self.api_server_count} needs --engine-core process: the front ends share "
                "one engine core of its own",
            ),
            (self.prefix_cache in PREFIX_CACHE, f"--prefix-cache must be off or on, not {self.prefix_cache!r}"),
            (
                self.intra_op_spinning in SPINNING,
                f"--intra-op-spinning must be auto, off or on, not {self.intra_op_spinning!r}",
            ),
            (self.run_ahead in RUN_AHEAD, f"--run-ahead must be auto, on or off, not {self.run_ahead!r}"),
            (self.log_format in LOG_FORMATS, f"--log-format must be text or json, not {self.log_format!r}"),
            (self.dtype in (None, *DTYPES), f"--dtype must be {', '.join(DTYPES)}, not {self.dtype!r}"),
            (
                self.quantize in (None, *QUANTIZATIONS),
                f"--quantize must be {' or '.join(QUANTIZATIONS)}, not {self.quantize!r}",
            ),
            (
                self.served_model_name is None or MODEL_NAME.fullmatch(self.served_model_name) is not None,
                f"--served-model-name must be 1 to 128 letters, digits, '.', '_', '-' or '/', "
                f"not {self.served_model_name!r}",
            ),
        ]
        for ok, reason in together:
            if not ok:
                raise ValueError(reason)
        self.traces()
        if self.speculative_config is not None:
            parse_speculation(self.speculative_config)
        at_least_1 = (
            "max_queue",
            "max_new_tokens_cap",
            "prefill_chunk",
            "stream_interval_tokens",
            "stream_buffer_events",
            "max_concurrent_streams",
        )
        more = max(0, self.api_server_count - 1)  # front ends beside the first, each on its own metrics port
        last_metrics_port = MAX_PORT - more
        ranges: list[tuple[str, bool, str]] = [
            ("port", 0 <= self.port <= MAX_PORT, f"0 to {MAX_PORT}"),
            (
                "metrics_port",
                self.metrics_port is None or 0 <= self.metrics_port <= last_metrics_port,
                f"0 to {last_metrics_port}"
                + (f" (with --api-server-count {self.api_server_count}, front end i serves on it + i)" if more else ""),
            ),
            ("http_port", self.http_port is None or 0 <= self.http_port <= MAX_PORT, f"0 to {MAX_PORT}"),
            ("threads", self.threads >= 0, "0 or more (0: chosen by the model's size)"),
            ("core_nice", 0 <= self.core_nice <= MAX_NICE, f"0 to {MAX_NICE}"),
            ("api_server_count", 1 <= self.api_server_count <= MAX_API_SERVERS, f"1 to {MAX_API_SERVERS}"),
            (
                "context_length",
                self.context_length is None or self.context_length >= MIN_CONTEXT_LENGTH,
                f"at least {MIN_CONTEXT_LENGTH}",
            ),
            ("max_batch", self.max_batch >= 0, "at least 1, or auto"),
            ("max_waiting_steps", 0 <= self.max_waiting_steps <= MAX_WAITING_STEPS, f"0 to {MAX_WAITING_STEPS}"),
            ("kv_cache_memory", self.kv_cache_memory is None or self.kv_cache_memory >= 1, "at least 1 (bytes)"),
            ("http_max_body_bytes", self.http_max_body_bytes >= 1, "at least 1 (bytes)"),
            (
                "prefix_cache_memory",
                self.prefix_cache_memory is None or self.prefix_cache_memory >= 1,
                "at least 1 (bytes)",
            ),
            (
                "stream_interval_ms",
                0 <= self.stream_interval_ms <= MAX_STREAM_INTERVAL_MS,
                f"0 to {MAX_STREAM_INTERVAL_MS}",
            ),
            *((name, getattr(self, name) >= 1, "at least 1") for name in at_least_1),
            ("write_timeout", self.write_timeout > 0, "positive"),
            ("max_connection_age", self.max_connection_age is None or self.max_connection_age > 0, "positive"),
            ("drain_timeout", self.drain_timeout >= 0, "0 or more"),
            ("log_stats_interval", self.log_stats_interval >= 0, "0 or more (0: off)"),
        ]
        for name, ok, allowed in ranges:
            if not ok:
                raise ValueError(f"{flag_name(name)} must be {allowed}, got {shown(getattr(self, name))}")

    def check_files(self) -> None:
        """Raise ValueError naming the flag whose file or directory is not here or not readable (TLS
        files must be PEM, the token file not empty): found before the model loads. Apart from check(),
        which also judges configurations meant for another machine (the Kubernetes manifests)."""
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            check_pem(flag_name(name), getattr(self, name))
        check_text_file("--auth-token-file", self.auth_token_file)
        if not Path(self.model).is_dir():
            raise ValueError(f"--model {self.model}: no such directory")
        if self.export_cache:
            check_directory("--export-cache", self.export_cache)
        export_flags = [
            f"{flag_name(name)} {getattr(self, name)}"
            for name in ("dtype", "quantize", "context_length")
            if getattr(self, name)
        ]
        if export_flags and not is_checkpoint(self.model):
            raise ValueError(
                f"{export_flags[0]} is for a Hugging Face checkpoint directory (config.json); {self.model} is an "
                "exported model directory, served as it was exported (attnserve export makes another)"
            )
