"""`attnserve serve --log-format json` and `--log-requests`: the server's and the engine core's log
lines as one JSON object each (time, level, logger, message, request id, trace id), and one line per
finished request, carrying the caller's request id and W3C trace id. The formatter and the request
log are tested alone first; then a real `attnserve serve` subprocess, tracing to a real OTLP receiver,
serves one stream under a caller's traceparent and drains on SIGTERM."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import secrets
import signal
import sys

import grpc
import pytest
from fixtures_server import ServeProcess, request

from attnserve.cli import main
from attnserve.core.log_lines import JsonLines, configure_logging, formatter
from attnserve.engine.domain import Final, FinishReason, GenerationRequest, Timings, Usage
from attnserve.server.config import ServerConfig
from attnserve.tracing.current import CURRENT, NO_TRACE, LoggedTrace, LoggedTraces, caller_trace_id, current, opened
from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 60
FIELDS = {"time", "level", "logger", "message", "request_id", "trace_id"}
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def record(message: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    made = logging.getLogger("attnserve.test").makeRecord(
        "attnserve.test", logging.WARNING, __file__, 1, message, args, exc_info, extra=extra or None
    )
    made.created, made.msecs = 1795817601.1234, 123.0  # 2026-11-27T22:13:21.123Z
    return made


def caller() -> tuple[str, str]:
    """A caller's trace id and the traceparent that carries it."""
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


def final(reason: FinishReason, prompt: int, completion: int, index: int = 0) -> Final:
    return Final(reason, "", Usage(prompt, completion), Timings(0.0, 1.0, 2.0), index=index)


def test_a_json_line_holds_time_level_logger_message_and_empty_ids_outside_a_request():
    line = json.loads(JsonLines().format(record("%d tokens for %s", 3, "café")))
    assert line == {
        "time": "2026-11-27T22:13:21.123Z",
        "level": "WARNING",
        "logger": "attnserve.test",
        "message": "3 tokens for café",
        "request_id": "",
        "trace_id": "",
    }
    assert "café" in JsonLines().format(record("café"))  # ensure_ascii=False: UTF-8 as it is


def test_a_json_line_takes_the_current_requests_ids_unless_the_record_has_its_own():
    trace_id, traceparent = caller()
    trace = LoggedTrace(NO_TRACE, "POST /v1/completions", {"traceparent": traceparent}, log_requests=False)
    trace.submitting(GenerationRequest("r-7", (1, 2, 3), 4))

    def inside() -> tuple[dict, dict]:
        CURRENT.set(trace)
        own = record("mine", request_id="r-8", trace_id="f" * 32)
        return json.loads(JsonLines().format(record("theirs"))), json.loads(JsonLines().format(own))

    theirs, own = contextvars.copy_context().run(inside)
    assert (theirs["request_id"], theirs["trace_id"]) == ("r-7", trace_id)
    assert (own["request_id"], own["trace_id"]) == ("r-8", "f" * 32)
    assert current() is NO_TRACE  # the context ran apart


def test_a_json_line_carries_the_exceptions_traceback_and_stays_one_line():
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        text = JsonLines().format(record("failed", exc_info=sys.exc_info()))
    assert "\n" not in text
    line = json.loads(text)
    assert set(line) == FIELDS | {"exception"} and TIME.fullmatch(line["time"])
    assert line["exception"].startswith("Traceback") and "ValueError: broken\nacross lines" in line["exception"]


def test_text_stays_the_default_and_the_plain_line():
    assert not isinstance(formatter("text"), JsonLines) and isinstance(formatter("json"), JsonLines)
    text = formatter("text").format(record("plain"))
    assert TEXT_LINE.match(text) and text.endswith(",123 WARNING attnserve.test: plain"), text
    assert ServerConfig(model="m").log_format == "text" and ServerConfig(model="m").core().log_format == "text"
    assert ServerConfig(model="m", log_format="json").core().log_format == "json"


