"""The Open Inference Protocol through Triton's own client (tritonclient.grpc) against a real server:
health and metadata, ModelInfer equal to attnserve.v1 Generate, ModelStreamInfer equal to ModelInfer,
bad tensors refused naming the tensor, token auth and TLS applied to the protocol too."""

import json
import queue
import struct

import grpc
import numpy as np
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.inference import grpc_service_pb2 as oip
from attnserve.inference import grpc_service_pb2_grpc as oip_grpc
from attnserve.v1 import generation_pb2 as pb

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is a dev dependency")
from tritonclient.utils import InferenceServerException  # noqa: E402

TIMEOUT = 30
PROMPTS = ["The server", "a", "Καλημέρα", "def f(x):\n    return"]


@pytest.fixture
def triton(server, stub):
    """tritonclient on the shared server, and the model's name in the protocol."""
    client = grpcclient.InferenceServerClient(url=server.target)
    yield client, server.server.info.model_name
    client.close()


def bytes_input(name: str, value: str | bytes) -> "grpcclient.InferInput":
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode() if isinstance(value, str) else value], dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> "grpcclient.InferInput":
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def inputs(prompt: str, stream: bool = False, exclude: bool | None = True, **sampling) -> list:
    tensors = [bytes_input("text_input", prompt), bool_input("stream", stream)]
    if exclude is not None:
        tensors.append(bool_input("exclude_input_in_output", exclude))
    if sampling:
        tensors.append(bytes_input("sampling_parameters", json.dumps(sampling)))
    return tensors


def text_of(result) -> str:
    return b"".join(result.as_numpy("text_output")).decode()


def stream_all(client, model: str, requests: list[tuple[str, list, dict]], errors: int = 0) -> dict[str, list]:
    """Send every (id, inputs, parameters) on one ModelStreamInfer; each id's results until its final
    one, and under "errors" the in-band errors (which carry no id), `errors` of them expected."""
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        for request_id, tensors, parameters in requests:
            client.async_stream_infer(model, tensors, request_id=request_id, parameters=parameters or None)
        results: dict[str, list] = {request_id: [] for request_id, _, _ in requests}
        results["errors"] = []
        finished = 0
        while finished + len(results["errors"]) < len(requests):
            result, error = received.get(timeout=TIMEOUT)
            if error is not None:
                results["errors"].append(error)
                continue
            response = result.get_response()
            results[response.id].append(result)
            finished += response.parameters["triton_final_response"].bool_param
        assert len(results["errors"]) == errors, results["errors"]
        return results
    finally:
        client.stop_stream()


def test_live_ready_and_metadata(triton, server):
    client, model = triton
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(model) and client.is_model_ready(model, "1")
    assert not client.is_model_ready("another-model") and not client.is_model_ready(model, "2")
    metadata = client.get_server_metadata()
    assert metadata.name == "attnserve" and metadata.version == server.server.info.server_version
    model_metadata = client.get_model_metadata(model)
    assert model_metadata.name == model and list(model_metadata.versions) == ["1"]
    assert {(t.name, t.datatype) for t in model_metadata.inputs} >= {
        ("text_input", "BYTES"),
        ("stream", "BOOL"),
        ("sampling_parameters", "BYTES"),
        ("exclude_input_in_output", "BOOL"),
    }
    assert ("text_output", "BYTES") in {(t.name, t.datatype) for t in model_metadata.outputs}


def test_model_infer_greedy_text_equals_generate(triton, stub):
    client, model = triton
    for prompt in PROMPTS:
        expected = stub.Generate(request(prompt, max_new_tokens=24), timeout=TIMEOUT).text
        result = client.infer(model, inputs(prompt, max_tokens=24), client_timeout=TIMEOUT)
        assert text_of(result) == expected, prompt
        with_prompt = client.infer(model, inputs(prompt, exclude=None, max_tokens=24))
        assert text_of(with_prompt) == prompt + expected  # the vLLM backend's default: the prompt comes back too


def test_sampling_fields_as_request_parameters_and_extra_outputs(triton, stub):
    client, model = triton
    expected = stub.Generate(request("The server", max_new_tokens=10, stop=["e"]), timeout=TIMEOUT)
    tensors = [
        *inputs("The server"),
        bool_input("return_finish_reason", True),
        bool_input("return_num_output_tokens", True),
    ]
    result = client.infer(model, tensors, parameters={"max_tokens": 10, "stop": "e"})
    assert text_of(result) == expected.text
    assert result.as_numpy("finish_reason")[0].decode() == ("stop" if expected.finish_reason == 2 else "length")
    assert int(result.as_numpy("num_output_tokens")[0]) == expected.usage.completion_tokens
    seeded = dict(max_tokens=16, temperature=0.8, top_k=20, seed=7)
    first = text_of(client.infer(model, inputs("abc", **seeded)))
    assert first == text_of(client.infer(model, inputs("abc", **{k: str(v) for k, v in seeded.items()})))  # as strings
    assert first == stub.Generate(request("abc", max_new_tokens=16, temperature=0.8, top_k=20, seed=7)).text


