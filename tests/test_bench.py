"""`attnserve bench` against a real server: the report's numbers agree with the server's."""

import json
import re
from collections import Counter

import pytest
from fixtures_server import idle, release_when, start_server, wait_until

from attnserve.cli import main

LATENCIES = ("ttft_ms", "itl_ms", "e2e_ms", "tpot_ms")
REFUSED = {"method": "GenerateStream", "code": "RESOURCE_EXHAUSTED"}


@pytest.fixture
def live(server):
    server.pacer.reset()
    yield server
    server.pacer.reset()
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


def counter(server, name: str, labels: dict | None = None) -> float:
    return server.server.metrics.registry.get_sample_value(name, labels or {}) or 0


def bench(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["bench", *args])
    out, err = capsys.readouterr()
    return status, out, err


def check_level(level: dict, requests: int, max_new_tokens: int, prompt_tokens: int) -> None:
    assert (level["requests"], level["completed"], level["errors"]) == (requests, requests, {})
    assert level["output_bytes_per_s"] == pytest.approx(level["output_bytes"] / level["duration_s"], rel=1e-2)
    assert level["output_tokens"] == level["reported_completion_tokens"]  # counted == usage
    assert level["token_count_mismatches"] == 0
    assert 0 < level["output_tokens"] <= requests * max_new_tokens
    assert level["prompt_tokens"] == requests * prompt_tokens
    assert level["requests_per_s"] == pytest.approx(requests / level["duration_s"], rel=1e-2)
    assert level["output_tokens_per_s"] == pytest.approx(level["output_tokens"] / level["duration_s"], rel=1e-2)
    for key in LATENCIES:
        stats = level[key]
        if stats["p50"] is None and key == "itl_ms":  # no request's tokens came in a second message: on a busy
            assert level["messages_per_request"] == 1, level  # machine a short one's may come in one
        elif stats["p50"] is None and key == "tpot_ms":  # no request had a second token
            assert level["output_tokens"] == level["completed"], level
        else:
            assert 0 <= stats["p50"] <= stats["p90"] <= stats["p99"], (key, stats)
    assert level["ttft_ms"]["p50"] <= level["e2e_ms"]["p50"]
    assert level["e2e_ms"]["p99"] <= 1000 * level["duration_s"]


def test_concurrency_sweep_report_table_and_plot(live, capsys, tmp_path):
    from PIL import Image

    live.pacer.lockstep = True  # a token per message, so inter-token gaps are measured
    calls = counter(live, "attnserve_requests_total", {"method": "GenerateStream", "code": "OK"})
    tokens = counter(live, "attnserve_generated_tokens_total")
    out_json, out_png = tmp_path / "r" / "bench.json", tmp_path / "bench.png"
    out_json.parent.mkdir()  # bench creates the files, not their directories (a typo'd path is refused)
    status, out, err = bench(
        capsys,
        "--target",
        live.target,
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--max-new-tokens",
        "8",
        "--prompt-tokens",
        "16",
        "--prompt-text",
        "--warmup",
        "2",
        "--out",
        str(out_json),
        "--plot",
        str(out_png),
    )
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])  # the JSON report is the last line
    assert report == json.loads(out_json.read_text())
    assert [(lv["mode"], lv["concurrency"]) for lv in report["levels"]] == [("closed", 1), ("closed", 2)]
    for level in report["levels"]:
        check_level(level, requests=4, max_new_tokens=8, prompt_tokens=16)
    assert report["model"]["vocab_size"] == 259 and report["config"]["requests"] == 4
    assert report["prompts"] == "text: 15 ASCII bytes per request, 16 tokens with BOS"
    served = lambda: (
        counter(
            live,
            "attnserve_requests_total",
            {"method": "GenerateStream", "code": "OK"},
        )
        - calls
    )
    wait_until(lambda: served() == 2 + 2 * 4, timeout=2, what="warm-up + two levels of 4 calls")
    generated = counter(live, "attnserve_generated_tokens_total") - tokens
    measured = sum(level["output_tokens"] for level in report["levels"])
    assert measured <= generated <= measured + 2 * 8  # the rest is the warm-up's
    assert "c=1" in out and "c=2" in out and "TTFT ms p50/p90/p99" in out
    assert "concurrency 2: 4/4 requests, 0 failed" in err
    with Image.open(out_png) as image:
        assert image.format == "PNG" and image.size[0] > 600 and image.size[1] > 300
    check_stamped(report, out_json, err)
    title = f"attnserve bench: {report['model']['model_name']} at {live.target}"
    assert f"![{title}](../bench.png)" in out_json.with_suffix(".md").read_text()  # linked from beside the JSON


