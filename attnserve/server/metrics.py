"""Prometheus metrics of one server: requests by status, latencies, queue, batch, tokens, provider,
and the standard process_* metrics of the server's process.

Each server owns its registry (several servers can live in one process, as in the tests) and
serves it on --metrics-port. The engine reports through the EngineObserver hooks; the gRPC
boundary counts requests by method and status code.
"""

from __future__ import annotations

import os
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector, start_http_server
from prometheus_client.exposition import choose_encoder

from ..engine.domain import Final, GenerationRequest
from ..engine.engine import EngineObserver

# Buckets in seconds: tokens of a small model take well under a millisecond on a GPU.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
EXEMPLAR_CHARACTERS = 128  # OpenMetrics' limit on an exemplar's label names and values together
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics(EngineObserver):
    """The server's metrics; pass it to the Engine as its observer."""

    def __init__(self) -> None:
        self.counting = True  # the engine's reports count as traffic (off for the start-up warm-up)
        self.step_tokens = 0  # tokens the engine's steps produced (EOS included), for the stats log line
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attnserve_requests", "RPCs handled, by method and gRPC status code", ["method", "code"], registry=r
        )
        self.http_requests = Counter(
            "attnserve_http_requests",
            "OpenAI-compatible HTTP requests handled, by route and HTTP status",
            ["route", "status"],
            registry=r,
        )
        self.finished = Counter(
            "attnserve_generations_finished", "Generations that ended, by finish reason", ["reason"], registry=r
        )
        self.ttft = Histogram(
            "attnserve_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "attnserve_inter_token_latency_seconds",
            "Time between two tokens of one request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "attnserve_request_latency_seconds",
            "Arrival to the end of a generation",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("attnserve_generated_tokens", "Tokens generated (EOS not counted)", registry=r)
        self.prompt_tokens = Counter(
            "attnserve_prompt_tokens",
            "Prompt tokens of the generations that ended (a source's, for an encoder-decoder)",
            registry=r,
        )
        self.controls = Counter(
            "attnserve_request_controls",
            "Accepted requests that set a control (stop_token_ids, min_new_tokens, ignore_eos, logit_bias, priority, "
            "logprobs, prompt_logprobs, n, structured_output, beams)",
            ["control"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_*: the server's (front end's) CPU, memory, open files, start time
        self.queue_depth = Gauge("attnserve_queue_depth", "Requests waiting for a batch slot", registry=r)
        self.batch_size = Gauge("attnserve_batch_size", "Requests in the running batch", registry=r)
        self.in_flight = Gauge(
            "attnserve_requests_in_flight",
            "Calls of attnserve.v1, the inference protocol and /v1/completions in progress",
            registry=r,
        )
        self.kv_cache_bytes = Gauge(
            "attnserve_kv_cache_bytes", "Bytes of the preallocated key/value arena (0: concat cache)", registry=r
        )
        self.prefix_lookups = Counter(
            "attnserve_prefix_cache_lookups",
            "Prompts looked up in the prefix cache as their prefill began, by result (hit: a cached prefix was copied)",
            ["result"],
            registry=r,
        )
        self.prefix_saved = Counter(
            "attnserve_prefix_cache_saved_tokens",
            "Prompt tokens copied from the prefix cache, not prefilled",
            registry=r,
        )
        self.prefix_held = Gauge("attnserve_prefix_cache_bytes", "Bytes of prefixes the prefix cache holds", registry=r)
        self.draft_tokens = Counter(
            "attnserve_spec_decode_draft_tokens",
            "Ids proposed by speculative decoding (--speculative-config) and checked by the model",
            registry=r,
        )
        self.accepted_tokens = Counter(
            "attnserve_spec_decode_accepted_tokens",
            "Proposed ids the model's check kept (accepted / draft: the acceptance rate)",
            registry=r,
        )
        self.prefix_cache_capacity = Gauge(
            "attnserve_prefix_cache_capacity_bytes",
            "The prefix cache's size (--prefix-cache-memory; 0: off)",
            registry=r,
        )
        self.step_batch = Histogram(
            "attnserve_step_batch_size", "Batch size of each decode step", buckets=BATCH_BUCKETS, registry=r
        )
        self.core_memory = Gauge(
            "attnserve_engine_core_resident_bytes",
            "Resident memory of the engine core's process (the server's own with --engine-core thread)",
            registry=r,
        )
        self.spans_dropped = Counter(
            "attnserve_trace_spans_dropped",
            "Trace spans lost before the collector had them (the export queue was full, or the collector failed "
            "or did not answer), by the process that made them: front_end or engine_core",
            ["process"],
            registry=r,
        )
        self.model = Info("attnserve_model", "The served model and the execution provider it runs on", registry=r)
        self.http: WSGIServer | None = None  # the /metrics endpoint, once serve() has started it

    def watch_core(self, pid: int) -> None:
        """Report the resident memory of process `pid` (the engine core's) at every scrape."""
        self.core_memory.set_function(lambda: resident_bytes(pid))

    def describe_model(self, name: str, provider: str, dtype: str, quantization: str) -> None:
        self.model.info(
            {"model": name, "execution_provider": provider, "dtype": dtype, "quantization": quantization or "none"}
        )

    def count_request(self, method: str, code: str) -> None:
        self.requests.labels(method=method, code=code).inc()

    def count_http(self, route: str, status: int) -> None:
        self.http_requests.labels(route=route, status=str(status)).inc()

    def track_in_flight(self, change: int) -> None:
        self.in_flight.inc(change)

    def serve(self, host: str, port: int) -> int:
        """Start /metrics on host:port in a daemon thread; returns the bound port."""
        self.http, _ = start_http_server(port, addr=host, registry=self.registry)
        return self.http.server_port

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The registry as --metrics-port writes it for a scrape with this Accept header (OpenMetrics,
        with exemplars, where asked for): the HTTP door's /metrics. The body and its content type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def close(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None

    # ---- EngineObserver: traffic only (`counting` is off during the start-up warm-up) --
    def on_submit(self, request: GenerationRequest) -> None:
        if not self.counting:
            return
        for control in request.controls:
            self.controls.labels(control=control).inc()

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        if not self.counting:
            return
        self.batch_size.set(batch_size)
        self.queue_depth.set(queue_depth)
        if batch_size:
            self.step_batch.observe(batch_size)

    def on_tokens(self, first: list[float], inter: list[float]) -> None:
        if not self.counting:
            return
        self.step_tokens += len(first) + len(inter)
        for seconds in first:
            self.ttft.observe(seconds)
        for seconds in inter:
            self.itl.observe(seconds)

    def on_prefix_cache(self, hits: int, misses: int, saved: int, held_bytes: int) -> None:
        self.prefix_held.set(held_bytes)
        if not self.counting:
            return
        self.prefix_lookups.labels(result="hit").inc(hits)
        self.prefix_lookups.labels(result="miss").inc(misses)
        self.prefix_saved.inc(saved)

    def on_speculation(self, proposed: int, accepted: int) -> None:
        if not self.counting:
            return
        self.draft_tokens.inc(proposed)
        self.accepted_tokens.inc(accepted)

    def on_spans_dropped(self, count: int) -> None:
        self.spans_dropped.labels(process="engine_core").inc(count)

    def on_finish(self, final: Final, request: GenerationRequest | None = None) -> None:
        if not self.counting:
            return
        self.finished.labels(reason=final.reason.value).inc()
        self.e2e.observe(final.timings.total_ms / 1000.0, exemplar(request))
        self.tokens.inc(final.usage.completion_tokens)
        self.prompt_tokens.inc(final.usage.prompt_tokens)


def exemplar(request: GenerationRequest | None) -> dict[str, str] | None:
    """The request's ids as an OpenMetrics exemplar: its request id and, when traced, its trace id (the
    W3C traceparent's); the request id is left out where it would pass OpenMetrics' 128 characters."""
    if request is None:
        return None
    labels = {"trace_id": request.trace[3:35]} if request.trace else {}
    if len(request.request_id) + sum(len(k) + len(v) for k, v in labels.items()) + 10 <= EXEMPLAR_CHARACTERS:
        labels["request_id"] = request.request_id
    return labels or None


def resident_bytes(pid: int) -> float:
    """Resident memory of `pid` from /proc (Linux); 0 once it is gone, or without /proc."""
    try:
        return float(int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, IndexError, ValueError):
        return 0.0