def test_the_controls_in_sampling_parameters_give_what_generate_gives(triton, stub):
    """vLLM's names for the controls (stop_token_ids, min_tokens, ignore_eos, logit_bias with string
    keys, priority): ModelInfer's text, finish reason and token count are Generate's with the same fields."""
    client, model = triton
    free = stub.Generate(request("The server", max_new_tokens=30), timeout=TIMEOUT)
    stop_id, bias_id = free.token_ids[6], free.token_ids[0]
    fields = {"stop_token_ids": [stop_id], "min_new_tokens": 3, "ignore_eos": True, "logit_bias": {bias_id: -5.0}}
    expected = stub.Generate(request("The server", max_new_tokens=30, priority=2, **fields), timeout=TIMEOUT)
    assert expected.text != free.text  # the bias changed the first token
    sampling = {"max_tokens": 30, "stop_token_ids": [stop_id], "min_tokens": 3, "ignore_eos": True}
    sampling.update(logit_bias={str(bias_id): -5.0}, priority=2)
    tensors = [*inputs("The server", **sampling), bool_input("return_finish_reason", True)]
    tensors.append(bool_input("return_num_output_tokens", True))
    result = client.infer(model, tensors, client_timeout=TIMEOUT)
    assert text_of(result) == expected.text
    assert result.as_numpy("finish_reason")[0].decode() == ("stop" if expected.finish_reason == 2 else "length")
    assert int(result.as_numpy("num_output_tokens")[0]) == expected.usage.completion_tokens


def test_guided_json_and_guided_regex_give_what_structured_output_gives(triton, stub):
    """vLLM's guided_json (an object, or its JSON text) and guided_regex: ModelInfer's text is Generate's
    with the same structured_output, sampled with the same seed."""
    client, model = triton
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}}}
    schema.update(required=["id", "ok"], additionalProperties=False)
    for guided, structure in (
        ({"guided_json": schema}, pb.StructuredOutput(json_schema=json.dumps(schema))),
        ({"guided_json": json.dumps(schema)}, pb.StructuredOutput(json_schema=json.dumps(schema))),
        ({"guided_regex": "[a-z]{2,6}!"}, pb.StructuredOutput(regex="[a-z]{2,6}!")),
    ):
        fields = dict(max_new_tokens=40, temperature=0.9, seed=11)
        expected = stub.Generate(request("The server", structured_output=structure, **fields), timeout=TIMEOUT)
        assert expected.finish_reason == pb.FINISH_REASON_STOP
        result = client.infer(model, inputs("The server", max_tokens=40, temperature=0.9, seed=11, **guided))
        assert text_of(result) == expected.text, guided


def test_stream_infer_text_equals_the_unary_text_and_ends_with_the_final_flag(triton, server):
    client, model = triton
    server.pacer.lockstep = True  # a step at a time, so that the first delta goes before the end on any machine
    unary = {p: text_of(client.infer(model, inputs(p, max_tokens=24))) for p in PROMPTS}
    streamed = stream_all(
        client, model, [(str(i), inputs(p, stream=True, max_tokens=24), {}) for i, p in enumerate(PROMPTS)]
    )
    for i, prompt in enumerate(PROMPTS):
        results = streamed[str(i)]
        assert "".join(text_of(r) for r in results) == unary[prompt], prompt
        flags = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
        assert flags[-1] and not any(flags[:-1])
        assert len(results) >= 2  # decoupled: the first delta comes before the end


def test_stream_interval_through_the_protocol(triton, server):
    client, model = triton
    server.pacer.lockstep = True  # a step at a time, so that every step is a message without an interval
    every = stream_all(client, model, [("a", inputs("The server", stream=True, max_tokens=40), {})])["a"]
    paced = stream_all(
        client, model, [("b", inputs("The server", stream=True, max_tokens=40, stream_interval_tokens=10), {})]
    )["b"]
    assert "".join(map(text_of, paced)) == "".join(map(text_of, every))
    assert len(paced) <= 2 + 40 // 10 < len(every)


def test_stream_infer_without_stream_is_one_final_response(triton):
    client, model = triton
    results = stream_all(client, model, [("x", inputs("The server", max_tokens=8), {})])["x"]
    assert len(results) == 1 and results[0].get_response().parameters["triton_final_response"].bool_param


