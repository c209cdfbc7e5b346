"""What operators of vLLM and TGI look for: a name for the served model other than its directory's
(--served-model-name), and a periodic log line of throughput, batch and queue (--log-stats-interval)."""

import logging
import time

import numpy as np
import pytest
from fixtures_server import idle, request, start_server, wait_until

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


def test_the_stats_line_says_what_the_server_did_and_an_idle_server_says_nothing(named, caplog):
    caplog.set_level(logging.INFO, logger="attnserve.server")
    wait_until(lambda: idle(named.engine), TIMEOUT)
    time.sleep(0.5)  # the earlier requests' line is written
    caplog.clear()
    lines = lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("generated ")]
    ended = lambda: [line for line in lines() if "1 length" in line or "1 eos" in line]
    reply = named.stub.Generate(request("The ", max_new_tokens=20), timeout=TIMEOUT)
    wait_until(lambda: bool(ended()), TIMEOUT, "the stats line of the interval the request ended in")
    (line,) = ended()
    assert " tokens/s, prompt " in line and "running 0, queued 0" in line, line
    assert len(reply.token_ids) > 0
    caplog.clear()
    time.sleep(1.0)  # five intervals of an idle server
    assert lines() == []
