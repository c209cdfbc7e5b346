"""`attnserve generate` against a real server: output, --json, exit codes, Ctrl-C cancels."""

import json
import os
import select
import signal
import subprocess
import sys

import pytest
from fixtures_server import idle, start_server, wait_until

from attnserve.cli import build_parser, main
from attnserve.clients import Client

PROMPT = "def parse_args("


@pytest.fixture
def live(server):
    server.pacer.reset()
    yield server
    server.pacer.reset()
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


def generate(capsys, *args: str) -> tuple[int, str, str]:
    """Run `attnserve generate ARGS` in this process: exit status, stdout, stderr."""
    status = main(["generate", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_streams_the_completion_then_a_newline(live, capsys):
    expected = Client(live.target).generate(PROMPT, max_new_tokens=24).text
    status, out, err = generate(capsys, PROMPT, "--target", live.target, "--max-new-tokens", "24")
    assert (status, out, err) == (0, expected + "\n", "")
    status, out, _ = generate(capsys, PROMPT, "--target", live.target, "--max-new-tokens", "24", "--no-stream")
    assert (status, out) == (0, expected + "\n")


def test_json_prints_one_object_with_every_field(live, capsys):
    status, out, err = generate(
        capsys,
        PROMPT,
        "--target",
        live.target,
        "--max-new-tokens",
        "8",
        "--json",
        "--request-id",
        "cli-1",
        "--seed",
        "3",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--repetition-penalty",
        "1.1",
    )
    assert status == 0 and err == "" and len(out.splitlines()) == 1, err
    result = json.loads(out)
    assert set(result) == {"text", "token_ids", "finish_reason", "usage", "timings", "request_id"}
    assert result["request_id"] == "cli-1" and result["finish_reason"] in ("length", "eos")
    assert len(result["token_ids"]) == result["usage"]["completion_tokens"] <= 8
    assert result["usage"]["prompt_tokens"] == len(PROMPT) + 1
    assert set(result["timings"]) == {"queue_ms", "time_to_first_token_ms", "total_ms"}
    again = generate(
        capsys,
        PROMPT,
        "--target",
        live.target,
        "--max-new-tokens",
        "8",
        "--json",
        "--no-stream",
        "--seed",
        "3",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--repetition-penalty",
        "1.1",
    )[1]
    assert json.loads(again)["token_ids"] == result["token_ids"]  # same seed, same tokens


def test_stop_strings(live, capsys):
    expected = Client(live.target).generate(PROMPT, max_new_tokens=24).text
    stop = expected[3:5]
    assert len(stop) == 2, f"greedy text too short for this test: {expected!r}"
    status, out, _ = generate(
        capsys,
        PROMPT,
        "--target",
        live.target,
        "--max-new-tokens",
        "24",
        "--json",
        "--stop",
        "\x00never",
        "--stop",
        stop,
    )
    result = json.loads(out)
    assert status == 0 and result["finish_reason"] == "stop"
    assert result["text"] == expected[: expected.index(stop)]


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["", "--max-new-tokens", "4"], 2, "INVALID_ARGUMENT: prompt"),
        ([PROMPT, "--max-new-tokens", "0"], 2, "INVALID_ARGUMENT: --max-new-tokens: 0 is outside"),
        ([PROMPT, "--max-new-tokens", "500", "--no-stream"], 2, "INVALID_ARGUMENT: --max-new-tokens: 500 is outside"),
    ],
)
def test_bad_requests_exit_2_with_one_line(live, capsys, args, status, message):
    code, out, err = generate(capsys, *args, "--target", live.target)
    assert (code, out) == (status, "")
    assert err.startswith(f"attnserve generate: error: {message}") and len(err.splitlines()) == 1


