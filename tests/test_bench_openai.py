"""`attnserve bench --backend openai` against a real OpenAI-compatible server: attnserve's own HTTP door
(`serve --http-port`) on the tiny model and the chat model. The report's counts agree with the
server's metrics; completions and chat both stream; the sampling flags and a mix reach the server;
failures are counted by HTTP status with the server's message; what cannot work is refused first."""

import json

import pytest
from fixtures_server import idle, start_server, wait_until

from attnserve.cli import main

TOKENS = "attnserve_generated_tokens_total"
PROMPT_TOKENS = "attnserve_prompt_tokens_total"


@pytest.fixture
def live(http_server):
    http_server.pacer.reset()
    yield http_server
    http_server.pacer.reset()
    wait_until(lambda: idle(http_server.engine), what="the HTTP server to go idle")


def url(running) -> str:
    return f"http://127.0.0.1:{running.server.http.port}/v1"


def counter(running, name: str) -> float:
    return running.server.metrics.registry.get_sample_value(name, {}) or 0


def bench(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["bench", "--backend", "openai", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_completions_levels_agree_with_the_servers_counts(live, capsys):
    live.pacer.lockstep = True  # a token per chunk, so every token's gap is measured
    tokens, prompts = counter(live, TOKENS), counter(live, PROMPT_TOKENS)
    status, out, err = bench(
        capsys,
        *("--target", url(live), "--concurrency", "1,3", "--requests", "6", "--max-new-tokens", "5"),
        *("--ignore-eos", "--warmup", "1", "--prompt-tokens", "24"),
    )
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["model"]["model_name"] == live.server.info.model_name  # the first /v1/models lists
    assert report["config"]["prompt_ids"] is False and report["prompts"].startswith("text: 23 ASCII bytes")
    levels = report["levels"]
    assert [level["concurrency"] for level in levels] == [1, 3]
    for level in levels:
        assert (level["completed"], level["errors"]) == (6, {})
        assert level["output_tokens"] == level["reported_completion_tokens"] == 6 * 5  # --ignore-eos: all 5
        assert level["messages_per_request"] == 5 and level["token_count_mismatches"] == 0
        assert level["prompt_tokens"] == 6 * 24  # the byte tokenizer: BOS + 23 bytes
        assert level["finish_reasons"] == {"length": 6}
        assert level["output_bytes"] > 0
        assert 0 < level["ttft_ms"]["p50"] <= level["e2e_ms"]["p50"]
        assert level["itl_ms"]["p50"] is not None and level["tpot_ms"]["p50"] is not None
    assert counter(live, TOKENS) - tokens == 13 * 5  # the server generated what the report counts (+ warm-up)
    assert counter(live, PROMPT_TOKENS) - prompts == 13 * 24


def test_the_servers_cached_tokens_are_reported(live, capsys):
    """OpenAI's usage.prompt_tokens_details.cached_tokens, per level: none in a first run, every full
    block of each prompt when the same command runs again (text prompts of 40 tokens, blocks of 16),
    as much as the server counted as saved."""
    saved = "attnserve_prefix_cache_saved_tokens_total"
    flags = ["--target", url(live), "--concurrency", "2", "--requests", "3", "--max-new-tokens", "3"]
    flags += ["--prompt-tokens", "40", "--warmup", "0", "--seed", "4242"]
    cached = []
    for _ in range(2):
        before = counter(live, saved)
        status, out, err = bench(capsys, *flags)
        assert status == 0, err
        (level,) = json.loads(out.splitlines()[-1])["levels"]
        cached.append(level["cached_prompt_tokens"])
        assert level["cached_prompt_tokens"] == counter(live, saved) - before
    assert cached == [0, 3 * 32]


def test_chat_with_the_production_mix_reaches_the_server(chat_model_dir, capsys):
    running = start_server(chat_model_dir, http_port=0)
    try:
        tokens = counter(running, TOKENS)
        status, out, err = bench(
            capsys,
            *("--target", url(running), "--endpoint", "chat", "--mix", "production", "--concurrency", "4"),
            *("--requests", "10", "--max-new-tokens", "4", "--warmup", "0", "--ignore-eos"),
            *("--model", running.server.info.model_name),
        )
    finally:
        running.stop()
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])
    (level,) = report["levels"]
    assert (level["completed"], level["errors"]) == (10, {})
    assert level["output_tokens"] == 10 * 4 == counter(running, TOKENS) - tokens
    assert level["prompt_tokens"] > 10 * 15  # the chat template's tokens around each 15-byte message
    assert {kind: row["requests"] for kind, row in level["by_kind"].items()} == {
        "temperature 0.7, top_p 0.9": 7,
        "greedy": 2,
        "greedy, logprobs 5": 1,
    }
    assert report["model"]["api"] == f"OpenAI chat at {url(running)}"


