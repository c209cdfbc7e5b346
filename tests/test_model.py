"""Model-level contracts: causality, KV cache equals full forward, left padding, tokenizer, checkpoints."""

import pytest
import torch
from fixtures_train import BYTE_IDS, SEQ2SEQ_IDS

from attnserve.model.checkpoint import CheckpointError, build_model, load_checkpoint, save_checkpoint
from attnserve.model.config import preset
from attnserve.model.generate import generate, generate_seq2seq, left_pad
from attnserve.tokenizer.utf8 import BOS_ID, VOCAB_SIZE, decode, encode


@pytest.fixture(params=["sinusoidal", "learned"])
def lm(request):
    torch.manual_seed(0)
    return build_model(preset("tiny", positional=request.param)).eval()


@pytest.fixture
def seq2seq():
    torch.manual_seed(0)
    return build_model(preset("tiny-seq2seq")).eval()


def test_changing_a_future_token_never_changes_earlier_outputs(lm):
    ids = torch.randint(0, 256, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 256
    a, b = lm(ids)[0], lm(changed)[0]
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-4


@torch.no_grad()
def test_cached_decoding_equals_full_forward(lm):
    ids = torch.randint(0, 256, (2, 20))
    full, _ = lm(ids)
    logits, past = lm(ids[:, :5])  # prefill 5 tokens, then one at a time
    steps = [logits]
    for t in range(5, 20):
        mask = torch.ones(2, t + 1, dtype=torch.long)
        logits, past = lm(ids[:, t : t + 1], mask, torch.full((2, 1), t), past)
        steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-5
    assert past[0][0].shape == (2, lm.config.n_heads, 20, lm.config.d_k)


@torch.no_grad()
def test_seq2seq_cached_decoding_equals_full_decoding(seq2seq):
    src, src_mask, _ = left_pad([[1, 2, 3, 4, 5], [7, 8]], BYTE_IDS["pad_id"])
    tgt = torch.randint(0, 256, (2, 9))
    full = seq2seq(src, src_mask, tgt)
    cross = seq2seq.cross_kv(seq2seq.encode(src, src_mask))
    past, steps = None, []
    for t in range(9):
        mask = torch.ones(2, t + 1, dtype=torch.long)
        logits, past = seq2seq.decode(tgt[:, t : t + 1], mask, torch.full((2, 1), t), src_mask, cross, past)
        steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-5


@torch.no_grad()
def test_left_padded_batch_equals_each_prompt_alone(lm):
    prompts = [encode("hello world"), encode("a"), encode("attention is all")]
    ids, mask, positions = left_pad(prompts, BYTE_IDS["pad_id"])
    batched, _ = lm(ids, mask, positions)
    for row, prompt in enumerate(prompts):
        alone, _ = lm(torch.tensor([prompt]))
        n = len(prompt)
        torch.testing.assert_close(batched[row, -n:], alone[0], rtol=0, atol=1e-5)


@torch.no_grad()
def test_seq2seq_source_padding_changes_nothing(seq2seq):
    sources = [list(b"4021"), list(b"7")]
    together = generate_seq2seq(seq2seq, sources, 12, **SEQ2SEQ_IDS)
    assert together == [generate_seq2seq(seq2seq, [s], 12, **SEQ2SEQ_IDS)[0] for s in sources]


def test_batched_greedy_generation_equals_alone(lm):
    prompts = [encode("def f(x):"), encode("x"), encode("The quick brown fox")]
    together = generate(lm, prompts, 20, **BYTE_IDS)
    assert together == [generate(lm, [p], 20, **BYTE_IDS)[0] for p in prompts]


def test_seeded_sampling_reproduces():
    torch.manual_seed(0)
    model = build_model(preset("tiny")).eval()
    a = generate(model, [encode("hi")], 30, temperature=1.0, top_k=50, top_p=0.9, seed=7, **BYTE_IDS)
    b = generate(model, [encode("hi")], 30, temperature=1.0, top_k=50, top_p=0.9, seed=7, **BYTE_IDS)
    c = generate(model, [encode("hi")], 30, temperature=1.0, top_k=50, top_p=0.9, seed=8, **BYTE_IDS)
    assert a == b and a != c


@pytest.mark.parametrize("text", ["plain ascii", "naïve café", "Ελληνικά", "日本語のテキスト", "emoji 🚀🐍", ""])
def test_tokenizer_round_trip(text):
    ids = encode(text)
    assert ids[0] == BOS_ID and all(0 <= i < VOCAB_SIZE for i in ids)
    assert len(ids) == 1 + len(text.encode("utf-8"))
    assert decode(ids) == text


def test_checkpoint_round_trip(tmp_path, lm):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, lm)
    assert torch.load(path, weights_only=True)["config"] == lm.config.to_dict()
    loaded = load_checkpoint(path)
    assert loaded.config == lm.config
    for (name, a), (_, b) in zip(lm.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_missing_and_corrupt_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(bad)