def test_prompt_token_ids_give_the_completion_of_the_equal_text(live, capsys):
    with Client(live.target) as client:
        expected = client.generate(PROMPT, max_new_tokens=12)
        ids = [client.model_info().tokenizer.bos_id, *PROMPT.encode("utf-8")]
    flag = ["--prompt-token-ids", ",".join(map(str, ids))]
    status, out, err = generate(capsys, *flag, "--target", live.target, "--max-new-tokens", "12")
    assert (status, out, err) == (0, expected.text + "\n", "")
    status, out, _ = generate(capsys, *flag, "--target", live.target, "--max-new-tokens", "12", "--json", "--no-stream")
    result = json.loads(out)
    assert status == 0 and result["token_ids"] == list(expected.token_ids)
    assert result["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize(
    "args, message",
    [
        ([PROMPT, "--prompt-token-ids", "256,100"], "give a prompt or --prompt-token-ids, not both"),
        ([], "give a prompt (text, or '-' for stdin) or --prompt-token-ids"),
        (["--prompt-token-ids", "256,x"], "--prompt-token-ids takes comma-separated numbers, not '256,x'"),
        (["--prompt-token-ids", ""], "prompt_token_ids: must not be empty"),
        (["--prompt-token-ids", "256,9999"], "INVALID_ARGUMENT: --prompt-token-ids[1]"),
    ],
)
def test_prompt_and_token_ids_exactly_one_else_exit_2_with_one_line(live, capsys, args, message):
    code, out, err = generate(capsys, *args, "--target", live.target, "--max-new-tokens", "2")
    assert (code, out) == (2, "")
    assert err.startswith(f"attnserve generate: error: {message}") and len(err.splitlines()) == 1


def test_unreachable_server_exits_1_and_unreadable_files_exit_2(capsys, tmp_path):
    code, out, err = generate(capsys, PROMPT, "--target", "127.0.0.1:1", "--timeout", "0.5")
    assert (code, out) == (1, "") and err.startswith("attnserve generate: error: UNAVAILABLE: ")
    code, _, err = generate(capsys, PROMPT, "--token-file", str(tmp_path / "missing"))
    assert code == 2 and err.startswith("attnserve generate: error: ") and "missing" in err
    assert "Traceback" not in err


def test_token_file(tiny_model_dir, capsys, tmp_path):
    (tmp_path / "token").write_text("s3cret")
    running = start_server(tiny_model_dir, auth_token_file=str(tmp_path / "token"))
    try:
        code, _, err = generate(capsys, PROMPT, "--target", running.target)
        assert code == 1 and "UNAUTHENTICATED" in err
        code, out, _ = generate(
            capsys, PROMPT, "--target", running.target, "--token-file", str(tmp_path / "token"), "--max-new-tokens", "3"
        )
        assert code == 0 and out.endswith("\n")
    finally:
        running.stop()


def read_some(pipe, timeout: float) -> bytes:
    """The first bytes written to `pipe` within `timeout` seconds."""
    ready, _, _ = select.select([pipe], [], [], timeout)
    return os.read(pipe.fileno(), 4096) if ready else b""


IGNORE_SIGINT_THEN_GENERATE = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
os.execv(sys.executable, [sys.executable, "-m", "attnserve.cli", "generate", sys.argv[1],
                          "--target", sys.argv[2], "--max-new-tokens", "100"])
"""


def test_ctrl_c_cancels_the_stream_on_the_server_and_exits_130(live):
    live.pacer.hold(when=lambda: live.engine.stats()["active"] == 1)  # the stream runs until released
    before = (
        live.server.metrics.registry.get_sample_value("attnserve_generations_finished_total", {"reason": "cancelled"})
        or 0
    )
    # Started as a background job of a non-interactive shell would start it: SIGINT ignored
    # (the CLI must take it back, or Ctrl-C from a script would do nothing).
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORE_SIGINT_THEN_GENERATE, PROMPT, live.target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert read_some(proc.stdout, 60.0), "no streamed text within 60 s"
        assert live.engine.stats()["active"] == 1
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        live.pacer.release()
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 130 and b"cancelled" in err and b"Traceback" not in err, (proc.returncode, err)
    # The server ended it as cancelled, not as "length" after its 100 tokens (held until the cancel).
    wait_until(
        lambda: (
            live.server.metrics.registry.get_sample_value(
                "attnserve_generations_finished_total", {"reason": "cancelled"}
            )
            == before + 1
        ),
        timeout=10,
        what="the server to count the cancelled generation",
    )
    wait_until(lambda: idle(live.engine), timeout=10, what="the server to drop the request")


def test_stop_takes_one_string_per_flag_so_the_prompt_may_follow_it():
    args = build_parser("generate").parse_args(["generate", "--stop", ".", "--stop", "\n\n", "The list"])
    assert (args.prompt, args.stop) == ("The list", [".", "\n\n"])
