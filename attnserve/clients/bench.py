"""`attnserve bench`: drive a server like vLLM's `bench serve` or NVIDIA's perf_analyzer.

Warm-up requests first (not measured), then one level per concurrency (closed loop: N
requests, C in flight) and per --rate (open loop: N requests with Poisson arrivals). Every
request streams, so the client times the first token, each token after it and the whole
request; tokens are counted as they arrive and checked against the server's usage, and the
text's UTF-8 bytes are counted too, since tokens/s of models with different tokenizers do
not compare. Requests are not retried, so every failure shows in the errors by status code.

Prompts are exactly --prompt-tokens token ids whatever the tokenizer (drawn from the
vocabulary GetModelInfo reports, less BOS/EOS/PAD), as vLLM's random data set is; with
--prompt-text, ASCII text cut from PASSAGE, --prompt-tokens long for the byte tokenizer (BOS +
bytes; a BPE tokenizer makes fewer tokens of it, which the server's usage counts).

The server is attnserve over attnserve.v1 (AttnserveBackend, here), or with --backend openai any
OpenAI-compatible server over HTTP (bench_openai.py: text prompts, its chunks timed as vLLM's
`bench serve` times them); both are driven through the same loops into the same report.

Output: progress on stderr; the table, then the JSON report as one line (always the last line
of stdout), on stdout; --out writes the same JSON to a file, --plot a PNG. Statistics, table
and plot live in bench_report.py, the flags and outputs in bench_cli.py.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from ..flags import flag, flag_name, shown
from .aio import AsyncClient
from .bench_mix import MIXES, Kind, assign, check_sampling, kinds_for, summary
from .bench_openai import ENDPOINTS, OpenAIBackend
from .bench_prompts import make_prompts, make_token_prompts
from .bench_report import RequestRecord, summarize_level
from .channel import DEFAULT_TARGET, TlsConfig
from .errors import AttnserveError, InvalidArgument
from .retry import NO_RETRY
from .types import GenerationParams, ModelInfo, Prompt, TokenizerInfo

PROG = "attnserve bench"
ATTNSERVE, OPENAI = "attnserve", "openai"  # --backend: attnserve.v1 over gRPC, or an OpenAI-compatible URL
BACKENDS = (ATTNSERVE, OPENAI)
OWN_CONNECTION = "grpc.use_local_subchannel_pool"  # a channel argument: this channel's connection is its own
DEFAULT_URL = "http://127.0.0.1:8000/v1"  # --target of --backend openai when none is given


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run, as the command line describes it; fields with help are `attnserve bench` flags."""

    target: str = DEFAULT_TARGET  # HOST:PORT (several, comma-separated), or --backend openai's URL
    backend: str = field(
        default=ATTNSERVE,
        metadata=flag(
            "what --target speaks: attnserve (attnserve.v1 over gRPC) or openai (an OpenAI-compatible HTTP "
            f"server such as vLLM, llama.cpp's, TGI or attnserve's --http-port, its URL the --target, default "
            f"{DEFAULT_URL}; prompts are text)",
            choices=BACKENDS,
        ),
    )
    endpoint: str = field(
        default=ENDPOINTS[0],
        metadata=flag(
            "--backend openai: the route each request streams from: completions (/v1/completions) or chat "
            "(/v1/chat/completions, the prompt as one user message)",
            choices=ENDPOINTS,
        ),
    )
    model: str | None = field(
        default=None,
        metadata=flag(
            "--backend openai: the model each request names (one /v1/models lists)",
            metavar="NAME",
            unset="the first /v1/models lists",
        ),
    )
    connections: int = field(
        default=1,
        metadata=flag(
            "--backend attnserve: gRPC channels, each its own TCP connection, the requests take in turn (a "
            "server with --api-server-count spreads connections, not requests, over its front ends)",
            metavar="N",
        ),
    )
    concurrency: tuple[int, ...] = (1, 4, 16)  # closed-loop levels (without --concurrency, none with --rate)
    rates: tuple[float, ...] = ()  # open-loop levels, requests per second
    requests: int = field(default=32, metadata=flag("requests per level"))
    prompt_tokens: int = field(
        default=32,
        metadata=flag(
            "prompt length in tokens: exact token ids; with --prompt-text, text of N - 1 ASCII bytes, N tokens "
            "with the byte tokenizer's BOS, fewer with BPE (the report's prompt_tokens counts them)",
            metavar="N",
        ),
    )
    prompt_ids: bool = True  # prompts as random token ids; False: text (--prompt-text)
    max_new_tokens: int = field(default=64, metadata=flag("tokens to generate per request", metavar="N"))
    ignore_eos: bool = field(
        default=False, metadata=flag("requests never generate EOS: each one produces --max-new-tokens tokens")
    )
    warmup: int = field(default=2, metadata=flag("warm-up requests before measuring", metavar="N"))
    seed: int = field(default=0, metadata=flag("seed of the prompts (each level's its own) and the arrival times"))
    trace: bool = field(
        default=False,
        metadata=flag(
            "send each request as a trace of its own (a sampled W3C traceparent with a random trace id): a "
            "server with --otlp-traces-endpoint then continues it"
        ),
    )
    mix: str | None = field(
        default=None,
        metadata=flag(
            "send a mix of request kinds instead of one: production is 70%% temperature 0.7 with top_p 0.9, "
            "20%% greedy, 10%% greedy with logprobs 5 (each request's kind drawn from --seed)",
            unset="every request decodes as the sampling flags say",
            choices=sorted(MIXES),
        ),
    )
    # The sampling flags given (GenerationParams' fields unlike their defaults): every request's, without --mix
    sampling: tuple[tuple[str, Any], ...] = ()
    timeout: float = 300.0  # deadline of each request, seconds (--timeout)
    stream_interval_tokens: int | None = None  # None: the server's (GenerationParams' flags)
    stream_interval_ms: int | None = None

    def check(self) -> None:
        """Raise ValueError naming the flag that cannot work."""
        if not self.concurrency and not self.rates:
            raise ValueError("nothing to measure: give --concurrency and/or --rate")
        if self.concurrency and min(self.concurrency) < 1:
            raise ValueError(f"--concurrency levels must be at least 1, got {min(self.concurrency)}")
        if self.rates and min(self.rates) <= 0:
            raise ValueError(f"--rate levels must be positive, got {shown(min(self.rates))}")
        for name in ("requests", "max_new_tokens", "connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag_name(name)} must be at least 1, got {getattr(self, name)}")
        if self.prompt_tokens < (1 if self.prompt_ids else 2):
            raise ValueError(
                "--prompt-tokens must be at least 1, or 2 with --prompt-text (BOS and one byte), "
                f"got {self.prompt_tokens}"
            )
        if self.warmup < 0:
            raise ValueError(f"--warmup must not be negative, got {self.warmup}")
        if self.stream_interval_tokens is not None and self.stream_interval_tokens < 1:
            raise ValueError(f"--stream-interval-tokens must be at least 1, got {self.stream_interval_tokens}")
        if self.stream_interval_ms is not None and self.stream_interval_ms < 0:
            raise ValueError(f"--stream-interval-ms must not be negative, got {self.stream_interval_ms}")
        check_sampling(self.mix, self.sampling)
        self.check_backend()

    def check_backend(self) -> None:
        """The flags that go with one --backend only."""
        if self.backend == OPENAI and self.prompt_ids:
            raise ValueError(
                "--prompt-ids needs the server's vocabulary, which an OpenAI-compatible server does not report: "
                "--backend openai sends --prompt-text"
            )
        openai_only = {"endpoint": self.endpoint != ENDPOINTS[0], "model": self.model is not None}
        for name, given in openai_only.items():
            if given and self.backend != OPENAI:
                raise ValueError(f"{flag_name(name)} is for --backend openai")
        if self.connections != 1 and self.backend == OPENAI:
            raise ValueError("--connections is for --backend attnserve (--backend openai opens one per stream)")

    def kinds(self) -> tuple[Kind, ...]:
        """The kinds of request the run sends: the mix's, or one of the sampling flags."""
        return kinds_for(self.mix, dict(self.sampling))

    def params(self, kind: Kind, seed: int) -> GenerationParams:
        """What a request of `kind` decodes with: its sampling fields (and `seed` if it samples),
        max_new_tokens (ignore_eos), the stream interval."""
        return GenerationParams(
            max_new_tokens=self.max_new_tokens,
            ignore_eos=self.ignore_eos,
            stream_interval_tokens=self.stream_interval_tokens,
            stream_interval_ms=self.stream_interval_ms,
            seed=seed if kind.sampled else None,
            **kind.sampling,
        )

    def requests_of(self, prompts: Sequence[Prompt], seed: int) -> list[Request]:
        """Each prompt with what it decodes with: its kind drawn from `seed`, a seed of its own."""
        rng = random.Random(seed)
        kinds = assign(self.kinds(), len(prompts), seed)
        return [Request(p, self.params(k, rng.getrandbits(63)), k.name) for p, k in zip(prompts, kinds)]


