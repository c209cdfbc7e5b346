"""An encoder-decoder's cross arena laid out as wide as its longest source (KVArena.refit,
ArenaSeq2SeqDecoder.fit_sources): a refit keeps every slot's positions, and a served batch whose
longest source grows and shrinks while others decode still answers each request as PyTorch alone."""

from functools import partial

import numpy as np
from fixtures_server import idle, request, staggered, start_server, wait_until

from attnserve.runtime.arena import KVArena

TIMEOUT = 30


def filled(capacity: int, context: int, lengths: list[int]) -> KVArena:
    """An arena whose slots hold random positions, `lengths[slot]` of them (zeros past them)."""
    kv = KVArena(n_layers=2, n_heads=3, head_dim=4, context=context, capacity=capacity)
    rng = np.random.default_rng(5)
    for slot, length in enumerate(lengths):
        for buffer in kv.buffers:
            values = np.zeros(kv.shape[1:], np.float32)  # (H, L, D)
            values[:, :length] = rng.standard_normal((kv.n_heads, length, kv.head_dim))
            kv.device.upload(buffer.data_ptr() + slot * kv.slot_bytes, values)
        kv.lengths[slot] = length
    return kv


def test_a_refit_keeps_every_slots_positions_narrower_and_wider():
    lengths = [5, 0, 12, 3]  # an empty slot among full ones; the last slot's rows end the copied span
    kv = filled(capacity=5, context=32, lengths=lengths)
    before = [kv.read(slot) for slot in range(len(lengths))]
    for width in (16, 12, 24, 32, 12):
        kv.refit(width)
        assert kv.width == width and kv.slot_bytes == kv.n_heads * width * kv.head_dim * 4
        for slot, held in enumerate(before):
            for kept, now in zip(held, kv.read(slot)):
                np.testing.assert_array_equal(kept, now)
    assert kv.nbytes == KVArena.bytes_needed(2, 3, 4, 32, 5, "float32")  # the allocation stays the context's
    kv.copy(2, 4)  # copies and moves use the refitted layout too
    for kept, now in zip(before[2], kv.read(4)):
        np.testing.assert_array_equal(kept, now)


def test_a_source_longer_than_the_width_arriving_mid_batch_and_leaving_changes_no_answer(tiny_seq2seq_model_dir):
    """Short sources decode in a 32-wide cross arena; a 41-token source arrives among them (64 wide,
    the context), then leaves while short ones still decode (32 again): every answer is what its
    source got alone, where the arena was as wide as that source alone."""
    sources = ["7", "12", "4" * 40, "300", "86", "5555"]
    running = start_server(tiny_seq2seq_model_dir, max_batch=3)
    cross = running.engine.slots.decoder.cross
    refits: list[tuple[int, int]] = []  # (width, slots holding a source) at each refit
    refit = cross.refit
    cross.refit = lambda width: (refits.append((width, int(np.count_nonzero(cross.lengths)))), refit(width))
    ask = lambda s: request(s, max_new_tokens=24, ignore_eos=True)  # every request holds its slot 24 steps
    try:
        alone = [list(running.stub.Generate(ask(s), timeout=TIMEOUT).token_ids) for s in sources]
        refits.clear()
        calls = [partial(running.stub.Generate, ask(s), timeout=TIMEOUT) for s in sources]
        together = [list(reply.token_ids) for reply in staggered(running, calls, steps_apart=4)]
        wait_until(lambda: idle(running.engine), what="the server to go idle")
    finally:
        running.stop()
    assert together == alone
    wider = refits.index((64, 2))  # the long source arrives beside two decoding ones
    assert any(width == 32 and held > 0 for width, held in refits[wider:]), refits  # it leaves before them
