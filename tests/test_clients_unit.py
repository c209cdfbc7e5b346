"""The clients' pure parts, no server: error mapping, targets, requests, retries, statistics."""

import json
import math
import random
from dataclasses import fields

import grpc
import pytest

from attnserve.clients import errors
from attnserve.clients.bench import BenchConfig, describe_prompts
from attnserve.clients.bench_prompts import make_prompts, make_token_prompts
from attnserve.clients.bench_report import RequestRecord, distribution_ms, format_table, percentile, summarize_level
from attnserve.clients.channel import ChannelConfig, TlsConfig, parse_targets, split_host_port
from attnserve.clients.retry import NO_RETRY, RetryPolicy, check_timeout
from attnserve.clients.types import (
    GenerationParams,
    ParamFields,
    StreamAccumulator,
    TokenizerInfo,
    build_request,
    finish_reason_name,
)
from attnserve.v1 import generation_pb2 as pb


class StatusError(grpc.RpcError):
    """An RpcError as grpc raises it: code() and details()."""

    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK])
def test_every_status_code_maps_to_its_own_exception(code):
    error = errors.from_rpc_error(StatusError(code, "why"))
    assert type(error) is errors.ERRORS[code] and type(error) is not errors.AttnserveError
    assert error.code is code and error.details == "why"
    assert str(error) == f"{code.name}: why"


def test_named_exceptions_and_exit_statuses():
    assert errors.ERRORS[grpc.StatusCode.RESOURCE_EXHAUSTED] is errors.ResourceExhausted
    assert errors.ERRORS[grpc.StatusCode.UNAUTHENTICATED] is errors.Unauthenticated
    assert errors.exit_status(errors.InvalidArgument("x")) == 2
    assert errors.exit_status(errors.Unavailable("x")) == 1
    assert errors.retryable(errors.Unavailable("x"))
    assert not errors.retryable(errors.ResourceExhausted("x"))
    assert not errors.retryable(errors.DeadlineExceeded("x"))


@pytest.mark.parametrize(
    "target, expected",
    [
        ("127.0.0.1:5001", ("127.0.0.1:5001", None)),
        ("localhost", ("localhost:50051", None)),
        ("[::1]:7", ("[::1]:7", None)),
        ("127.0.0.1:5001,127.0.0.1:5002", ("ipv4:127.0.0.1:5001,127.0.0.1:5002", None)),
        (["127.0.0.1:5001", " 127.0.0.2:5002"], ("ipv4:127.0.0.1:5001,127.0.0.2:5002", None)),
        (["[::1]:5", "[::1]:6"], ("ipv6:[::1]:5,[::1]:6", None)),
        (["localhost:5001", "127.0.0.1:5002"], ("ipv4:127.0.0.1:5001,127.0.0.1:5002", "localhost")),
        ("dns:///example.com:443", ("dns:///example.com:443", None)),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", ("ipv4:10.0.0.1:1,10.0.0.2:1", None)),
        ("unix:/tmp/attnserve.sock", ("unix:/tmp/attnserve.sock", None)),
    ],
)
def test_targets(target, expected):
    assert parse_targets(target) == expected


@pytest.mark.parametrize("bad", ["", ",", ":5", "host:port", ["127.0.0.1:1", "[::1]:2"]])
def test_bad_targets_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError):
        parse_targets(bad)


def test_channel_arguments_balance_round_robin_and_carry_the_token():
    config = ChannelConfig(["localhost:1", "127.0.0.1:2"], tls=TlsConfig(), token="s3cret")
    target, args = config.channel_args()
    assert target == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert json.loads(dict(args)["grpc.service_config"])["loadBalancingConfig"] == [{"round_robin": {}}]
    assert ("grpc.ssl_target_name_override", "localhost") in args
    assert config.metadata() == (("authorization", "Bearer s3cret"),)
    assert ChannelConfig("127.0.0.1:1").metadata() == ()
    assert split_host_port("example.com:443") == ("example.com", 443)


def test_mutual_tls_needs_certificate_and_key(tmp_path):
    (tmp_path / "c.pem").write_bytes(b"cert")
    with pytest.raises(ValueError, match="both"):
        TlsConfig.from_files(cert=tmp_path / "c.pem")


def test_bare_request_leaves_sampling_unset_so_the_server_decodes_greedily():
    request = build_request("hi")
    assert request == pb.GenerateRequest(prompt="hi")
    for name in ("max_new_tokens", "top_p", "repetition_penalty", "seed"):
        assert not request.HasField(name)
    full = build_request(
        "hi",
        max_new_tokens=3,
        top_p=0.5,
        repetition_penalty=1.2,
        seed=0,
        stop="\n",
        temperature=0.7,
        top_k=5,
        request_id="r1",
    )
    assert full.HasField("seed") and full.seed == 0 and list(full.stop) == ["\n"]
    assert (full.max_new_tokens, full.top_k, full.request_id) == (3, 5, "r1")