@dataclass(frozen=True)
class Request:
    """One request of a run: its prompt, what it decodes with, and its kind's name."""

    prompt: Prompt
    params: GenerationParams
    kind: str


def prompts_for(config: BenchConfig, info: ModelInfo, count: int, seed: int) -> Sequence[Prompt]:
    """The prompts of one pass: token ids, or text with --prompt-text."""
    if config.prompt_ids:
        return make_token_prompts(count, config.prompt_tokens, seed, info.tokenizer)
    return make_prompts(count, config.prompt_tokens, seed)


def describe_prompts(config: BenchConfig, tokenizer: TokenizerInfo) -> str:
    """What the report's prompt lengths mean for this run's prompts and tokenizer."""
    if config.prompt_ids:
        return (
            f"token ids: exactly {config.prompt_tokens} per request, drawn from the "
            f"tokenizer's {tokenizer.vocab_size} ids less BOS/EOS/PAD"
        )
    text = f"text: {config.prompt_tokens - 1} ASCII bytes per request"
    if tokenizer.kind == "bytes":
        return f"{text}, {config.prompt_tokens} tokens with BOS"
    return (
        f"{text}: --prompt-tokens is the byte tokenizer's length; this {tokenizer.kind} "
        f"tokenizer makes fewer tokens, as each level's prompt_tokens (the server's usage) "
        f"counts; without --prompt-text, prompts are exact lengths of token ids"
    )