def check_stamped(report: dict, out_json, err: str) -> None:
    """The JSON carries the stamp (the server's provider in it), and the Markdown report is beside it."""
    stamp = report["stamp"]
    assert stamp["provider"] == report["model"]["execution_provider"] != ""
    assert stamp["tree"] and stamp["command"] and len(stamp["load_before"]) == len(stamp["load_after"]) == 3
    markdown = out_json.with_suffix(".md")
    assert f"[attnserve bench] wrote {out_json} and {markdown}" in err
    text = markdown.read_text()
    assert f"```sh\n{stamp['command']}\n```" in text and f"| tree | {stamp['tree']} |" in text
    assert "| mode | concurrency | rate | requests | completed |" in text
    assert "| closed | 1 | - | 4 | 4 |" in text and "| closed | 2 | - | 4 | 4 |" in text


def test_open_loop_rate(live, capsys):
    live.pacer.lockstep = True
    status, out, _ = bench(
        capsys,
        "--target",
        live.target,
        "--rate",
        "100",
        "--requests",
        "4",
        "--max-new-tokens",
        "4",
        "--warmup",
        "0",
        "--seed",
        "1",
    )
    assert status == 0
    (level,) = json.loads(out.splitlines()[-1])["levels"]
    assert (level["mode"], level["rate"], level["concurrency"]) == ("poisson", 100.0, None)
    check_level(level, requests=4, max_new_tokens=4, prompt_tokens=32)
    assert "rate=100/s" in out


def test_default_prompts_are_exact_token_ids_and_output_bytes_are_counted(live, capsys):
    live.pacer.lockstep = True  # a token per message, so inter-token gaps are measured
    status, out, err = bench(
        capsys,
        "--target",
        live.target,
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--max-new-tokens",
        "6",
        "--prompt-tokens",
        "20",
        "--warmup",
        "1",
    )
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])
    (level,) = report["levels"]
    check_level(level, requests=4, max_new_tokens=6, prompt_tokens=20)
    assert level["output_bytes_per_s"] > 0 and level["output_bytes"] > 0
    assert report["config"]["prompt_ids"] is True and report["prompts"].startswith("token ids")
    assert report["stamp"]["provider"] == report["model"]["execution_provider"]  # stamped without --out too
    assert "out B/s" in out


def test_failures_are_counted_by_status_code(tiny_model_dir, capsys):
    running = start_server(tiny_model_dir, max_batch=1, max_queue=1)
    running.pacer.hold()  # the first request holds the slot, the second the queue, until one is refused
    release_when(running.pacer, lambda: counter(running, "attnserve_requests_total", REFUSED) >= 1)
    try:
        status, out, _ = bench(
            capsys,
            "--target",
            running.target,
            "--concurrency",
            "6",
            "--requests",
            "12",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
        )
    finally:
        running.stop()
    (level,) = json.loads(out.splitlines()[-1])["levels"]
    assert status == 0 and level["completed"] >= 1
    assert level["errors"].get("RESOURCE_EXHAUSTED", 0) >= 1
    assert level["completed"] + sum(level["errors"].values()) == 12


