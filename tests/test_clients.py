"""Client and AsyncClient against a real server: every method, streaming, cancel and deadlines."""

import asyncio

import pytest
from fixtures_server import idle, release_once_ended, start_server, wait_until

from attnserve.clients import NO_RETRY, AsyncClient, Client, DeadlineExceeded, GenerationResult, StreamDelta

PROMPT = "def parse_args("


def finished(server, reason: str) -> float:
    """The server's count of generations that ended for `reason` (its Prometheus counter)."""
    registry = server.server.metrics.registry
    labels = {"reason": reason}
    return registry.get_sample_value("attnserve_generations_finished_total", labels) or 0


@pytest.fixture
def live(server):
    """The shared server, unpaced, left idle for the next test."""
    server.pacer.reset()
    yield server
    server.pacer.reset()
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


@pytest.fixture
def one_slot(tiny_model_dir):
    """A server that decodes one request at a time and queues one more, held at its first step with a
    batch (the first token out) until the test releases it: a request lasts as long as the test needs."""
    running = start_server(tiny_model_dir, max_batch=1, max_queue=1)
    running.pacer.hold()
    yield running
    running.stop()


def check_result(result: GenerationResult, max_new_tokens: int) -> None:
    assert isinstance(result.text, str) and result.request_id
    assert result.finish_reason in ("length", "eos", "stop")
    assert len(result.token_ids) == result.usage.completion_tokens <= max_new_tokens
    assert result.usage.prompt_tokens == len(PROMPT) + 1
    assert 0 <= result.timings.time_to_first_token_ms <= result.timings.total_ms


def test_generate_returns_a_plain_result(live):
    with Client(live.target, timeout=10) as client:
        result = client.generate(PROMPT, max_new_tokens=12, request_id="req-1")
    check_result(result, 12)
    assert result.request_id == "req-1"
    assert result.to_dict()["token_ids"] == list(result.token_ids)


def test_stream_deltas_add_up_to_the_generate_result(live):
    with Client(live.target, timeout=10) as client:
        whole = client.generate(PROMPT, max_new_tokens=16)
        stream = client.stream(PROMPT, max_new_tokens=16)
        deltas = list(stream)
        result = stream.result()
    assert all(isinstance(d, StreamDelta) for d in deltas) and len(deltas) >= 1
    assert "".join(d.text for d in deltas) == result.text == whole.text
    assert tuple(t for d in deltas for t in d.token_ids) == result.token_ids == whole.token_ids
    check_result(result, 16)


def test_model_info_and_health(live):
    with Client(live.target, timeout=10) as client:
        info = client.model_info()
        assert client.health(timeout=2) is True
    assert (info.architecture, info.vocab_size, info.tokenizer.bos_id) == ("decoder", 259, 256)
    assert info.limits.max_batch_size == 8 and info.execution_provider == "CPUExecutionProvider"
    assert info.to_dict()["limits"]["max_queue_size"] == 64
    assert info.kv_cache == "arena" and info.kv_cache_bytes == 8 * 2 * 2 * 4 * 128 * 16 * 4  # 8 slots of tiny
    with Client("127.0.0.1:1", retry=NO_RETRY) as closed:
        assert closed.health(timeout=1) is False


def test_every_model_info_field_the_proto_has_reaches_the_python_type(live):
    """The client's ModelInfo, Limits and TokenizerInfo hold every field of the server's messages, with
    its value (the prefix cache's size among them)."""
    import dataclasses

    import grpc

    from attnserve.v1 import generation_pb2 as pb
    from attnserve.v1 import generation_pb2_grpc as rpc

    with grpc.insecure_channel(live.target) as channel:
        message = rpc.TextGenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    with Client(live.target, timeout=10) as client:
        info = client.model_info()
    for proto, typed in ((message, info), (message.limits, info.limits), (message.tokenizer, info.tokenizer)):
        names = {f.name for f in proto.DESCRIPTOR.fields}
        assert names <= {f.name for f in dataclasses.fields(typed)}, names - {f.name for f in dataclasses.fields(typed)}
        for name in names - {"limits", "tokenizer"}:
            assert getattr(typed, name) == getattr(proto, name), name
    assert info.prefix_cache_bytes == message.prefix_cache_bytes > 0