class Progress:
    """Requests done per level, on stderr: one updating line on a terminal, else one per level."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.label, self.total, self.done, self.failed = "", 0, 0, 0

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.failed = label, total, 0, 0
        self._show()

    def tick(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += not record.ok
        if self.tty or self.done == self.total:
            self._show()

    def _show(self) -> None:
        line = f"[{PROG}] {self.label}: {self.done}/{self.total} requests, {self.failed} failed"
        end = "\n" if self.done == self.total and self.total else ""
        if self.tty:
            self.out.write("\r\x1b[2K" + line + end)
        elif end or not self.done:
            self.out.write(line + "\n")
        self.out.flush()


def new_traceparent() -> str:
    """A sampled W3C traceparent that starts a trace: random trace and parent ids."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


class Backend(Protocol):
    """A server as the run drives it (AttnserveBackend, bench_openai.OpenAIBackend)."""

    async def __aenter__(self) -> Backend: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def describe(self) -> dict[str, Any]:
        """The report's "model"; raises what makes the run impossible."""

    def prompts(self, count: int, seed: int) -> Sequence[Prompt]:
        """`count` prompts drawn from `seed`."""

    def prompt_note(self) -> str:
        """What the report's prompt lengths mean for these prompts."""

    async def measure(self, request: Request, traceparent: str) -> RequestRecord:
        """Stream one request and time it; a failure is recorded, not raised."""