def test_finish_reasons_are_lowercase_names():
    assert [finish_reason_name(v) for v in range(5)] == ["", "length", "stop", "eos", "cancelled"]


def test_stream_accumulator_adds_deltas_up_to_the_result():
    acc = StreamAccumulator()
    assert acc.feed(pb.GenerateStreamResponse(request_id="r", text="a", token_ids=[97])).text == "a"
    assert acc.feed(pb.GenerateStreamResponse(request_id="r", token_ids=[0xC3])).text == ""
    final = pb.GenerateStreamResponse(
        request_id="r",
        text="é",
        token_ids=[0xA9],
        finish_reason=pb.FINISH_REASON_EOS,
        usage=pb.Usage(prompt_tokens=2, completion_tokens=3),
    )
    acc.feed(final)
    result = acc.result
    assert (result.text, result.token_ids, result.finish_reason) == ("aé", (97, 0xC3, 0xA9), "eos")
    assert acc.result.usage.completion_tokens == 3 and acc.messages == 3


def test_params_are_written_once_and_keywords_override_them():
    params = GenerationParams(max_new_tokens=3, top_k=5, stop=["\n"])
    assert build_request("hi", params, seed=1) == build_request("hi", max_new_tokens=3, top_k=5, stop="\n", seed=1)
    assert params.stop == ("\n",) and GenerationParams(stop="ab").stop == ("ab",)  # one sequence, not two
    assert params.replace() is params and params.replace(top_k=1).top_k == 1 and params.top_k == 5
    assert build_request("hi", GenerationParams()) == build_request("hi") == pb.GenerateRequest(prompt="hi")
    assert set(ParamFields.__annotations__) == {f.name for f in fields(GenerationParams)}


def test_retry_policy_becomes_grpcs_service_config():
    policy = RetryPolicy(max_attempts=4, initial_backoff=0.1, max_backoff=0.3, jitter=0.0)
    config = json.loads(ChannelConfig("127.0.0.1:1", retry=policy).service_config())
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "attnserve.v1.TextGeneration"}]  # health checks answer at once
    assert method["waitForReady"] is False
    assert method["retryPolicy"] == {
        "maxAttempts": 4,
        "initialBackoff": "0.125000s",  # gRPC's fixed jitter of 20% then never comes sooner than 0.1 s
        "maxBackoff": "0.375000s",
        "backoffMultiplier": 2.0,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert RetryPolicy().method_config()["retryPolicy"]["initialBackoff"] == "0.100000s"  # jitter 0.2 is gRPC's
    patient = RetryPolicy(max_attempts=40).method_config()  # over gRPC's cap of 5: wait for a server
    assert patient["waitForReady"] is True and patient["retryPolicy"]["maxAttempts"] == 5
    assert "retryPolicy" not in NO_RETRY.method_config()
    assert config["retryThrottling"] == {"maxTokens": 10, "tokenRatio": 0.1}  # gRPC's token bucket
    assert "retryThrottling" not in json.loads(ChannelConfig(retry=NO_RETRY).service_config())
    assert RetryPolicy().method_config(timeout=0.5)["retryPolicy"]["maxAttempts"] == 3  # 0.12 + 0.24 s fit
    assert "retryPolicy" not in RetryPolicy().method_config(timeout=0.1)  # not even one backoff fits
    assert ("grpc.enable_retries", 0) in ChannelConfig(retry=NO_RETRY).channel_args()[1]
    bad_buckets = (dict(throttle_tokens=0), dict(throttle_tokens=1001), dict(throttle_ratio=0.0001))
    for bad in (dict(max_attempts=0), dict(jitter=1.0), dict(initial_backoff=0), *bad_buckets):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)
    with pytest.raises(ValueError):
        check_timeout(0)