def test_refusals_exit_with_one_line(live, capsys):
    status, out, err = bench(capsys, "--target", live.target, "--max-new-tokens", "100000")
    assert (status, out) == (2, "") and "INVALID_ARGUMENT: --max-new-tokens 100000" in err
    status, _, err = bench(capsys, "--target", live.target, "--concurrency", "0")
    assert status == 2 and err.startswith("attnserve bench: error: --concurrency")
    status, _, err = bench(capsys, "--target", "127.0.0.1:1", "--timeout", "0.5")
    assert status == 1 and err.startswith("attnserve bench: error: UNAVAILABLE")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--stream-interval-tokens", "0"), "--stream-interval-tokens: 0 is outside [1, 4294967295]"),
        (("--stream-interval-ms", "-5"), "--stream-interval-ms: -5 is outside [0, 60000]"),
        (("--plot", "report.txt"), "--plot report.txt: matplotlib writes "),
    ],
)
def test_bad_flags_are_refused_before_connecting(capsys, flags, message):
    """Checked before anything is sent: the target does not even answer (it would be UNAVAILABLE, exit 1)."""
    status, out, err = bench(capsys, "--target", "127.0.0.1:1", "--timeout", "0.5", *flags)
    assert (status, out) == (2, "")
    assert err.startswith(f"attnserve bench: error: {message}") and len(err.strip().splitlines()) == 1


def test_a_stream_interval_over_the_servers_cap_is_refused_before_the_run(live, capsys):
    status, out, err = bench(capsys, "--target", live.target, "--stream-interval-tokens", "100000")
    assert (status, out) == (2, "")
    assert "--stream-interval-tokens 100000 is over the server's max_new_tokens cap" in err


