"""The tokenizers: every string round-trips, a BPE learns only from the training split, checkpoints
carry their tokenizer, and --resume keeps it."""

import pytest
import torch

from attnserve.model.config import preset
from attnserve.model.train import TrainConfig, TrainError, tokenize_corpus, train
from attnserve.tokenizer import ByteTokenizer, TokenizerError, from_state
from attnserve.tokenizer.bpe import MIN_VOCAB, SPECIAL_TOKENS, train_bpe

MIXED = [
    "plain ASCII, with punctuation: (x) -> y;",
    "Καλημέρα κόσμε",
    "日本語のテキストと中文",
    "emoji 😀👍🏽🇬🇷 end",
    "combining e\u0301 a\u0308 n\u0303",
    "NUL \x00 inside",
    "tabs\tand\r\nnewlines\n\n",
    "  leading spaces",
    "<|eos|> spelled out",
    "\U0010ffff last code point",
    "",
]
QUIET = dict(max_steps=2, time_budget=None, progress=False, batch_size=2, eval_interval=2, eval_windows=2, threads=1)


@pytest.fixture(scope="module")
def bpe():
    from pydoc_data.topics import topics

    return train_bpe("\n".join(topics[k] for k in sorted(topics)), 512)


@pytest.mark.parametrize("text", MIXED)
def test_every_string_round_trips(bpe, text):
    for tokenizer in (ByteTokenizer(), bpe):
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert tokenizer.decode(tokenizer.encode_prompt(text)) == text


def test_bpe_compresses_and_its_special_ids_come_first(bpe):
    text = "The return statement leaves the current function call"
    assert len(bpe.encode(text)) < len(text.encode()) / 2
    assert (bpe.bos_id, bpe.eos_id, bpe.pad_id, bpe.vocab_size) == (0, 1, 2, 512)
    assert bpe.encode_prompt(text) == bpe.encode(text)  # GPT-2's way: no BOS on a prompt
    assert bpe.decode([bpe.bos_id, *bpe.encode("ab"), bpe.eos_id, bpe.pad_id]) == "ab"
    assert sum(bpe.byte_lengths()[i] for i in bpe.encode(text)) == len(text.encode())


def test_text_that_spells_a_special_token_stays_text(bpe):
    ids = bpe.encode("<|eos|>")
    assert bpe.eos_id not in ids and len(ids) > 1


def test_bpe_training_is_deterministic_and_the_state_rebuilds_it(bpe):
    again = from_state(bpe.state())
    assert again.json == bpe.json and again.encode(MIXED[2]) == bpe.encode(MIXED[2])
    assert train_bpe("a b c " * 40, 300).json == train_bpe("a b c " * 40, 300).json


def test_bad_vocab_sizes_and_files_are_refused():
    with pytest.raises(TokenizerError, match=f"--vocab-size 100 is outside \\[{MIN_VOCAB}"):
        train_bpe("abc", 100)
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json"):
        from_state({"kind": "bpe", "json": "{not json"})
    with pytest.raises(TokenizerError, match="kind 'wordpiece'"):
        from_state({"kind": "wordpiece"})
    with pytest.raises(TokenizerError, match="lacks source, target, vocab, decoder_start_id"):
        from_state({"kind": "sentencepiece"})
    nothing = {"kind": "sentencepiece", "source": "", "target": "", "vocab": {}, "decoder_start_id": 0}
    with pytest.raises(TokenizerError, match=r"source\.spm: not a SentencePiece model \(empty\)"):
        from_state(nothing)
    with pytest.raises(TokenizerError, match=r"source\.spm: not a SentencePiece model \(INTERNAL"):
        from_state({**nothing, "source": "Z2FyYmFnZQ=="})  # base64 of "garbage"
    assert len(SPECIAL_TOKENS) == 3


def test_bpe_learns_only_from_the_training_split(tmp_path):
    secret = "qzxvqzxv"  # only in the held-out tail, many times over
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. " * 2000 + (secret + " ") * 200)
    cfg = TrainConfig(out_dir=str(tmp_path), corpus=str(corpus), tokenizer="bpe", vocab_size=400, heldout_fraction=0.05)
    data = corpus.read_bytes()
    split = tokenize_corpus(data, cfg, 32, None)
    vocab = [split.tokenizer._tok.id_to_token(i) for i in range(split.tokenizer.vocab_size)]
    assert not any("qz" in token or "zx" in token for token in vocab)
    assert any("cat" in token for token in vocab)
    assert split.tokenizer.decode(split.heldout).count(secret) == 200
    assert split.bos is None and len(split.train) < len(data) // 3


def test_checkpoint_carries_the_bpe_and_resume_keeps_and_checks_it(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), tokenizer="bpe", vocab_size=300, **QUIET)
    result = train(preset("tiny"), cfg, log=lambda _: None)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["tokenizer"]["kind"] == "bpe" and state["config"]["vocab_size"] == 300
    assert result["model"].config.vocab_size == 300 and result["heldout_bpb"] > 0
    resumed = train(preset("tiny"), TrainConfig(**{**cfg.__dict__, "resume": True, "max_steps": 3}), log=lambda _: None)
    assert resumed["tokenizer"].json == from_state(state["tokenizer"]).json and resumed["steps"] == 3
    unsaid = TrainConfig(**{**cfg.__dict__, "resume": True, "max_steps": 4, "tokenizer": None, "vocab_size": None})
    assert train(preset("tiny"), unsaid, log=lambda _: None)["tokenizer"].json == resumed["tokenizer"].json
    with pytest.raises(TrainError, match="trained with --vocab-size 300, not 512"):
        train(preset("tiny"), TrainConfig(**{**cfg.__dict__, "resume": True, "vocab_size": 512}))
    with pytest.raises(TrainError, match="tokenizer is bpe, not --tokenizer bytes"):
        train(preset("tiny"), TrainConfig(**{**cfg.__dict__, "resume": True, "tokenizer": "bytes", "vocab_size": None}))


def test_vocab_size_is_only_for_bpe():
    with pytest.raises(TrainError, match="--vocab-size is the BPE tokenizer's"):
        TrainConfig(tokenizer="bytes", vocab_size=512)