def test_async_client_methods_and_concurrent_streams(live):
    async def main():
        async with AsyncClient(live.target, timeout=10) as client:
            assert await client.health(timeout=2) is True
            info = await client.model_info()
            whole = await client.generate(PROMPT, max_new_tokens=10)
            streams = [client.stream(PROMPT, max_new_tokens=10) for _ in range(4)]
            texts = await asyncio.gather(*(collect(s) for s in streams))
            results = [await s.result() for s in streams]
        return info, whole, texts, results

    async def collect(stream):
        return "".join([delta.text async for delta in stream])

    info, whole, texts, results = asyncio.run(main())
    assert info.vocab_size == 259
    check_result(whole, 10)
    assert texts == [whole.text] * 4  # greedy: the same alone or batched
    assert all(r.token_ids == whole.token_ids for r in results)


def test_cancelling_a_stream_frees_its_slot_on_the_server(one_slot):
    with Client(one_slot.target, timeout=20) as client:
        stream = client.stream(PROMPT, max_new_tokens=100)
        next(stream)  # the first token; the engine is held before the second
        stream.cancel()
        assert list(stream) == []
        assert stream.result().finish_reason == "cancelled" and stream.result().usage is None
        release_once_ended(one_slot)
        wait_until(lambda: idle(one_slot.engine), what="the cancelled request to leave its slot")
        after = client.generate(PROMPT, max_new_tokens=3)  # admitted to the only slot
    assert after.usage.completion_tokens == 3
    wait_until(lambda: finished(one_slot, "cancelled") == 1, timeout=2, what="the cancel metric")


def test_cancelling_the_reading_task_cancels_the_call(one_slot):
    async def main():
        async with AsyncClient(one_slot.target, timeout=20) as client:
            stream = client.stream(PROMPT, max_new_tokens=100)

            reading = asyncio.Event()

            async def read():
                async for _ in stream:
                    reading.set()

            task = asyncio.create_task(read())
            await reading.wait()  # the first token came; the engine is held before the second
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(release_once_ended, one_slot)
            return await client.generate(PROMPT, max_new_tokens=2)

    assert asyncio.run(main()).usage.completion_tokens == 2
    wait_until(lambda: idle(one_slot.engine), timeout=2, what="the cancelled request to leave")


def test_async_stream_cancel_stops_iteration(one_slot):
    async def main():
        async with AsyncClient(one_slot.target, timeout=20) as client:
            async with client.stream(PROMPT, max_new_tokens=100) as stream:
                await stream.__anext__()  # the first token; the engine is held before the second
                stream.cancel()
                assert [d async for d in stream] == []
            return await stream.result()

    assert asyncio.run(main()).finish_reason == "cancelled"
    release_once_ended(one_slot)
    wait_until(lambda: idle(one_slot.engine), timeout=2, what="the cancelled request to leave")


def test_deadline_exceeded_on_every_kind_of_call(one_slot):
    """The engine is held while the calls' 0.3 s pass: each ends DEADLINE_EXCEEDED, never completed."""
    with Client(one_slot.target, timeout=0.3) as client:
        with pytest.raises(DeadlineExceeded):
            client.generate(PROMPT, max_new_tokens=100)
        with pytest.raises(DeadlineExceeded):  # queued behind the first
            list(client.stream(PROMPT, max_new_tokens=100, timeout=0.3))
        release_once_ended(one_slot)
        assert client.generate(PROMPT, max_new_tokens=2, timeout=5).usage.completion_tokens == 2

    async def main():
        async with AsyncClient(one_slot.target, timeout=0.3) as client:
            with pytest.raises(DeadlineExceeded):
                await client.generate(PROMPT, max_new_tokens=100)
            with pytest.raises(DeadlineExceeded):
                await client.stream(PROMPT, max_new_tokens=100).result()

    one_slot.pacer.hold()
    asyncio.run(main())
    release_once_ended(one_slot)
    wait_until(lambda: idle(one_slot.engine), timeout=2, what="expired requests to leave")