def test_plot_without_matplotlib_is_refused_before_the_run(live, capsys, monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # a client-only install: import fails
    status, out, err = bench(
        capsys, "--target", live.target, "--concurrency", "1", "--requests", "1", "--plot", str(tmp_path / "x.png")
    )
    assert (status, out) == (2, "")
    assert (
        err.strip()
        == "attnserve bench: error: --plot needs matplotlib (pip install matplotlib), which is not installed"
    )


def test_stream_interval_flags_reach_the_server_and_the_report_counts_messages(live, capsys):
    """The same greedy run with --stream-interval-tokens 8: the same tokens in fewer messages."""
    live.pacer.lockstep = True  # a step at a time, so that every step is a message without an interval
    runs = {}
    for interval in ("1", "8"):
        common = ["--target", live.target, "--concurrency", "1", "--requests", "2", "--warmup", "0"]
        status, out, _ = bench(capsys, *common, "--max-new-tokens", "32", "--stream-interval-tokens", interval)
        assert status == 0
        runs[interval] = json.loads(out.strip().splitlines()[-1])["levels"][0]
    assert runs["8"]["output_tokens"] == runs["1"]["output_tokens"] == 64
    assert runs["8"]["messages_per_request"] <= 2 + 32 // 8 < runs["1"]["messages_per_request"]


def accepted_since(server, before: int) -> list:
    """The requests the server accepted after the first `before`."""
    return server.pacer.requests[before:]


def test_the_sampling_flags_reach_the_server_with_a_seed_of_the_runs(live, capsys):
    """Every request decodes as the flags say, with a seed drawn from --seed: the same run twice
    sends the same seeds."""
    flags = ["--temperature", "0.8", "--top-p", "0.95", "--top-k", "50", "--repetition-penalty", "1.1"]
    common = ["--target", live.target, "--concurrency", "2", "--requests", "3", "--warmup", "0"]
    common += ["--max-new-tokens", "4"]
    seeds = []
    for _ in range(2):
        before = len(live.pacer.requests)
        status, out, _ = bench(capsys, *common, *flags, "--logprobs", "3")
        assert status == 0
        report = json.loads(out.strip().splitlines()[-1])
        assert report["levels"][0]["completed"] == 3
        sampling = {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1, "logprobs": 3}
        name = "temperature 0.8, top_k 50, top_p 0.95, repetition_penalty 1.1, logprobs 3"
        assert report["kinds"] == [{"kind": name, "share": 1.0, "sampling": sampling, "requests": 3}]
        requests = accepted_since(live, before)
        assert len(requests) == 3
        for request in requests:
            s = request.sampling
            sent = (s.temperature, s.top_p, s.top_k, s.repetition_penalty)
            assert sent == pytest.approx((0.8, 0.95, 50, 1.1))  # float32 on the wire
            assert request.logprobs == 3 and s.seed is not None
        seeds.append(sorted(r.sampling.seed for r in requests))
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 3


def test_a_mix_sends_each_kind_its_share(live, capsys):
    """--mix production over 10 requests: 7 sampled at temperature 0.7, top_p 0.9 (each with a seed),
    2 greedy, 1 greedy with logprobs 5; the report says so, and breaks each level down by kind (its
    requests, tokens and latencies; the table a row each)."""
    before = len(live.pacer.requests)
    common = ["--target", live.target, "--concurrency", "4", "--requests", "10", "--warmup", "0"]
    status, out, _ = bench(capsys, *common, "--max-new-tokens", "4", "--mix", "production")
    assert status == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["levels"][0]["completed"] == 10
    assert [(k["kind"], k["requests"]) for k in report["kinds"]] == [
        ("temperature 0.7, top_p 0.9", 7),
        ("greedy", 2),
        ("greedy, logprobs 5", 1),
    ]
    kinds = Counter(
        (round(r.sampling.temperature, 6), round(r.sampling.top_p, 6), r.logprobs, r.sampling.seed is not None)
        for r in accepted_since(live, before)
    )
    assert kinds == {(0.7, 0.9, None, True): 7, (0.0, 1.0, None, False): 2, (0.0, 1.0, 5, False): 1}
    level = report["levels"][0]
    split = level["by_kind"]
    assert {kind: k["requests"] for kind, k in split.items()} == {
        "temperature 0.7, top_p 0.9": 7,
        "greedy": 2,
        "greedy, logprobs 5": 1,
    }
    assert sum(k["output_tokens"] for k in split.values()) == level["output_tokens"]
    assert sum(k["output_token_share"] for k in split.values()) == pytest.approx(1.0, abs=1e-3)
    assert all(k["completed"] == k["requests"] and k["ttft_ms"]["p50"] > 0 for k in split.values())
    table = [re.split(r"\s{2,}", line.strip())[:4] for line in out.splitlines()]
    assert ["greedy, logprobs 5:", "1", "0", "10%"] in table, out
    _, plain, _ = bench(capsys, *common, "--max-new-tokens", "4")
    assert json.loads(plain.strip().splitlines()[-1])["levels"][0]["by_kind"] == {}  # one kind: no breakdown


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--top-p", "0"), "--top-p: 0 is outside (0, 1]"),
        (("--logprobs", "21"), "--logprobs: 21 is outside [0, 20]"),
        (("--temperature", "-1"), "--temperature: -1 is outside [0, 100]"),
        (("--mix", "production", "--temperature", "0.8"), "--mix production sets each request's sampling: give it"),
    ],
)
def test_bad_sampling_flags_are_refused_before_connecting(capsys, flags, message):
    status, out, err = bench(capsys, "--target", "127.0.0.1:1", "--timeout", "0.5", *flags)
    assert (status, out) == (2, "")
    assert err.startswith(f"attnserve bench: error: {message}") and len(err.strip().splitlines()) == 1, err


def test_no_pass_of_a_run_repeats_another_passs_prompts(live, capsys):
    """The warm-up and each level draw prompts of their own, and another --seed draws others again: with the
    prefix cache on, no level of either run is served a cached block (prompts of 37 tokens, blocks of 16).
    The same command run again sends the same prompts, and its levels are then served from the cache."""
    flags = ["--target", live.target, "--concurrency", "1,2", "--rate", "50", "--requests", "3"]
    flags += ["--max-new-tokens", "4", "--prompt-tokens", "37", "--warmup", "2"]
    runs = []
    for seed in ("9137", "9138", "9137"):
        status, out, err = bench(capsys, *flags, "--seed", seed)
        assert status == 0, err
        runs.append(json.loads(out.splitlines()[-1])["levels"])
    for levels in runs[:2]:
        assert [level["cached_prompt_tokens"] for level in levels] == [0, 0, 0]
        for level in levels:
            check_level(level, requests=3, max_new_tokens=4, prompt_tokens=37)
    assert [level["cached_prompt_tokens"] for level in runs[2]] == [3 * 32] * 3  # two blocks of each prompt
