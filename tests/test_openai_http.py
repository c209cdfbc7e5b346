"""The OpenAI-compatible HTTP front door (`serve --http-port`) on a real server over the tiny model,
driven by OpenAI's own Python client: completions unary and streamed give what attnserve.v1's
Generate gives (greedy and seeded, n, logprobs, stop, usage); bad input, auth, a full queue and a
drain give OpenAI's error shapes and HTTP statuses; a client that breaks off a stream frees its slot."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import socket
import ssl
import subprocess
import threading

import httpx2 as httpx  # the HTTP library of the openai client pinned in [dev]
import manual
import openai
import pytest
from fixtures_server import idle, in_flight, release_once_ended, request, start_server, wait_until

from attnserve.v1 import generation_pb2 as pb

PROMPT = "The list"
TIMEOUT = 60


@pytest.fixture
def live(http_server):
    http_server.pacer.reset()
    yield http_server
    http_server.pacer.reset()
    wait_until(lambda: idle(http_server.engine), what="the HTTP server to go idle")


def base_url(running, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{running.server.http.port}/v1"


@pytest.fixture
def client(live):
    with openai.OpenAI(base_url=base_url(live), api_key="unused", max_retries=0, timeout=TIMEOUT) as c:
        yield c


def model(running) -> str:
    return running.server.info.model_name


def test_unary_completion_equals_generate(live, client):
    expected = live.stub.Generate(request(PROMPT, max_new_tokens=24), timeout=TIMEOUT)
    reply = client.completions.create(model=model(live), prompt=PROMPT, max_tokens=24, temperature=0)
    assert reply.object == "text_completion" and reply.model == model(live) and reply.id.startswith("cmpl-")
    (choice,) = reply.choices
    assert choice.text == expected.text and choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason == ("length" if expected.finish_reason == pb.FINISH_REASON_LENGTH else "stop")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        expected.usage.prompt_tokens,
        expected.usage.completion_tokens,
    )
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def vllm_prompt_logprobs_match(got: list, expected: pb.GenerateResponse) -> None:
    """vLLM's prompt_logprobs against the gRPC door's: None first, then each prompt token's entry (its
    logprob, rank, decoded text) and its top alternatives (ranks 1 to k)."""
    assert got[0] is None and len(got) == len(expected.prompt_logprobs) + 1
    for position, want in zip(got[1:], expected.prompt_logprobs):
        token = position[str(want.token_id)]
        assert token["logprob"] == pytest.approx(want.logprob, abs=1e-6)
        assert token["decoded_token"] == want.text
        above = sum(t.logprob > want.logprob for t in want.top)
        assert token["rank"] == 1 + above if above < len(want.top) else token["rank"] > len(want.top)
        for rank, alternative in enumerate(want.top, 1):
            entry = position[str(alternative.token_id)]
            assert entry["logprob"] == pytest.approx(alternative.logprob, abs=1e-6)
            assert entry["decoded_token"] == alternative.text
            assert entry["rank"] == (token["rank"] if alternative.token_id == want.token_id else rank)
        assert set(position) == {str(want.token_id), *(str(t.token_id) for t in want.top)}


def test_prompt_logprobs_score_a_prompt_as_vllm_returns_them(live):
    """vLLM's prompt_logprobs on /v1/completions: with max_tokens 0 the prompt is only scored, each
    choice gets them (streamed: in the chunk that ends it), the gRPC door's values; none unasked.
    A chat's: tests/test_openai_chat.py."""
    text = "The list of the items"
    expected = live.stub.Generate(request(text, max_new_tokens=0, prompt_logprobs=3), timeout=TIMEOUT)
    url, fields = base_url(live), {"model": model(live), "prompt_logprobs": 3, "temperature": 0}
    scored = httpx.post(f"{url}/completions", json={**fields, "prompt": text, "max_tokens": 0}, timeout=TIMEOUT)
    (choice,) = scored.json()["choices"]
    assert scored.status_code == 200 and choice["text"] == "" and scored.json()["usage"]["completion_tokens"] == 0
    vllm_prompt_logprobs_match(choice["prompt_logprobs"], expected)
    body = {**fields, "prompt": text, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=TIMEOUT) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    (ending,) = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    vllm_prompt_logprobs_match(ending["prompt_logprobs"], expected)
    assert not any("prompt_logprobs" in c["choices"][0] for c in chunks if c["choices"] and c["choices"][0] != ending)
    unasked = httpx.post(f"{url}/completions", json={"model": model(live), "prompt": text}, timeout=TIMEOUT)
    assert "prompt_logprobs" not in unasked.json()["choices"][0]