def test_percentiles_interpolate_like_numpy_linear():
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 50) == 35.0
    assert percentile(values, 90) == pytest.approx(46.0)  # numpy.percentile(values, 90)
    assert percentile(values, 99) == pytest.approx(49.6)
    assert percentile([7.0], 99) == 7.0 and math.isnan(percentile([], 50))
    shuffled = list(range(101))
    random.Random(0).shuffle(shuffled)
    assert [percentile(shuffled, q) for q in (0, 50, 90, 100)] == [0, 50, 90, 100]
    assert distribution_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_level_summary_counts_tokens_throughput_and_errors():
    ok = [
        RequestRecord(
            start=0.0,
            end=1.0,
            first_token=0.1,
            itl=[0.3] * 3,
            tokens=4,
            reported_tokens=4,
            prompt_tokens=8,
            finish_reason="length",
        ),
        RequestRecord(
            start=0.5,
            end=2.0,
            first_token=0.7,
            itl=[0.4] * 2,
            tokens=3,
            reported_tokens=3,
            prompt_tokens=8,
            finish_reason="eos",
        ),
    ]
    failed = RequestRecord(start=0.2, end=0.3, status="RESOURCE_EXHAUSTED")
    level = summarize_level(ok + [failed], mode="closed", concurrency=2)
    assert (level["completed"], level["errors"]) == (2, {"RESOURCE_EXHAUSTED": 1})
    assert level["duration_s"] == 2.0 and level["output_tokens_per_s"] == 3.5
    assert level["output_tokens"] == level["reported_completion_tokens"] == 7
    assert level["token_count_mismatches"] == 0
    assert level["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert level["e2e_ms"]["mean"] == pytest.approx(1250.0)
    assert level["itl_ms"]["p99"] == pytest.approx(400.0)
    assert level["tpot_ms"]["p50"] == pytest.approx(((1.0 - 0.1) / 3 + (2.0 - 0.7) / 2) * 500)
    table = format_table([level])
    assert "c=2" in table and "3.5" in table and len(table.splitlines()) == 3


def test_prompts_have_the_requested_token_count_and_are_deterministic():
    prompts = make_prompts(20, 48, seed=3)
    assert all(len(p.encode()) + 1 == 48 for p in prompts)  # BOS + bytes
    assert prompts == make_prompts(20, 48, seed=3) and prompts != make_prompts(20, 48, seed=4)
    assert len(set(prompts)) > 10
    assert all(len(p) == 2999 for p in make_prompts(3, 3000, seed=0))


def test_level_summary_counts_output_bytes_beside_tokens():
    records = [
        RequestRecord(start=0.0, end=2.0, tokens=3, reported_tokens=3, output_bytes=5),
        RequestRecord(start=1.0, end=2.0, tokens=1, reported_tokens=1, output_bytes=3),
        RequestRecord(start=0.5, end=0.6, output_bytes=99, status="UNAVAILABLE"),
    ]
    level = summarize_level(records, mode="poisson", rate=2.0)
    assert (level["output_bytes"], level["output_bytes_per_s"]) == (8, 4.0)  # failures left out
    assert level["output_tokens_per_s"] == 2.0
    header, _, row = format_table([level]).splitlines()
    assert "out tok/s" in header and "out B/s" in header and " 4.0 " in row


def test_token_prompts_have_exact_lengths_and_no_special_ids():
    tokenizer = TokenizerInfo("bytes", bos_id=256, eos_id=257, pad_id=258, vocab_size=259)
    prompts = make_token_prompts(20, 48, seed=3, tokenizer=tokenizer)
    assert all(len(p) == 48 and all(0 <= i < 256 for i in p) for p in prompts)
    assert prompts == make_token_prompts(20, 48, seed=3, tokenizer=tokenizer)
    assert prompts != make_token_prompts(20, 48, seed=4, tokenizer=tokenizer)
    assert len(set(map(tuple, prompts))) == 20
    assert BenchConfig(prompt_tokens=1, prompt_ids=True).check() is None  # no BOS needed


def test_the_report_says_what_prompt_tokens_means_for_each_tokenizer():
    bpe = TokenizerInfo("bpe", bos_id=0, eos_id=0, pad_id=1, vocab_size=1024)
    text = describe_prompts(BenchConfig(prompt_tokens=16, prompt_ids=False), bpe)
    assert text.startswith("text: 15 ASCII bytes") and "byte tokenizer's length" in text
    assert "exactly 16" in describe_prompts(BenchConfig(prompt_tokens=16), bpe)  # the default: token ids


@pytest.mark.parametrize(
    "bad",
    [
        dict(concurrency=(), rates=()),
        dict(concurrency=(0,)),
        dict(rates=(-1.0,)),
        dict(prompt_tokens=1, prompt_ids=False),
        dict(requests=0),
        dict(prompt_tokens=0),
    ],
)
def test_bench_config_refuses_what_cannot_run(bad):
    with pytest.raises(ValueError):
        BenchConfig(**bad).check()


@pytest.mark.parametrize("count", [1, 2, 3, 7, 10, 32, 101])
def test_a_mix_gives_each_kind_its_share_of_the_requests_in_an_order_drawn_from_the_seed(count):
    from attnserve.clients.bench_mix import MIXES, assign

    kinds = MIXES["production"]
    assert sum(k.share for k in kinds) == pytest.approx(1.0)
    assigned = assign(kinds, count, seed=3)
    assert len(assigned) == count
    for kind in kinds:
        assert abs(assigned.count(kind) - kind.share * count) < 1, (kind.name, count)
    assert assign(kinds, count, seed=3) == assigned
    if count >= 10:
        assert any(assign(kinds, count, seed=s) != assigned for s in range(4, 8))