def test_a_clients_control_characters_cannot_forge_a_text_line_or_drive_a_terminal():
    """A request id (or any client text) with a newline, a carriage return or an ESC sequence: one line,
    each escaped as Python writes it; the traceback after it keeps its own lines."""
    hostile = "id\n2026-11-27 22:13:21,123 ERROR attnserve: forged\r\x1b[2J\x9b\x7f"
    text = formatter("text").format(record("request %s failed", hostile))
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x9b" not in text
    assert text.endswith("request id\\n2026-11-27 22:13:21,123 ERROR attnserve: forged\\r\\x1b[2J\\x9b\\x7f failed")
    try:
        raise ValueError("broken")
    except ValueError:
        lines = formatter("text").format(record("with\ttab", exc_info=sys.exc_info())).splitlines()
    assert lines[0].endswith("with\\ttab") and lines[1] == "Traceback (most recent call last):"


def test_uvicorns_loggers_write_through_the_servers_format():
    """The HTTP door's uvicorn configures no handlers of its own: its lines reach the root logger's, as
    --log-format says (its own handlers once wrote plain lines into --log-format json's stream)."""
    from attnserve.server.http_serving import HttpServer

    served = HttpServer(lambda scope, receive, send: None, "127.0.0.1", 0, None, 1.0)
    try:
        for name in ("uvicorn", "uvicorn.error"):  # uvicorn.access: off (access_log False)
            logger = logging.getLogger(name)
            assert logger.handlers == [] and logger.propagate, name
    finally:
        served.socket.close()


def test_credentials_in_the_otlp_endpoint_are_never_logged_or_shown():
    from attnserve.tracing.settings import endpoint_problem, redacted

    url = "http://user:s3cret@collector.example:4318/v1/traces?token=abc&x=1"
    assert redacted(url) == "http://***@collector.example:4318/v1/traces?token=***&x=***"
    assert redacted("http://127.0.0.1:4317") == "http://127.0.0.1:4317"
    problem = endpoint_problem("ftp://user:s3cret@collector.example:4318")
    assert problem is not None and "s3cret" not in problem and "***@collector.example" in problem


def test_configure_logging_leaves_a_configured_root_alone():
    root = logging.getLogger()
    handlers = list(root.handlers)
    configure_logging("json")  # pytest's capture handlers are on the root already
    assert root.handlers == handlers


def test_a_callers_traceparent_gives_the_trace_id_and_a_bad_one_none():
    trace_id, traceparent = caller()
    assert caller_trace_id({"traceparent": traceparent}) == trace_id
    for bad in ("", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "ff-" + trace_id + "-" + "1" * 16 + "-01", "junk"):
        assert caller_trace_id({"traceparent": bad}) == "", bad
    assert caller_trace_id({}) == ""


def test_the_request_log_writes_one_line_per_request_with_its_ids_tokens_and_finishes(caplog):
    trace_id, traceparent = caller()
    traces = LoggedTraces(None, log_requests=True)
    caplog.set_level(logging.INFO, logger="attnserve.requests")

    def serve_one() -> None:
        trace = opened(traces, "attnserve.v1.TextGeneration/Generate", {"traceparent": traceparent}, {})
        assert current() is trace and trace.trace_id == trace_id
        trace.submitting(GenerationRequest("r-1", (5, 6, 7, 8), 10, n=2))
        trace.finished(final(FinishReason.LENGTH, 4, 10))
        trace.finished(final(FinishReason.STOP, 4, 3, index=1))
        trace.end("OK", None, {})

    contextvars.copy_context().run(serve_one)
    (line,) = caplog.records
    assert line.name == "attnserve.requests" and line.levelno == logging.INFO
    assert line.getMessage().startswith(
        "request r-1 ended OK: 4 prompt + 13 completion tokens, finish length,stop "
        "(attnserve.v1.TextGeneration/Generate, "
    )
    assert (vars(line)["request_id"], vars(line)["trace_id"]) == ("r-1", trace_id)  # logging's extra=