def test_failures_are_counted_by_http_status_with_the_servers_message(live, capsys):
    cap = live.server.limits.max_new_tokens
    status, out, err = bench(
        capsys,
        *("--target", url(live), "--concurrency", "2", "--requests", "3", "--max-new-tokens", str(cap + 1)),
        *(
            "--warmup",
            "0",
        ),
    )
    assert status == 1  # nothing completed
    (level,) = json.loads(out.splitlines()[-1])["levels"]
    assert (level["completed"], level["errors"]) == (0, {"HTTP 400": 3})
    assert "first failure: HTTP 400: " in err and "max_tokens" in err


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("--model", "no-such-model"), 2, "--model no-such-model: {url}/models lists "),
        (("--prompt-ids",), 2, "--prompt-ids needs the server's vocabulary"),
        (("--tls-ca", "/etc/hosts"), 2, "--tls-ca needs an https:// --target, not {url}"),
    ],
)
def test_what_cannot_work_is_refused_in_one_line(live, capsys, args, status, message):
    got, out, err = bench(capsys, "--target", url(live), *args)
    assert (got, out) == (status, "")
    assert err.splitlines()[-1].startswith("attnserve bench: error: ") and message.format(url=url(live)) in err


def test_an_unreachable_server_exits_1_and_a_bad_url_2(capsys):
    status, _, err = bench(capsys, "--target", "http://127.0.0.1:1/v1")
    assert status == 1 and err.startswith("attnserve bench: error: cannot connect to http://127.0.0.1:1/v1")
    status, _, err = bench(capsys, "--target", "127.0.0.1:8000")
    assert status == 2 and "--target 127.0.0.1:8000 (--backend openai): '127.0.0.1:8000' is not an http://" in err


def test_https_with_mutual_tls_and_a_bearer_token(tiny_model_dir, pki, tmp_path, capsys):
    folder, _ = pki
    (tmp_path / "token").write_text("s3cret\n")
    running = start_server(
        tiny_model_dir,
        http_port=0,
        tls_cert=str(folder / "server.crt"),
        tls_key=str(folder / "server.key"),
        tls_client_ca=str(folder / "ca"),
        auth_token_file=str(tmp_path / "token"),
    )
    (tmp_path / "wrong").write_text("guess\n")
    https = url(running).replace("http://", "https://")
    client = ("--tls-ca", str(folder / "ca"), "--tls-cert", str(folder / "client.crt"))
    client += ("--tls-key", str(folder / "client.key"))
    run = ("--target", https, "--concurrency", "2", "--requests", "2", "--max-new-tokens", "3", "--warmup", "0")
    try:
        status, out, err = bench(capsys, *run, *client, "--token-file", str(tmp_path / "token"))
        assert status == 0, err
        assert json.loads(out.splitlines()[-1])["levels"][0]["completed"] == 2
        status, _, err = bench(capsys, *run, *client, "--token-file", str(tmp_path / "wrong"))
        assert status == 2 and err.startswith("attnserve bench: error: HTTP 401: ")
        status, _, err = bench(capsys, *run, "--tls-ca", str(folder / "stranger"))  # a CA that did not sign it
        assert status == 1 and err.startswith(f"attnserve bench: error: cannot connect to {https}: ")
    finally:
        running.stop()


def test_request_bodies_name_each_field_as_openai_and_vllm_do():
    from attnserve.clients.bench_openai import request_body
    from attnserve.clients.types import GenerationParams

    greedy = request_body("completions", "m", "hi", GenerationParams(max_new_tokens=4))
    assert greedy == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4,
        "temperature": 0.0,  # OpenAI's default is 1: greedy must say 0
        "prompt": "hi",
    }
    sampled = GenerationParams(max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=5, seed=0, logprobs=3)
    chat = request_body("chat", "m", "hi", sampled)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in chat
    assert (chat["top_p"], chat["top_k"], chat["seed"]) == (0.9, 5, 0)
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 3)
    assert request_body("completions", "m", "hi", sampled)["logprobs"] == 3
    assert request_body("completions", "m", "hi", GenerationParams(ignore_eos=True))["ignore_eos"] is True
