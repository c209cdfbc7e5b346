"""/v1/chat/completions over a model exported with a chat template (`attnserve export --chat-template`):
OpenAI's own client gets the completion of the prompt the template renders (written out by hand here),
unary and streamed, with chat's shapes (an assistant message, deltas, logprobs.content) and
response_format's JSON schema honoured; a model without a template, bad messages and a template that
does not compile are refused as documented; the chat request reads straight into the session's fields,
each named as chat sent it."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from fixtures_export import CHAT_TEMPLATE
from fixtures_server import idle, wait_until

from attnserve.engine.domain import InvalidRequest
from attnserve.export.onnx_export import ExportError, export_checkpoint
from attnserve.runtime.contract import read_manifest
from attnserve.server.http_openai.request import read_chat
from attnserve.server.session.request import Structure
from attnserve.server.session.validation import RequestLimits
from attnserve.tokenizer.chat_template import ChatTemplate

TEMPLATE = CHAT_TEMPLATE  # the shared chat model's (fixtures_export.py)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The list"}]
RENDERED = "System: Be brief.\nUser: The list\nAssistant:"  # TEMPLATE applied to MESSAGES, by hand
TIMEOUT = 60


@pytest.fixture
def client(chat_server):
    url = f"http://127.0.0.1:{chat_server.server.http.port}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT) as c:
        yield c
    wait_until(lambda: idle(chat_server.engine), what="the chat server to go idle")


def test_the_export_writes_the_template_into_tokenizer_config_under_the_manifests_hash(chat_model_dir):
    assert json.loads((chat_model_dir / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    read_manifest(chat_model_dir, verify=True)  # the file as written is the one the manifest hashes


def test_a_chat_completion_is_the_completion_of_the_rendered_prompt(chat_server, client):
    name = chat_server.server.info.model_name
    plain = client.completions.create(model=name, prompt=RENDERED, max_tokens=16, temperature=0)
    chat = client.chat.completions.create(model=name, messages=MESSAGES, max_completion_tokens=16, temperature=0)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    (choice,) = chat.choices
    assert choice.message.role == "assistant" and choice.message.content == plain.choices[0].text
    assert choice.finish_reason == plain.choices[0].finish_reason
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    chunks = list(
        client.chat.completions.create(
            model=name,
            messages=MESSAGES,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_a_chats_prompt_logprobs_are_at_its_top_and_the_rendered_prompts(chat_server, client):
    """vLLM's chat puts prompt_logprobs at the response's top, once: the same entries as a completion
    of the rendered prompt; streamed, in the chunk that ends the first choice."""
    name, extra = chat_server.server.info.model_name, {"prompt_logprobs": 2}
    plain = client.completions.create(model=name, prompt=RENDERED, max_tokens=0, temperature=0, extra_body=extra)
    chat = client.chat.completions.create(
        model=name, messages=MESSAGES, max_completion_tokens=2, temperature=0, n=2, extra_body=extra
    )
    expected = plain.choices[0].model_extra["prompt_logprobs"]
    assert chat.model_extra["prompt_logprobs"] == expected and expected[0] is None
    assert len(expected) == chat.usage.prompt_tokens and all(
        "prompt_logprobs" not in c.model_extra for c in chat.choices
    )
    chunks = list(
        client.chat.completions.create(
            model=name, messages=MESSAGES, max_tokens=2, temperature=0, stream=True, extra_body=extra
        )
    )
    (ending,) = [c for c in chunks if (c.model_extra or {}).get("prompt_logprobs")]
    assert ending.model_extra["prompt_logprobs"] == expected and ending.choices[0].finish_reason is not None


def test_chat_logprobs_and_a_json_schema_response_format(chat_server, client):
    name = chat_server.server.info.model_name
    chat = client.chat.completions.create(
        model=name, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    plain = client.completions.create(model=name, prompt=RENDERED, max_tokens=4, temperature=0, logprobs=2)
    content = chat.choices[0].logprobs.content
    assert [p.token for p in content] == plain.choices[0].logprobs.tokens
    assert [p.logprob for p in content] == plain.choices[0].logprobs.token_logprobs
    assert all(len(p.top_logprobs) == 2 and p.bytes == list(p.token.encode()) for p in content)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    schema.update(required=["n"], additionalProperties=False)
    shaped = client.chat.completions.create(
        model=name,
        messages=MESSAGES,
        max_tokens=30,
        temperature=1.0,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": schema}},
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content), schema)
    assert shaped.choices[0].finish_reason == "stop"


BAD = [
    ({"messages": []}, "messages", "messages: required: a non-empty list"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content: text"),
    ({"top_logprobs": 2}, "top_logprobs", "top_logprobs: needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs: 21 is outside [0, 20]"),
    ({"max_completion_tokens": 500}, "max_completion_tokens", "max_completion_tokens: 500 is outside"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format: one of"),
]


@pytest.mark.parametrize("fields, param, message", BAD, ids=[param for _, param, _ in BAD])
def test_bad_chat_input_is_400_naming_the_chat_field(chat_server, client, fields, param, message):
    fields = {"messages": MESSAGES, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=chat_server.server.info.model_name, **fields)
    assert error.value.body["param"] == param and error.value.body["message"].startswith(message)


def test_a_chat_reads_into_the_sessions_fields_named_as_chat_sent_them():
    limits = RequestLimits(context_length=256, vocab_size=256, max_new_tokens=128)
    encoded = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return list(text.encode())

    body = {"model": "m", "messages": MESSAGES, "max_tokens": 9, "max_completion_tokens": 5, "logprobs": True}
    body.update(top_logprobs=2, response_format={"type": "json_object"}, stream=True, seed=3)
    call = read_chat(body, ChatTemplate(TEMPLATE), limits, encode)
    request = call.request
    assert encoded == [RENDERED] and request.prompt_token_ids == tuple(RENDERED.encode()) and not request.prompt
    assert (request.max_new_tokens, request.logprobs, request.seed) == (5, 2, 3)
    assert request.structured_output == Structure("json_schema", '{"type": "object"}')
    assert (call.model, call.stream, call.echo) == ("m", True, False)
    named = {name: request.named(name) for name in ("prompt_token_ids", "max_new_tokens", "logprobs", "seed")}
    named["structured_output.json_schema"] = request.named("structured_output.json_schema")
    assert named == {
        "prompt_token_ids": "messages",
        "max_new_tokens": "max_completion_tokens",
        "logprobs": "top_logprobs",
        "seed": "seed",
        "structured_output.json_schema": "response_format",
    }
    with pytest.raises(InvalidRequest, match="top_logprobs: -1 is not a non-negative integer"):
        read_chat({**body, "top_logprobs": -1}, ChatTemplate(TEMPLATE), limits, encode)
    encoded.clear()
    with pytest.raises(InvalidRequest, match="echo: unknown field for chat"):
        read_chat({**body, "echo": True}, ChatTemplate(TEMPLATE), limits, encode)
    assert encoded == []  # refused before the template renders or the tokenizer runs


def test_the_export_refuses_a_template_that_does_not_compile_or_a_byte_tokenizer(
    tiny_bpe_checkpoint, tiny_checkpoint, tmp_path
):
    with pytest.raises(ExportError, match="--chat-template: the chat template does not compile"):
        export_checkpoint(tiny_bpe_checkpoint, tmp_path / "broken", chat_template="{% for m in messages %}")
    with pytest.raises(ExportError, match=r"lives in a BPE model's tokenizer_config\.json"):
        export_checkpoint(tiny_checkpoint, tmp_path / "bytes", chat_template=TEMPLATE)
    assert not (tmp_path / "broken").exists() and not (tmp_path / "bytes").exists()
