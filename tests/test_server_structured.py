"""Structured output on a real server over the tiny models (issue 24): a JSON schema or a regular
expression constrains every completion, sampled or greedy, unary or streamed, one completion or n, on
the BPE model and on the byte model, neither of which was trained on JSON; the rows that do not ask
are left alone; a schema or pattern that does not compile is INVALID_ARGUMENT saying why."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.cli import main
from attnserve.clients.client import Client
from attnserve.v1 import generation_pb2 as pb

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "admin"],
    "additionalProperties": False,
}
COLOUR = {"enum": ["red", "green", "blue", 42, None]}
NUMBERS = {"type": "array", "items": {"type": "integer", "minimum": -999, "maximum": 999}, "minItems": 1, "maxItems": 5}
SCHEMAS = {"person": PERSON, "colour": COLOUR, "numbers": NUMBERS}
CODE = r"[A-Z]{3}-[0-9]{2,4}( [a-z]{1,8}){0,2}"
PROMPT = "The list"


def constrained(**kind) -> pb.StructuredOutput:
    return pb.StructuredOutput(**kind)


def schema(value) -> pb.StructuredOutput:
    return constrained(json_schema=json.dumps(value))


@pytest.fixture(scope="module")
def bpe_server(tiny_bpe_model_dir):
    running = start_server(tiny_bpe_model_dir, metrics_port=0)
    yield running
    running.stop()


@pytest.fixture
def bpe(bpe_server):
    yield bpe_server.stub
    wait_until(lambda: idle(bpe_server.engine), what="the BPE server to go idle")


def texts(reply: pb.GenerateResponse) -> list[str]:
    return [completion.text for completion in reply.completions]


def test_200_sampled_generations_under_three_schemas_and_a_regex_all_validate(bpe):
    """Temperature 1 on a model that never saw JSON: 7 requests of 8 completions per constraint (224
    completions), every one complete (STOP) and valid; the same seeds unconstrained give no JSON."""
    structures = {name: schema(value) for name, value in SCHEMAS.items()} | {"code": constrained(regex=CODE)}
    calls = [
        (name, structure, seed)
        for name, structure in structures.items()
        for seed in range(0, 7 * 8, 8)  # completion i samples with seed + i: 56 distinct streams
    ]

    def run(call):
        name, structure, seed = call
        fields = dict(max_new_tokens=100, temperature=1.0, seed=seed, n=8, structured_output=structure)
        return name, bpe.Generate(request(PROMPT, **fields), timeout=120)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(run, calls))
    outputs: dict[str, list[str]] = {name: [] for name in structures}
    for name, reply in replies:
        assert [c.finish_reason for c in reply.completions] == [pb.FINISH_REASON_STOP] * 8, texts(reply)
        outputs[name] += texts(reply)
    assert sum(len(found) for found in outputs.values()) == 224
    for name, value in SCHEMAS.items():
        for text in outputs[name]:
            jsonschema.validate(json.loads(text), value)
    for name in ("person", "numbers", "code"):
        assert len(set(outputs[name])) > 8, outputs[name]  # sampled, not one answer repeated
    assert len(set(outputs["colour"])) > 1, outputs["colour"]  # of its 5 values
    assert all(re.fullmatch(CODE, text) for text in outputs["code"]), outputs["code"]
    free = bpe.Generate(request(PROMPT, max_new_tokens=40, temperature=1.0, seed=0, n=8), timeout=60)
    assert not any(text.startswith(("{", "[", '"')) for text in texts(free)), texts(free)


def test_the_byte_model_is_constrained_too_streamed_as_unary(stub):
    fields = dict(max_new_tokens=110, temperature=1.0, seed=5, structured_output=schema(PERSON))
    reply = stub.Generate(request(PROMPT, **fields), timeout=60)
    jsonschema.validate(json.loads(reply.text), PERSON)
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    streamed = list(stub.GenerateStream(request(PROMPT, **fields), timeout=60))
    assert "".join(m.text for m in streamed) == reply.text and streamed[-1].finish_reason == pb.FINISH_REASON_STOP
    assert [t for m in streamed for t in m.token_ids] == list(reply.token_ids)
    code = stub.Generate(request(PROMPT, max_new_tokens=40, structured_output=constrained(regex=CODE)), timeout=60)
    assert re.fullmatch(CODE, code.text), code.text


def test_a_forced_token_has_probability_one_and_the_alternatives_are_only_allowed_ids(stub):
    """Greedy under the regex `yes|no`: after its first byte only one id may follow (logprob 0)."""
    fields = dict(max_new_tokens=10, logprobs=3, structured_output=constrained(regex="yes|no"))
    reply = stub.Generate(request(PROMPT, **fields), timeout=60)
    assert reply.text in ("yes", "no") and reply.finish_reason == pb.FINISH_REASON_STOP
    first, *rest = reply.logprobs
    assert {alt.text for alt in first.top if alt.logprob > float("-inf")} == {"y", "n"}
    assert all(p.logprob == 0.0 for p in rest) and len(rest) == len(reply.text) - 1


def test_a_constrained_row_leaves_the_other_rows_of_its_batch_alone(server, stub):
    """A free greedy request decodes the same tokens beside constrained ones as alone."""
    alone = stub.Generate(request(PROMPT, max_new_tokens=60), timeout=60)
    server.pacer.hold()
    calls = [stub.Generate.future(request(PROMPT, max_new_tokens=60), timeout=60)]
    wait_until(server.pacer.held.is_set, what="the free request to hold the engine after its first token")
    calls += [
        stub.Generate.future(request(PROMPT, max_new_tokens=100, structured_output=schema(PERSON)), timeout=60)
        for _ in range(3)
    ]
    wait_until(lambda: server.engine.stats()["queued"] == 3, what="the constrained requests to queue")
    server.pacer.release()  # they join the free one's batch at the next step
    free, *shaped = [call.result() for call in calls]
    assert list(free.token_ids) == list(alone.token_ids) and free.text == alone.text
    for reply in shaped:
        jsonschema.validate(json.loads(reply.text), PERSON)


def test_the_grammar_wins_over_ignore_eos_and_min_new_tokens(stub):
    for extra in ({"ignore_eos": True}, {"min_new_tokens": 20}):
        fields = dict(max_new_tokens=30, structured_output=constrained(regex="abc"), **extra)
        reply = stub.Generate(request(PROMPT, **fields), timeout=60)
        assert reply.text == "abc" and reply.finish_reason == pb.FINISH_REASON_STOP, extra


def test_max_new_tokens_still_cuts_a_constrained_completion(stub):
    fields = dict(max_new_tokens=3, structured_output=schema(PERSON))
    reply = stub.Generate(request(PROMPT, **fields), timeout=60)
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH and reply.text == '{"n'


BAD = [
    ({"structured_output": constrained(json_schema='{"type": "nope"}')}, "structured_output.json_schema: Invalid type"),
    ({"structured_output": constrained(json_schema="{x")}, "structured_output.json_schema: not JSON: Expecting"),
    ({"structured_output": constrained(json_schema="[1]")}, "structured_output.json_schema: a schema is a JSON object"),
    ({"structured_output": constrained(regex="[a-z")}, "structured_output.regex: at 1(8): invalid regex"),
    ({"structured_output": constrained(regex="")}, "structured_output.regex: 0 UTF-8 bytes, must be 1 to 32768"),
    ({"structured_output": constrained(regex="a" * 32769)}, "structured_output.regex: 32769 UTF-8 bytes"),
    ({"structured_output": pb.StructuredOutput()}, "structured_output: set json_schema or regex"),
    (
        {"structured_output": constrained(json_schema="[" * 16000 + "]" * 16000)},
        "structured_output.json_schema: JSON nes",
    ),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_schema_or_pattern_that_does_not_compile_is_invalid_argument_saying_why(stub, fields, message):
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request(PROMPT, max_new_tokens=5, **fields), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(message) and "\n" not in error.value.details()


def test_the_limit_is_in_get_model_info_and_constrained_requests_are_counted(server, stub):
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_structure_bytes == 32768
    registry = server.server.metrics.registry
    count = lambda: registry.get_sample_value("attnserve_request_controls_total", {"control": "structured_output"}) or 0
    before = count()
    stub.Generate(request(PROMPT, max_new_tokens=8, structured_output=constrained(regex="[a-z]+")), timeout=30)
    stub.Generate(request(PROMPT, max_new_tokens=8), timeout=30)
    assert count() - before == 1


def test_the_python_client_takes_a_schema_as_a_mapping_and_a_regex(server, stub):
    with Client(server.target) as client:
        person = client.generate(PROMPT, max_new_tokens=110, temperature=1.0, seed=9, json_schema=PERSON)
        code = client.generate(PROMPT, max_new_tokens=40, regex=CODE)
        streamed = "".join(d.text for d in client.stream(PROMPT, max_new_tokens=40, regex=CODE))
    jsonschema.validate(json.loads(person.text), PERSON)
    assert re.fullmatch(CODE, code.text) and streamed == code.text
    with pytest.raises(ValueError, match="json_schema or regex, not both"):
        client.generate(PROMPT, json_schema=PERSON, regex=CODE)


def test_attnserve_generate_takes_a_schema_inline_or_from_a_file_and_a_regex(server, stub, capsys, tmp_path):
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    base = ["generate", PROMPT, "--target", server.target, "--max-new-tokens", "110", "--temperature", "1"]
    outputs = []
    for given in (json.dumps(PERSON), f"@{tmp_path / 'person.json'}"):
        assert main([*base, "--seed", "4", "--json-schema", given]) == 0
        outputs.append(capsys.readouterr().out)
    fields = dict(max_new_tokens=110, temperature=1.0, seed=4, structured_output=schema(PERSON))
    assert outputs == [stub.Generate(request(PROMPT, **fields), timeout=60).text + "\n"] * 2
    assert main([*base, "--regex", CODE, "--no-stream", "--n", "3", "--seed", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:4] for line in lines] == ["[0] ", "[1] ", "[2] "]
    assert all(re.fullmatch(CODE, line[4:]) for line in lines), lines
