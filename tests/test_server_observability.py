"""What operators of vLLM and TGI look for: a name for the served model other than its directory's
(--served-model-name), and a periodic log line of throughput, batch and queue (--log-stats-interval)."""

import logging

import numpy as np
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.server.metrics import Metrics
from attnserve.server.stats_log import StatsLog
from attnserve.v1 import generation_pb2 as pb

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is a dev dependency")
from tritonclient.utils import InferenceServerException  # noqa: E402

NAME = "team/tiny-v2"
TIMEOUT = 60


@pytest.fixture(scope="module")
def named(tiny_model_dir):
    running = start_server(tiny_model_dir, served_model_name=NAME, metrics_port=0, log_stats_interval=0.2)
    yield running
    running.stop()


def test_the_served_name_is_the_models_name_everywhere(named, tiny_model_dir):
    """GetModelInfo, the Open Inference Protocol (a request must name it: the directory's name is
    NOT_FOUND) and the metrics' model label all say --served-model-name."""
    assert named.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT).model_name == NAME
    client = grpcclient.InferenceServerClient(url=named.target)
    try:
        assert client.get_model_metadata(NAME).name == NAME
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"The "], dtype=object))
        reply = client.infer(NAME, [text], parameters={"max_tokens": 4})
        assert reply.as_numpy("text_output")[0]
        with pytest.raises(InferenceServerException) as unknown:
            client.get_model_metadata(tiny_model_dir.name)
        assert "not served here" in str(unknown.value) and NAME in str(unknown.value)
    finally:
        client.close()
    label = named.server.metrics.registry.get_sample_value(
        "attnserve_model_info",
        {"model": NAME, "execution_provider": "CPUExecutionProvider", "dtype": "float32", "quantization": "none"},
    )
    assert label == 1.0


def test_a_front_end_more_says_its_number_and_not_the_steps_it_does_not_see():
    """--api-server-count: the engine's steps reach the first front end alone, so another's stats line
    tells its own requests, under its number, and no generated tokens/s (which would read 0)."""
    metrics = Metrics()
    waiting = lambda: {"active": 2, "queued": 1}
    first, other = StatsLog(metrics, waiting, 10.0), StatsLog(metrics, waiting, 10.0, front_end=2)
    assert first.line().startswith("generated ")
    line = other.line()
    assert line.startswith("front end 2: prompt ") and "generated" not in line, line
    assert "running 2, queued 1" in line, line


def test_the_stats_line_says_what_the_server_did_and_an_idle_server_says_nothing(named, caplog):
    """The server logs its line every interval with traffic; a reader of the same metrics, asked at
    moments the test picks (before and after one request, then again), says what the request did and
    then nothing: an idle interval writes no line."""
    caplog.set_level(logging.INFO, logger="attnserve.server")
    wait_until(lambda: idle(named.engine), TIMEOUT)
    reader = StatsLog(named.server.metrics, named.engine.stats, named.server.config.log_stats_interval)
    caplog.clear()
    reply = named.stub.Generate(request("The ", max_new_tokens=20), timeout=TIMEOUT)
    wait_until(lambda: idle(named.engine), TIMEOUT)
    line = reader.line()
    assert "1 length" in line or "1 eos" in line, line
    assert " tokens/s, prompt " in line and "running 0, queued 0" in line, line
    assert len(reply.token_ids) > 0
    assert reader.line() is None  # nothing happened since
    logged = lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("generated ")]
    wait_until(lambda: bool(logged()), TIMEOUT, "the server's own stats line of the request's interval")
