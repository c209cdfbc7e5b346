"""Server defaults live once: ServerConfig's fields make `attnserve serve`'s flags, and nothing repeats them.

Each flag's name, default and help come from its field; the help shows the default; parsing the
flags gives back the config; bad values are refused in one line naming the flag; the engine's
limits carry no defaults of their own. No server is started here.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import re
import time
from dataclasses import MISSING, fields

import grpc
import pytest

from attnserve.cli import build_parser, main, subcommand_parser
from attnserve.core.loading import StartupError
from attnserve.core.slow_steps import STEP_DELAY_VARIABLE, SlowSteps, step_delay_ms
from attnserve.engine.engine import Engine, EngineLimits, EngineObserver
from attnserve.flags import flag_name
from attnserve.server.config import ServerConfig
from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE, LeakInterceptor

FLAG_FIELDS = [f for f in fields(ServerConfig) if "help" in f.metadata]


def serve_actions() -> dict[str, argparse.Action]:
    """`attnserve serve`'s argparse actions by flag."""
    return {a.option_strings[0]: a for a in subcommand_parser("serve")._actions if a.option_strings}


def test_every_field_but_one_is_a_flag_with_its_default_and_help():
    """The one without a flag: warm-up (for code embedding a Server); no test-only switch is in the config."""
    assert {f.name for f in fields(ServerConfig)} - {f.name for f in FLAG_FIELDS} == {"warmup"}
    actions = serve_actions()
    assert set(actions) - {"-h"} == {flag_name(f.name) for f in FLAG_FIELDS}
    for f in FLAG_FIELDS:
        action = actions[flag_name(f.name)]
        assert action.help is not None and action.help.startswith(f.metadata["help"]), f.name
        if f.default is MISSING:
            assert action.required, f.name
        else:
            assert action.default == f.default and not action.required, f.name


def test_help_lists_every_flag_with_its_default(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width; no wrapping here
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    options = " ".join(capsys.readouterr().out.split("options:")[1].split())
    for f in FLAG_FIELDS:
        default = "" if f.default is MISSING else r" \(default: [^)]+\)"
        assert re.search(rf"{flag_name(f.name)}( \S+)? {re.escape(f.metadata['help'])}{default}", options), f.name
    for shown in ("--port PORT gRPC", "(default: 50051)", "(default: 16)", "(default: no cap)", "(default: off)"):
        assert shown in options


def test_parsed_flags_give_back_the_config():
    parse = lambda *flags: ServerConfig.from_args(build_parser("serve").parse_args(["serve", "--model", "m", *flags]))
    assert parse() == ServerConfig(model="m")
    assert parse(
        "--port", "0", "--max-batch", "auto", "--kv-cache-memory", "512Mi", "--reflection", "--drain-timeout", "2.5"
    ) == ServerConfig(model="m", port=0, max_batch=0, kv_cache_memory=512 * 2**20, reflection=True, drain_timeout=2.5)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-batch", "0"], "argument --max-batch: '0': give a number of requests (at least 1) or auto"),
        (["--kv-cache-memory", "lots"], "argument --kv-cache-memory: 'lots' is not a size"),
        (["--port", "http"], "argument --port: invalid int value: 'http'"),
        (["--provider", "tpu"], "argument --provider: invalid choice: 'tpu'"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_flag(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", "m", *flags])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnserve serve: error: " + message), lines


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"port": 70000}, "--port must be 0 to 65535, got 70000"),
        ({"port": -1}, "--port must be 0 to 65535, got -1"),
        ({"threads": -1}, "--threads must be 0 or more (0: chosen by the model's size), got -1"),
        ({"intra_op_spinning": "fast"}, "--intra-op-spinning must be auto, off or on, not 'fast'"),
        ({"tls_cert": "c.pem"}, "--tls-cert and --tls-key go together"),
        ({"drain_timeout": -1.0}, "--drain-timeout must be 0 or more, got -1"),
        ({"max_queue": 0}, "--max-queue must be at least 1, got 0"),
        ({"log_stats_interval": -1.0}, "--log-stats-interval must be 0 or more (0: off), got -1"),
        (
            {"served_model_name": "my model"},
            "--served-model-name must be 1 to 128 letters, digits, '.', '_', '-' or '/', not 'my model'",
        ),
        (
            {"served_model_name": ""},
            "--served-model-name must be 1 to 128 letters, digits, '.', '_', '-' or '/', not ''",
        ),
    ],
)
def test_out_of_range_values_are_refused_naming_the_flag(fields, message):
    """gRPC would take port 70000 modulo 65536 and listen elsewhere; ONNX Runtime, -1 threads."""
    with pytest.raises(ValueError) as refused:
        ServerConfig(model="m", **fields).check()
    assert str(refused.value) == message


def test_the_engine_takes_its_limits_from_the_config_only():
    assert all(f.default is MISSING for f in fields(EngineLimits))
    assert inspect.signature(Engine).parameters["limits"].default is inspect.Parameter.empty


def test_the_test_only_step_delay_comes_from_the_environment_the_core_reads():
    """server/test_switches.py names the variable for tests and load drivers; the core reads its own copy."""
    assert TEST_STEP_DELAY_VARIABLE == STEP_DELAY_VARIABLE == "ATTNSERVE_TEST_STEP_DELAY_MS"
    assert step_delay_ms({}) == 0 and step_delay_ms({TEST_STEP_DELAY_VARIABLE: "5"}) == 5
    with pytest.raises(StartupError, match=re.escape("ATTNSERVE_TEST_STEP_DELAY_MS must be a number of ms, not '5.5'")):
        step_delay_ms({TEST_STEP_DELAY_VARIABLE: "5.5"})


def test_the_test_only_leak_keeps_its_bytes_on_every_call_through_it():
    """The soak's negative control: an interceptor passed in, not a switch inside the server."""
    leak = LeakInterceptor(4096)

    async def echo(request, context):
        return request

    async def tokens(request, context):
        for token in request:
            yield token

    async def calls():
        unary = await leak.intercept_service(lambda _: answer(grpc.unary_unary_rpc_method_handler(echo)), None)
        stream = await leak.intercept_service(lambda _: answer(grpc.unary_stream_rpc_method_handler(tokens)), None)
        assert await unary.unary_unary(b"x", None) == b"x"
        return [token async for token in stream.unary_stream(b"ab", None)]

    async def answer(handler):
        return handler

    assert asyncio.run(calls()) == [97, 98]
    assert [len(kept) for kept in leak.leaked] == [4096, 4096]


def test_the_test_only_step_delay_slows_every_step_with_a_batch():
    steps = []

    class Steps(EngineObserver):
        def on_step(self, batch_size, queue_depth):
            steps.append(batch_size)

    slow = SlowSteps(Steps(), 30)
    slow.on_step(0, 0)  # an empty step does not sleep
    t0 = time.perf_counter()
    slow.on_step(2, 0)
    assert steps == [0, 2] and time.perf_counter() - t0 >= 0.03  # a lower bound: the sleep happened