class AttnserveBackend:
    """An attnserve server over attnserve.v1 (gRPC), as the run drives it: its model, the prompts it
    takes (token ids by default), and one request streamed and timed."""

    def __init__(self, config: BenchConfig, tls: TlsConfig | None, token: str | None):
        self.config = config
        # a subchannel pool of each channel's own: channels of one process otherwise share one connection
        options = [(OWN_CONNECTION, 1)] if config.connections > 1 else []
        self.clients = [
            AsyncClient(config.target, timeout=config.timeout, token=token, tls=tls, retry=NO_RETRY, options=options)
            for _ in range(config.connections)
        ]
        self.client = self.clients[0]
        self._turns = itertools.cycle(self.clients)
        self.info: ModelInfo | None = None

    async def __aenter__(self) -> AttnserveBackend:
        for client in self.clients:
            await client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self.clients:
            await client.__aexit__(*exc)

    async def describe(self) -> dict[str, Any]:
        """The report's "model" (GetModelInfo's); a run the server would refuse is refused first."""
        self.info = await self.client.model_info()
        check_fits(self.config, self.info)
        if not self.config.prompt_ids and self.info.tokenizer.kind != "bytes":
            print(f"[{PROG}] prompts are {self.prompt_note()}", file=sys.stderr)
        return self.info.to_dict()

    def prompts(self, count: int, seed: int) -> Sequence[Prompt]:
        assert self.info is not None, "describe() first"
        return prompts_for(self.config, self.info, count, seed)

    def prompt_note(self) -> str:
        assert self.info is not None, "describe() first"
        return describe_prompts(self.config, self.info.tokenizer)

    async def measure(self, request: Request, traceparent: str) -> RequestRecord:
        return await measure(next(self._turns), request, traceparent)


def backend_of(config: BenchConfig, tls: TlsConfig | None, token: str | None) -> Backend:
    """The server the run drives, by --backend."""
    if config.backend == OPENAI:
        return OpenAIBackend(config, tls, token)
    return AttnserveBackend(config, tls, token)


async def measure(client: AsyncClient, request: Request, traceparent: str = "") -> RequestRecord:
    """Stream one request and time its tokens (as part of the trace `traceparent` names, if given); a
    failure is recorded, not raised."""
    record = RequestRecord(start=time.perf_counter(), kind=request.kind)
    last = record.start
    try:
        async with client.stream(request.prompt, request.params, traceparent=traceparent) as stream:
            async for delta in stream:
                count = len(delta.token_ids)
                if not count:
                    continue
                record.messages += 1
                now = time.perf_counter()
                if record.first_token is None:
                    record.first_token = now
                else:  # a message of several tokens: its gap is shared out evenly among them
                    record.itl.extend([(now - last) / count] * count)
                last = now
                record.tokens += count
            result = await stream.result()
        record.reported_tokens = result.usage.completion_tokens if result.usage else None
        record.prompt_tokens = result.usage.prompt_tokens if result.usage else None
        record.cached_tokens = result.usage.cached_tokens if result.usage else None
        record.finish_reason = result.finish_reason
        record.output_bytes = len(result.text.encode("utf-8"))
    except AttnserveError as error:
        record.status = error.status
        record.error = str(error)
    record.end = time.perf_counter()
    return record


async def closed_loop(
    backend: Backend,
    requests: Sequence[Request],
    concurrency: int,
    progress: Progress,
    trace: bool = False,
) -> list[RequestRecord]:
    """All requests, `concurrency` in flight: each worker sends its next one when one ends."""
    pending: Iterator[Request] = iter(requests)
    records: list[RequestRecord] = []

    async def worker() -> None:
        for request in pending:  # one shared iterator: the event loop hands out each request once
            records.append(await backend.measure(request, new_traceparent() if trace else ""))
            progress.tick(records[-1])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return records


async def open_loop(
    backend: Backend,
    requests: Sequence[Request],
    rate: float,
    progress: Progress,
    seed: int,
    trace: bool = False,
) -> list[RequestRecord]:
    """All requests sent at Poisson arrival times of `rate` per second, whatever is in flight."""
    rng = random.Random(seed)
    due = time.perf_counter()

    async def one(request: Request) -> RequestRecord:
        record = await backend.measure(request, new_traceparent() if trace else "")
        progress.tick(record)
        return record

    tasks = []
    for request in requests:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(one(request)))
    return list(await asyncio.gather(*tasks))