def test_the_request_log_writes_refusals_and_skips_calls_that_generate_nothing(caplog):
    caplog.set_level(logging.INFO, logger="attnserve.requests")
    traces = LoggedTraces(None, log_requests=True)
    traces.open("attnserve.v1.TextGeneration/GetModelInfo", {}, {}).end("OK")
    traces.open("POST /v1/completions", {}, {}).end("400", "prompt is too long")
    (line,) = caplog.records
    assert line.getMessage().startswith("request - ended 400: 0 prompt + 0 completion tokens, finish none (POST ")
    assert line.getMessage().endswith(": prompt is too long")
    caplog.clear()
    LoggedTraces(None, log_requests=False).open("POST /v1/completions", {}, {}).end("400", "no")
    assert not caplog.records  # --log-format json alone: the ids, no line


def test_an_unknown_log_format_is_refused_at_start_up_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", "m", "--log-format", "yaml"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("attnserve serve: error: argument --log-format: invalid choice: 'yaml'"), line
    with pytest.raises(ValueError, match=r"^--log-format must be text or json, not 'yaml'$"):
        ServerConfig(model="m", log_format="yaml").check()


def test_the_server_and_its_engine_core_log_json_lines_and_each_request_once(tiny_model_dir):
    otlp = pytest.importorskip("benchmarks.otlp_receiver", reason="opentelemetry-proto comes with the [cpu] extra")
    receiver = otlp.Receiver().start()
    trace_id, traceparent = caller()
    server = ServeProcess(
        *("--model", str(tiny_model_dir), "--port", "0", "--threads", "1", "--max-batch", "2"),
        *("--log-format", "json", "--log-requests", "--otlp-traces-endpoint", receiver.endpoint),
    )
    try:
        assert server.port is not None, "".join(server.lines)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stream = pb_grpc.TextGenerationStub(channel).GenerateStream(
                request("hello", max_new_tokens=6, ignore_eos=True, request_id="log-format-1"),
                metadata=(("traceparent", traceparent),),
                timeout=TIMEOUT,
            )
            messages = list(stream)
        assert sum(len(m.token_ids) for m in messages) == 6
        prompt_tokens = messages[-1].usage.prompt_tokens
        server.proc.send_signal(signal.SIGTERM)
        code, output = server.wait(TIMEOUT)
    finally:
        server.kill()
        receiver.stop()
    assert code == 0, output
    lines = output.splitlines()
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    for line in logged:
        assert set(line) == FIELDS, line
        assert TIME.fullmatch(line["time"]) and line["level"] in ("INFO", "WARNING"), line
    assert not [line for line in lines if TEXT_LINE.match(line)], output  # no plain log line left
    assert [line for line in lines if line.startswith("attnserve serve: listening on ")]  # print()s stay text
    core = [line for line in logged if line["logger"] == "attnserve.core.process"]
    assert core and core[0]["message"].startswith("loaded "), output  # the engine core's own process
    (served,) = [line for line in logged if line["logger"] == "attnserve.requests"]
    assert (served["request_id"], served["trace_id"]) == ("log-format-1", trace_id)
    assert re.match(
        rf"request log-format-1 ended OK: {prompt_tokens} prompt \+ 6 completion tokens, finish length "
        r"\(attnserve\.v1\.TextGeneration/GenerateStream, \d+ ms\)$",
        served["message"],
    ), served
    assert [line for line in logged if line["message"].startswith("SIGTERM")]


def test_a_front_end_more_says_its_number_in_each_line_and_the_first_says_none():
    """--api-server-count: the lines of front end 2 name it, text and JSON; the first's and the core's
    lines are as ever."""
    text = formatter("text", 2).format(record("draining"))
    assert text.endswith(" WARNING attnserve.test (front end 2): draining"), text
    assert "front end" not in formatter("text").format(record("draining"))
    line = json.loads(formatter("json", 2).format(record("draining")))
    assert line["front_end"] == 2 and line["message"] == "draining"
    assert "front_end" not in json.loads(formatter("json").format(record("draining")))