def test_usage_says_how_many_prompt_tokens_the_prefix_cache_served(live, client):
    """OpenAI's usage.prompt_tokens_details.cached_tokens: a prompt sent again finds its whole 16-token
    blocks (BOS and 39 bytes: two of them) in the cache, and the text is the same."""
    prompt = "A prompt long enough for two blocks: xy"
    first, again = (
        client.completions.create(model=model(live), prompt=prompt, max_tokens=8, temperature=0) for _ in "ab"
    )
    assert again.usage.prompt_tokens == 40 and again.usage.prompt_tokens_details.cached_tokens == 32
    assert first.usage.prompt_tokens_details.cached_tokens in (0, 32) and again.choices[0].text == first.choices[0].text


def test_streamed_completion_equals_generate_and_ends_with_usage(live, client):
    expected = live.stub.Generate(request(PROMPT, max_new_tokens=30), timeout=TIMEOUT)
    live.pacer.lockstep = True  # each step's token is read before the next step: a chunk per token
    chunks = list(
        client.completions.create(
            model=model(live),
            prompt=PROMPT,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *text_chunks, last = chunks
    assert "".join(c.choices[0].text for c in text_chunks) == expected.text
    assert [c.choices[0].finish_reason for c in text_chunks][-1] in ("length", "stop")
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert last.choices == [] and last.usage.completion_tokens == expected.usage.completion_tokens
    assert len(text_chunks) >= expected.usage.completion_tokens  # streamed as decoded, not in one piece


def test_the_raw_event_stream_ends_with_done(live):
    body = {"model": model(live), "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base_url(live)}/completions", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in events)


def test_token_ids_seeded_sampling_n_stop_and_echo_equal_generate(live, client):
    ids = list(live.stub.Generate(request(PROMPT, max_new_tokens=3), timeout=TIMEOUT).token_ids)
    by_ids = live.stub.Generate(pb.GenerateRequest(prompt_token_ids=ids, max_new_tokens=12), timeout=TIMEOUT)
    reply = client.completions.create(model=model(live), prompt=ids, max_tokens=12, temperature=0)
    assert reply.choices[0].text == by_ids.text
    sampled = live.stub.Generate(request(PROMPT, max_new_tokens=16, temperature=0.9, seed=5, n=3), timeout=TIMEOUT)
    reply = client.completions.create(model=model(live), prompt=PROMPT, max_tokens=16, temperature=0.9, seed=5, n=3)
    assert [c.text for c in reply.choices] == [c.text for c in sampled.completions]
    assert [c.index for c in reply.choices] == [
        0,
        1,
        2,
    ] and reply.usage.completion_tokens == sampled.usage.completion_tokens
    stop = sampled.completions[0].text[3:5]
    stopped = live.stub.Generate(request(PROMPT, max_new_tokens=16, temperature=0.9, seed=5, stop=[stop]))
    reply = client.completions.create(
        model=model(live), prompt=PROMPT, max_tokens=16, temperature=0.9, seed=5, stop=stop
    )
    assert reply.choices[0].text == stopped.text and reply.choices[0].finish_reason == "stop"
    echoed = client.completions.create(model=model(live), prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + live.stub.Generate(request(PROMPT, max_new_tokens=8)).text


def test_logprobs_are_generates_with_their_tokens_and_offsets(live, client):
    expected = live.stub.Generate(request(PROMPT, max_new_tokens=6, logprobs=2), timeout=TIMEOUT)
    reply = client.completions.create(model=model(live), prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs.tokens == [p.text for p in expected.logprobs]
    assert logprobs.token_logprobs == pytest.approx([p.logprob for p in expected.logprobs], abs=1e-5)
    assert [list(top) for top in logprobs.top_logprobs] == [[t.text for t in p.top] for p in expected.logprobs]
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert logprobs.text_offset == offsets


def test_vllms_extra_fields_go_through_extra_body(live, client):
    reply = client.completions.create(
        model=model(live),
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        extra_body={"guided_regex": "[a-z]{3}-[0-9]{2}", "top_k": 5, "min_tokens": 1},
    )
    assert len(reply.choices[0].text) == 6 and reply.choices[0].text[3] == "-"
    assert reply.choices[0].finish_reason == "stop"


def test_openais_penalties_and_vllms_min_p_reach_the_engine_and_decode_as_generate(live, client):
    """presence_penalty and frequency_penalty under OpenAI's names, min_p as vLLM's extra field: the
    engine gets each, and the completion is Generate's with the same fields."""
    fields = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "min_p": 0.05, "seed": 11}
    expected = live.stub.Generate(request(PROMPT, max_new_tokens=16, temperature=0.9, **fields), timeout=TIMEOUT)
    before = len(live.pacer.requests)
    reply = client.completions.create(
        model=model(live),
        prompt=PROMPT,
        max_tokens=16,
        temperature=0.9,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        seed=11,
        extra_body={"min_p": 0.05},
    )
    assert reply.choices[0].text == expected.text
    (sent,) = live.pacer.requests[before:]
    got = (sent.sampling.presence_penalty, sent.sampling.frequency_penalty, sent.sampling.min_p)
    assert got == pytest.approx((1.5, 0.5, 0.05))


BAD = [
    ({"top_p": 2}, "top_p", "top_p: 2 is outside (0, 1]"),
    ({"max_tokens": 500}, "max_tokens", "max_tokens: 500 is outside [1, 127]"),
    ({"n": 99}, "n", "n: 99 is outside [1, 8]"),
    ({"logprobs": 21}, "logprobs", "logprobs: 21 is outside [0, 20]"),
    ({"prompt": ["a", "b"]}, "prompt", "prompt: 2 prompts: this server takes one prompt per request"),
    ({"prompt": [1, 999]}, "prompt[1]", "prompt[1]: 999 is outside [0, 259)"),
    ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty: 2.5 is outside [-2, 2]"),
    ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty: -3 is outside [-2, 2]"),
    ({"extra_body": {"min_p": 1.5}}, "min_p", "min_p: 1.5 is outside [0, 1]"),
    ({"echo": True, "logprobs": 1}, "echo", "echo: echo with logprobs is not supported"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream_options: only allowed with stream"),
    ({"extra_body": {"guided_json": '{"type": 7}'}}, "guided_json", "guided_json: type must be a string"),
    ({"extra_body": {"best_of": 3}}, "best_of", "best_of: 3 is not supported"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate", "frobnicate: unknown field"),
]


@pytest.mark.parametrize("fields, param, message", BAD, ids=[param for _, param, _ in BAD])
def test_bad_input_is_400_in_openais_shape_naming_the_field(live, client, fields, param, message):
    fields = {"prompt": PROMPT, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model(live), **fields)
    assert error.value.status_code == 400
    body = error.value.body
    assert body["param"] == param and body["message"].startswith(message) and body["type"] == "invalid_request_error"


def test_an_unknown_model_is_404_and_chat_says_there_is_no_template(live, client):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    assert error.value.body["code"] == "model_not_found" and error.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model(live), messages=[{"role": "user", "content": "hi"}])
    assert "no chat template" in error.value.body["message"]
    models = client.models.list()
    assert [m.id for m in models.data] == [model(live)]


def test_health_and_the_metrics_count_each_route_by_status(live, client):
    assert httpx.get(f"http://127.0.0.1:{live.server.http.port}/health").status_code == 200
    registry = live.server.metrics.registry
    count = lambda status: (
        registry.get_sample_value("attnserve_http_requests_total", {"route": "/v1/completions", "status": status}) or 0
    )
    ok, bad = count("200"), count("400")
    client.completions.create(model=model(live), prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model(live), prompt=PROMPT, max_tokens=2, top_p=3)
    assert (count("200") - ok, count("400") - bad) == (1, 1)


def cancelled(running) -> float:
    """Generations the server ended as cancelled (a client went away), not by length or EOS."""
    registry = running.server.metrics.registry
    return registry.get_sample_value("attnserve_generations_finished_total", {"reason": "cancelled"}) or 0


def test_a_client_that_breaks_off_a_stream_frees_its_slot(live):
    body = {"model": model(live), "prompt": PROMPT, "max_tokens": 100, "stream": True}
    before = cancelled(live)
    live.pacer.hold()  # after the first token, until the stream is broken off
    with httpx.stream("POST", f"{base_url(live)}/completions", json=body, timeout=TIMEOUT) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        assert live.engine.stats()["active"] == 1 and in_flight(live) == 1  # in flight while it streams
    release_once_ended(live)  # the broken-off stream leaves the in-flight gauge
    wait_until(lambda: idle(live.engine), what="the broken-off stream's slot to be freed")
    assert cancelled(live) == before + 1


def test_a_unary_client_that_disconnects_frees_its_slot(live):
    body = {"model": model(live), "prompt": PROMPT, "max_tokens": 100}
    before = cancelled(live)
    live.pacer.hold()  # after the first token: the client gives up before the 100th
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url(live)}/completions", json=body, timeout=1.0)
    release_once_ended(live)
    wait_until(lambda: idle(live.engine), what="the disconnected request's slot to be freed")
    assert cancelled(live) == before + 1  # ended by the disconnect, not by its length


def test_the_bearer_token_is_required_except_for_health_and_version(tiny_model_dir, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    running = start_server(tiny_model_dir, http_port=0, auth_token_file=str(tmp_path / "token"))
    try:
        url = base_url(running)
        with openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(openai.AuthenticationError) as error:
                wrong.completions.create(model=model(running), prompt=PROMPT, max_tokens=2)
            assert error.value.status_code == 401 and error.value.body["code"] == "invalid_api_key"
        with openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0) as right:
            assert right.completions.create(model=model(running), prompt=PROMPT, max_tokens=2).choices[0].text
        root = f"http://127.0.0.1:{running.server.http.port}"
        assert httpx.get(f"{root}/health").status_code == 200 and httpx.get(f"{root}/version").status_code == 200
        for method, route in (("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/detokenize")):
            refused = httpx.request(method, f"{root}{route}", json={"prompt": "x", "tokens": [1]})
            assert refused.status_code == 401, route
            allowed = httpx.request(method, f"{root}{route}", headers={"Authorization": "Bearer s3cret"}, json={})
            assert allowed.status_code in (200, 400), route  # past the token: the empty body is what is wrong
    finally:
        running.stop()


def test_vllms_tokenize_detokenize_version_and_metrics_routes(live):
    """POST /tokenize and /detokenize in vLLM's shapes (the model's tokenizer, BOS where a prompt gets
    it), bounded, one-line 400s naming the field; GET /version; GET /metrics: the --metrics-port
    registry's exposition, OpenMetrics where asked for."""
    from attnserve import __version__
    from attnserve.runtime.contract import read_manifest
    from attnserve.tokenizer import from_model_dir

    model_dir = live.server.config.model
    tokenizer = from_model_dir(model_dir, read_manifest(model_dir).tokenizer)
    root, text = f"http://127.0.0.1:{live.server.http.port}", "The list of héllo"
    got = httpx.post(f"{root}/tokenize", json={"model": model(live), "prompt": text}).json()
    assert got == {
        "count": len(tokenizer.encode_prompt(text)),
        "max_model_len": live.server.info.context_length,
        "tokens": tokenizer.encode_prompt(text),
        "token_strs": None,
    }
    plain = httpx.post(
        f"{root}/tokenize", json={"prompt": text, "add_special_tokens": False, "return_token_strs": True}
    )
    assert plain.json()["tokens"] == tokenizer.encode(text) and got["tokens"][0] == tokenizer.bos_id
    assert plain.json()["token_strs"] == [tokenizer.decode([i]) for i in tokenizer.encode(text)]
    back = httpx.post(f"{root}/detokenize", json={"tokens": plain.json()["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    expected = live.stub.Generate(pb.GenerateRequest(prompt=text, max_new_tokens=0, prompt_logprobs=0), timeout=TIMEOUT)
    assert expected.usage.prompt_tokens == got["count"]  # the same ids the generate door counts
    vocab, context = live.server.info.vocab_size, live.server.info.context_length
    for route, body, field, words in (
        ("/detokenize", {"tokens": [1, vocab]}, "tokens", f"id {vocab} is outside [0, {vocab})"),
        ("/detokenize", {"tokens": [1] * (context + 1)}, "tokens", f"more than the context length {context}"),
        ("/detokenize", {"tokens": "1 2"}, "tokens", "a list of token ids"),
        ("/tokenize", {"prompt": 5}, "prompt", "a string"),
        ("/tokenize", {"prompt": "x" * (1 << 20)}, "prompt", "longer than the longest prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens", "true or false"),
        ("/tokenize", {"prompt": "x", "messages": []}, "messages", "unknown field"),
    ):
        refused = httpx.post(f"{root}{route}", json=body)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == field and words in error["message"], error
    other = httpx.post(f"{root}/tokenize", json={"model": "other", "prompt": "x"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{root}/version").json() == {"version": __version__}
    metrics = httpx.get(f"{root}/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'attnserve_http_requests_total{route="/tokenize",status="200"}' in metrics.text
    open_metrics = httpx.get(f"{root}/metrics", headers={"Accept": "application/openmetrics-text"})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")


def test_a_full_queue_is_429_and_a_drain_503_while_the_stream_in_flight_finishes(tiny_model_dir):
    running = start_server(tiny_model_dir, http_port=0, max_batch=1, max_queue=1, drain_timeout=10.0)
    running.pacer.hold(when=lambda: running.engine.stats()["active"] == 1)
    try:
        with openai.OpenAI(base_url=base_url(running), api_key="x", max_retries=0, timeout=TIMEOUT) as client:
            name = model(running)
            stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=30, temperature=0, stream=True)
            first = next(iter(stream))
            wait_until(running.pacer.held.is_set, what="the stream to hold the engine")
            queued = threading.Thread(target=lambda: client.completions.create(model=name, prompt="q", max_tokens=2))
            queued.start()
            wait_until(lambda: running.engine.stats()["queued"] == 1, what="a request to fill the queue")
            with pytest.raises(openai.RateLimitError) as error:
                client.completions.create(model=name, prompt=PROMPT, max_tokens=2)
            assert error.value.status_code == 429 and "--max-queue" in error.value.body["message"]
            drained = asyncio.run_coroutine_threadsafe(running.server.drain(), running.loop)
            health = f"http://127.0.0.1:{running.server.http.port}/health"
            wait_until(lambda: httpx.get(health).status_code == 503, what="/health to say 503")
            with pytest.raises(openai.InternalServerError) as error:
                client.completions.create(model=name, prompt=PROMPT, max_tokens=2)
            assert error.value.status_code == 503 and error.value.body["code"] == "draining"
            running.pacer.release()
            rest = list(stream)
            queued.join(TIMEOUT)
            drained.result(TIMEOUT)
    finally:
        running.stop()
    text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
    assert rest[-1].choices[0].finish_reason in ("length", "stop") and text


def test_tls_serves_https_with_the_servers_certificate(tiny_model_dir, pki):
    folder, _ = pki
    running = start_server(
        tiny_model_dir, http_port=0, tls_cert=str(folder / "server.crt"), tls_key=str(folder / "server.key")
    )
    try:
        trusting = ssl.create_default_context(cafile=str(folder / "ca"))
        with (
            httpx.Client(verify=trusting) as http,
            openai.OpenAI(base_url=base_url(running, "https"), api_key="x", max_retries=0, http_client=http) as client,
        ):
            assert client.completions.create(model=model(running), prompt=PROMPT, max_tokens=3).choices[0].text
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{running.server.http.port}/health")  # a client that does not trust the CA
    finally:
        running.stop()


def manual_curls() -> list[list[str]]:
    """The manual's `$ curl ...` lines, as argument lists."""
    return [shlex.split(line.removeprefix("$ ")) for line in manual.indented_lines("$ curl ")]


def test_the_manuals_curl_examples_answer_as_shown(live):
    """Each curl line of the manual, its port and model name the test server's: JSON (or events) of the
    shape the manual shows (the tiny model's text differs from the manual's model's)."""
    if shutil.which("curl") is None:
        pytest.skip("needs curl, which the README's examples run")
    examples = manual_curls()
    assert len(examples) >= 6
    port, name = str(live.server.http.port), model(live)
    for argv in examples:
        argv = [
            a.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace('"model": "small"', f'"model": "{name}"')
            for a in argv
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, (argv, done.stderr)
        out = done.stdout.strip()
        if out.startswith("data: "):
            events = [line.removeprefix("data: ") for line in out.splitlines() if line]
            assert events[-1] == "[DONE]" and all(json.loads(e)["object"] == "text_completion" for e in events[:-1])
        elif out.isdigit():
            assert out == "200"
        else:
            body = json.loads(out)
            assert "error" in body or body["object"] in ("text_completion", "list"), body
            assert "error" not in body or body["error"]["param"] == "top_p", body


def test_the_listening_socket_turns_nagles_algorithm_off(live):
    """asyncio turns Nagle's algorithm off only on sockets that say TCP: with it on, a stream's events
    on a kept-alive connection waited for the client's delayed ACK and came in one burst at the end."""
    listening = live.server.http.socket
    assert listening.proto == socket.IPPROTO_TCP
    assert listening.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
