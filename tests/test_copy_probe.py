"""benchmarks/copy_probe.py: its windows of random runs listed twice, and a few steps of its training."""

import pytest
import torch

from benchmarks.copy_probe import BATCH, VOCAB, WINDOW, probe, windows

pytestmark = pytest.mark.trains  # trains a model with torch: out of `make test-fast`


def test_windows_list_each_run_of_random_ids_twice():
    x, y = windows(torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (BATCH, WINDOW) and bool((x[:, 1:] == y[:, :-1]).all())
    assert int(x.min()) >= 3 and int(x.max()) < VOCAB  # no BOS, EOS or PAD
    for row in torch.cat([x, y[:, -1:]], 1).tolist():  # every run of 8 to 23 ids followed by itself
        start = 0
        while start < len(row):
            length = next(n for n in range(8, 24) if row[start : start + n] == row[start + n : start + 2 * n])
            start += 2 * length
            if start + 2 * 23 > len(row):
                break


def test_a_few_steps_log_each_hundredth_and_the_last():
    lines: list[str] = []
    losses = probe("rotary", 0.001, 3, log=lines.append)
    assert [step for step, _ in losses] == [0, 2] and len(lines) == 2
    assert all(loss > 7 for _, loss in losses)  # ln 2048 = 7.62: three steps copy nothing yet


def test_random_runs_are_each_their_tokenizers_ids_twice(tiny_bpe_checkpoint):
    """benchmarks/copy_corpus.py --random-ids: runs of ids drawn from the checkpoint's tokenizer, each run's
    text twice in a row, drawn from the whole vocabulary."""
    from attnserve.model.checkpoint import load_state
    from attnserve.tokenizer import from_state
    from benchmarks.copy_corpus import random_runs

    tokenizer = from_state(load_state(str(tiny_bpe_checkpoint)).get("tokenizer"))
    text = random_runs(str(tiny_bpe_checkpoint), size=20_000, seed=2, shortest=10, longest=10)
    ids = tokenizer.encode(text)
    assert 20_000 <= len(text) < 20_000 + 2 * 10 * 40
    runs, start = 0, 0
    while start < len(text):  # each run's text is followed by itself
        ends = [n for n in range(1, 401) if text[start : start + n] == text[start + n : start + 2 * n]]
        assert ends, text[start : start + 80]
        start += 2 * ends[-1]
        runs += 1
    assert runs >= 20_000 // 400
    assert len(set(ids)) > 0.5 * tokenizer.vocab_size  # drawn from the whole vocabulary