BAD = [
    ([bytes_input("prompt", "x")], "inputs[0]: unknown input 'prompt'"),
    ([bool_input("text_input", True)], "text_input: datatype BOOL, expected BYTES"),
    ([bytes_input("stream", "yes"), bytes_input("text_input", "x")], "stream: datatype BYTES, expected BOOL"),
    ([bool_input("stream", True)], "text_input: missing"),
    (
        [bytes_input("text_input", "x"), bytes_input("sampling_parameters", "{max_tokens: 3")],
        "sampling_parameters: not JSON",
    ),
    ([bytes_input("text_input", "x"), bytes_input("sampling_parameters", "[1]")], "sampling_parameters: a JSON object"),
    (
        [bytes_input("text_input", "x"), bytes_input("sampling_parameters", "[" * 100_000 + "]" * 100_000)],
        "sampling_parameters: JSON nested too deep",
    ),
    (inputs("x", max_tokens=0), "sampling_parameters.max_tokens: 0 is outside [1, "),
    (inputs("x", top_p=2), "sampling_parameters.top_p: 2 is outside (0, 1]"),
    (inputs("x", best_of=2), "sampling_parameters.best_of: 2 is not supported without use_beam_search"),
    (inputs("x", use_beam_search=True, best_of=2, temperature=1), "sampling_parameters.temperature: beam search"),
    (inputs("x", use_beam_search=True, best_of=99), "sampling_parameters.best_of: 99 is outside [1, "),
    (inputs("x", early_stopping="soon"), "sampling_parameters.early_stopping: 'soon' is not true, false or"),
    (inputs("x", ignore_eos="maybe"), "sampling_parameters.ignore_eos: 'maybe' is not true or false"),
    (inputs("x", logit_bias={"x": 1}), "sampling_parameters.logit_bias: {'x': 1} is not an object of token id"),
    (inputs("x", logit_bias={"7": 101}), "sampling_parameters.logit_bias[7]: 101 is outside [-100, 100]"),
    (inputs("x", stop_token_ids=[99999]), "sampling_parameters.stop_token_ids[0]: 99999 is outside [0, "),
    (inputs("x", min_tokens=-1), "sampling_parameters.min_tokens: -1 is not a non-negative integer"),
    (inputs("x", max_tokens=3, min_tokens=4), "sampling_parameters.min_tokens: 4 is more than max_new_tokens 3"),
    (inputs("x", guided_json='{"type": 1}'), "sampling_parameters.guided_json: type must be a string"),
    (inputs("x", guided_json=[1]), "sampling_parameters.guided_json: [1] is not a JSON schema"),
    (inputs("x", guided_regex="(a"), "sampling_parameters.guided_regex: at 1(8): invalid regex"),
    (inputs("x", guided_regex="a", guided_json={}), "sampling_parameters.guided_json: give guided_json or guided_"),
    ([bytes_input("text_input", b"\xff")], "text_input: not UTF-8"),
    (inputs("", max_tokens=3), "text_input: must not be empty"),
    (inputs("x", stream=True, exclude=False), "exclude_input_in_output: false is not allowed when streaming"),
    (inputs("x", stream=True), "stream: true needs ModelStreamInfer"),
]


@pytest.mark.parametrize("tensors, message", BAD, ids=[message.split(":")[0] for _, message in BAD])
def test_bad_tensors_are_invalid_argument_naming_the_tensor(triton, tensors, message):
    client, model = triton
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, tensors)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.value.message().startswith(message), error.value.message()


