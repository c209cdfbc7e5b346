"""The start-up warm-up fills the batch: as many short generations at once as the server has slots (at
most --max-queue), so ONNX Runtime meets the largest batch's shapes before the first request does."""

from fixtures_server import start_server


def warm_ups(running) -> list:
    return [r for r in running.pacer.requests if r.request_id.startswith("warm-up")]


def test_the_warm_up_decodes_a_whole_batch(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=8)
    try:
        sent, sizes, finals = warm_ups(running), list(running.pacer.batch_sizes), list(running.pacer.finals)
    finally:
        running.stop()
    assert len(sent) == 8 and len({r.request_id for r in sent}) == 8
    assert max(sizes) == 8  # one step decoded all of them together
    assert len(finals) == 8 and all(f.usage.completion_tokens == 2 for f in finals)


def test_the_warm_up_sends_no_more_than_the_queue_takes(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=8, max_queue=3)
    try:
        sent, sizes = warm_ups(running), list(running.pacer.batch_sizes)
    finally:
        running.stop()
    assert len(sent) == 3 and max(sizes) == 3


def test_a_core_of_its_own_decodes_the_warm_up_in_one_batch(tiny_model_dir):
    """Through the engine core's process: the requests go in one message, and one step decodes them all."""
    running = start_server(tiny_model_dir, max_batch=8, engine_core="process")
    try:
        sent, sizes = warm_ups(running), list(running.pacer.batch_sizes)
    finally:
        running.stop()
    assert len(sent) == 8 and max(sizes) == 8
