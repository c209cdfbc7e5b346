"""Prompts given as token ids: sent exactly as given, and the same completion as the equal text."""

import asyncio

import numpy as np
import pytest

from attnserve.clients import AsyncClient, Client, InvalidArgument
from attnserve.clients.types import build_request
from attnserve.v1 import generation_pb2 as pb

PROMPT = "def parse_args("


@pytest.fixture
def live(server, stub):
    """The shared server, unpaced and left idle afterwards (the stub fixture sees to both)."""
    return server


def byte_ids(client: Client, text: str) -> list[int]:
    """What the byte tokenizer makes of `text`: BOS, then its UTF-8 bytes."""
    return [client.model_info().tokenizer.bos_id, *text.encode("utf-8")]


@pytest.mark.parametrize("ids", [[256, 7, 0], (256, 7, 0), range(256, 257), np.array([5, 6])])
def test_a_sequence_of_ints_is_sent_as_prompt_token_ids(ids):
    request = build_request(ids, max_new_tokens=2)
    assert list(request.prompt_token_ids) == [int(i) for i in ids] and request.prompt == ""
    assert build_request("hi") == pb.GenerateRequest(prompt="hi")  # text as before


@pytest.mark.parametrize(
    "prompt, error, message",
    [
        ([], ValueError, "prompt_token_ids: must not be empty"),
        ([1, "2"], TypeError, r"prompt_token_ids\[1\]: '2' is not an int"),
        ([1, 2.0], TypeError, r"prompt_token_ids\[1\]"),
        ([True], TypeError, r"prompt_token_ids\[0\]"),
        (b"hi", TypeError, "bytes are ambiguous"),
        (None, TypeError, "not NoneType"),
    ],
)
def test_bad_prompts_are_refused_before_sending(prompt, error, message):
    with pytest.raises(error, match=message):
        build_request(prompt)


def test_tokenizer_info_reports_the_vocabulary_and_bos(live):
    with Client(live.target, timeout=10) as client:
        tokenizer = client.model_info().tokenizer
    assert (tokenizer.kind, tokenizer.vocab_size, tokenizer.bos_prepended) == ("bytes", 259, True)
    assert tokenizer.special_ids == {256, 257, 258}


def test_client_token_ids_give_the_completion_of_the_equal_text(live):
    with Client(live.target, timeout=10) as client:
        ids = byte_ids(client, PROMPT)
        text = client.generate(PROMPT, max_new_tokens=12)
        by_ids = client.generate(ids, max_new_tokens=12)
        streamed = client.stream(tuple(ids), max_new_tokens=12).result()
    assert by_ids.text == streamed.text == text.text and text.text
    assert by_ids.token_ids == streamed.token_ids == text.token_ids
    assert by_ids.usage == streamed.usage == text.usage
    assert text.usage.prompt_tokens == len(ids)


def test_async_client_token_ids_give_the_completion_of_the_equal_text(live):
    async def main(ids):
        async with AsyncClient(live.target, timeout=10) as client:
            text = await client.generate(PROMPT, max_new_tokens=12)
            by_ids = await client.generate(ids, max_new_tokens=12)
            streamed = await client.stream(ids, max_new_tokens=12).result()
        return text, by_ids, streamed

    with Client(live.target, timeout=10) as client:
        ids = byte_ids(client, PROMPT)
    text, by_ids, streamed = asyncio.run(main(ids))
    assert by_ids.text == streamed.text == text.text and text.text
    assert by_ids.token_ids == streamed.token_ids == text.token_ids


def test_an_id_outside_the_vocabulary_is_invalid_argument_naming_it(live):
    with Client(live.target, timeout=10) as client:
        vocab_size = client.model_info().tokenizer.vocab_size
        with pytest.raises(InvalidArgument, match=r"prompt_token_ids\[1\]"):
            client.generate([256, vocab_size, 100], max_new_tokens=2)
        with pytest.raises(InvalidArgument, match=r"prompt_token_ids\[0\]"):
            list(client.stream([-1], max_new_tokens=2))

    async def main():
        async with AsyncClient(live.target, timeout=10) as client:
            with pytest.raises(InvalidArgument, match=r"prompt_token_ids\[2\]"):
                await client.generate([256, 100, vocab_size + 5], max_new_tokens=2)

    asyncio.run(main())