def test_bad_shapes_and_unknown_models(triton):
    client, model = triton
    two = grpcclient.InferInput("text_input", [2], "BYTES")
    two.set_data_from_numpy(np.array([b"a", b"b"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, [two])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.value.message() == "text_input: shape [2], expected one element ([1])"
    for name, version in (("no-such-model", ""), (model, "2")):
        with pytest.raises(InferenceServerException) as error:
            client.infer(name, inputs("x"), model_version=version)
        assert error.value.status() == "StatusCode.NOT_FOUND" and "is not served here" in error.value.message()


def test_a_bad_request_on_a_stream_is_an_in_band_error_and_the_stream_goes_on(triton):
    client, model = triton
    results = stream_all(
        client,
        model,
        [
            ("bad", inputs("x", stream=True, top_k=-5), {}),
            ("good", inputs("The server", stream=True, max_tokens=5), {}),
        ],
        errors=1,
    )
    (error,) = results["errors"]
    assert error.message().startswith("sampling_parameters.top_k: -5 is outside [0, 259]"), error.message()
    assert results["good"] and results["good"][-1].get_response().parameters["triton_final_response"].bool_param


def raw_request(model: str, *raw: bytes, datatypes=("BYTES",)) -> oip.ModelInferRequest:
    message = oip.ModelInferRequest(model_name=model)
    for i, datatype in enumerate(datatypes):
        message.inputs.add(name=["text_input", "stream"][i], datatype=datatype, shape=[1])
    message.raw_input_contents.extend(raw)
    return message


def test_malformed_raw_contents_are_invalid_argument(server, triton):
    """What tritonclient never sends: raw bytes that do not match the tensors, from a plain gRPC stub."""
    _, model = triton
    stub = oip_grpc.GRPCInferenceServiceStub(server.channel)
    cases = [
        (raw_request(model, b"\x05\x00\x00\x00abc"), "text_input: 7 raw bytes are not one BYTES element"),
        (raw_request(model, struct.pack("<I", 1) + b"a", b"", datatypes=("BYTES", "BOOL")), "stream: 0 raw bytes"),
        (raw_request(model, b"", b""), "raw_input_contents: 2 entries for 1 inputs"),
    ]
    for message, expected in cases:
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(message, timeout=TIMEOUT)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith(expected), error.value.details()
    typed = oip.ModelInferRequest(model_name=model)
    typed.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"The server")
    assert stub.ModelInfer(typed, timeout=TIMEOUT).raw_output_contents  # typed contents work too


def test_calls_are_counted_in_the_metrics(triton, server):
    client, model = triton
    registry = server.server.metrics.registry
    sample = lambda code: (
        registry.get_sample_value("attnserve_requests_total", {"method": "ModelInfer", "code": code}) or 0
    )
    ok, bad = sample("OK"), sample("INVALID_ARGUMENT")
    client.infer(model, inputs("x", max_tokens=2))
    with pytest.raises(InferenceServerException):
        client.infer(model, inputs("x", max_tokens=0))
    assert (sample("OK"), sample("INVALID_ARGUMENT")) == (ok + 1, bad + 1)


def test_token_auth_applies_to_the_protocol(tiny_model_dir, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    running = start_server(tiny_model_dir, auth_token_file=str(token_file), warmup=False)
    client = grpcclient.InferenceServerClient(url=running.target)
    try:
        model = running.server.info.model_name
        for call in (
            lambda h: client.is_server_ready(headers=h),
            lambda h: client.infer(model, inputs("x"), headers=h),
        ):
            with pytest.raises(InferenceServerException) as error:
                call(None)
            assert error.value.status() == "StatusCode.UNAUTHENTICATED"
            assert call({"authorization": "Bearer s3cret"})
    finally:
        client.close()
        running.stop()


def test_tls_applies_to_the_protocol(tiny_model_dir, pki, stub):
    folder, _ = pki
    running = start_server(tiny_model_dir, tls_cert=str(folder / "server.crt"), tls_key=str(folder / "server.key"))
    try:
        model = running.server.info.model_name
        secure = grpcclient.InferenceServerClient(url=running.target, ssl=True, root_certificates=str(folder / "ca"))
        expected = stub.Generate(request("x", max_new_tokens=3), timeout=TIMEOUT).text  # the shared server's
        assert secure.is_server_live() and text_of(secure.infer(model, inputs("x", max_tokens=3))) == expected
        secure.close()
        plain = grpcclient.InferenceServerClient(url=running.target)
        with pytest.raises(InferenceServerException) as error:
            plain.is_server_live()
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        plain.close()
    finally:
        running.stop()


def test_cancelling_a_stream_frees_its_requests_slots(server, triton):
    """A client that goes away mid-stream: every request it had running leaves the engine."""
    _, model = triton
    server.pacer.hold(when=lambda: server.engine.stats()["active"] == 3)  # all three run until released
    stub = oip_grpc.GRPCInferenceServiceStub(server.channel)
    requests = []
    for i in range(3):
        message = oip.ModelInferRequest(model_name=model, id=str(i))
        message.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"abc")
        message.inputs.add(name="stream", datatype="BOOL", shape=[1]).contents.bool_contents.append(True)
        requests.append(message)
    cancelled = lambda: (
        server.server.metrics.registry.get_sample_value("attnserve_generations_finished_total", {"reason": "cancelled"})
        or 0
    )
    before = cancelled()
    call = stub.ModelStreamInfer(iter(requests), timeout=TIMEOUT)
    first = next(call)
    assert first.infer_response.raw_output_contents
    wait_until(server.pacer.held.is_set, what="the engine to hold with the three requests running")
    calls = server.server.metrics.registry.get_sample_value
    labels = {"method": "ModelStreamInfer", "code": "CANCELLED"}
    ended = calls("attnserve_requests_total", labels) or 0
    call.cancel()
    # The server has seen the cancel before the engine goes on: else the requests may end by length.
    wait_until(lambda: calls("attnserve_requests_total", labels) == ended + 1, what="the server to see the cancel")
    server.pacer.release()
    wait_until(lambda: idle(server.engine), what="the cancelled stream's requests to leave the engine")
    assert cancelled() == before + 3  # cancelled, not run to their end