async def run_bench(
    config: BenchConfig, tls: TlsConfig | None = None, token: str | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Warm up, measure every level, and return the report (a JSON-ready dict)."""
    progress = progress or Progress()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    async with backend_of(config, tls, token) as backend:
        model = await backend.describe()
        warm = requests_for(config, backend, config.warmup, "warm-up")
        if warm:
            progress.start("warm-up", len(warm))
            say_failure(
                "warm-up", await closed_loop(backend, warm, max(config.concurrency or (1,)), progress, config.trace)
            )
        levels = []
        for c in config.concurrency:
            requests = requests_for(config, backend, config.requests, f"concurrency {c}")
            progress.start(f"concurrency {c}", len(requests))
            records = await closed_loop(backend, requests, c, progress, config.trace)
            say_failure(f"concurrency {c}", records)
            levels.append(summarize_level(records, mode="closed", concurrency=c))
        for rate in config.rates:
            requests = requests_for(config, backend, config.requests, f"rate {rate:g}/s")
            progress.start(f"rate {rate:g}/s", len(requests))
            records = await open_loop(backend, requests, rate, progress, config.seed, config.trace)
            say_failure(f"rate {rate:g}/s", records)
            levels.append(summarize_level(records, mode="poisson", rate=rate))
    return {
        "tool": PROG,
        "target": config.target,
        "started_at": started_at,
        "config": asdict(config),
        "prompts": backend.prompt_note(),
        "kinds": summary(config.kinds(), [request.kind for request in requests]),  # every level's are alike
        "model": model,
        "levels": levels,
    }


def requests_for(config: BenchConfig, backend: Backend, count: int, label: str) -> list[Request]:
    """The requests of one pass (the warm-up, a level): prompts and kinds drawn from a seed of their own,
    derived from --seed and the pass's label, so that no pass repeats another's prompts (of this run,
    or of a run with another --seed): a prompt sent twice would be served from the prefix cache."""
    seed = pass_seed(config.seed, label)
    return config.requests_of(backend.prompts(count, seed), seed)


def pass_seed(seed: int, label: str) -> int:
    """A seed for one pass of a run: the same for the same --seed and label, on every machine."""
    return random.Random(f"{seed}/{label}").getrandbits(63)


def say_failure(label: str, records: Sequence[RequestRecord]) -> None:
    """The first failed request's error of a level, on stderr (the report counts them by status)."""
    failed = next((r for r in records if not r.ok), None)
    if failed is not None:
        print(f"[{PROG}] {label}: first failure: {failed.status}: {failed.error}", file=sys.stderr)


def check_fits(config: BenchConfig, info: ModelInfo) -> None:
    """Refuse, before sending anything, a run whose requests the server would reject.

    The lengths checked are exact for token ids and byte-tokenizer text, and an upper bound for
    BPE text (at least one byte per token, no BOS), so a run that passes here fits.
    """
    if config.prompt_ids and not info.tokenizer.vocab_size:
        raise InvalidArgument(
            "the server reports no tokenizer vocab_size for token-id prompts (it predates prompt_token_ids); "
            "use --prompt-text"
        )
    top_k = max(kind.sampling.get("top_k", 0) for kind in config.kinds())
    if info.tokenizer.vocab_size and top_k > info.tokenizer.vocab_size:
        raise InvalidArgument(f"--top-k {top_k} is over the model's vocab_size of {info.tokenizer.vocab_size}")
    if config.max_new_tokens > info.limits.max_new_tokens:
        raise InvalidArgument(
            f"--max-new-tokens {config.max_new_tokens} is over the server's cap of {info.limits.max_new_tokens}"
        )
    interval = config.stream_interval_tokens
    if interval is not None and interval > info.limits.max_new_tokens:
        raise InvalidArgument(
            f"--stream-interval-tokens {interval} is over the server's max_new_tokens cap of "
            f"{info.limits.max_new_tokens}"
        )
    if config.prompt_tokens > info.limits.max_prompt_tokens:
        raise InvalidArgument(
            f"--prompt-tokens {config.prompt_tokens} is over the server's limit of {info.limits.max_prompt_tokens}"
        )
    if info.architecture == "decoder" and config.prompt_tokens + config.max_new_tokens > info.context_length:
        raise InvalidArgument(
            f"--prompt-tokens {config.prompt_tokens} + --max-new-tokens "
            f"{config.max_new_tokens} exceed the context length {info.context_length}"
        )
