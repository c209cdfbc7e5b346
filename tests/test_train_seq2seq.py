"""Encoder-decoder training: a short run learns, exact match is measured on held-out pairs."""

import torch

from attnserve.model.checkpoint import build_model, load_checkpoint
from attnserve.model.config import preset
from attnserve.model.train_seq2seq import Seq2SeqTrainConfig, batch_tensors, exact_match, train_seq2seq
from attnserve.tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID


def test_batch_tensors_shift_targets_and_pad():
    src, src_mask, tgt_in, labels = batch_tensors([("12", "twelve"), ("7", "seven!!")])
    assert src[1].tolist()[-2:] == [BOS_ID, ord("7")] and src_mask[1].tolist()[0] == 0
    assert tgt_in[0].tolist() == [BOS_ID, *b"twelve", PAD_ID]
    assert labels[0].tolist() == [*b"twelve", EOS_ID, PAD_ID]
    assert labels[1].tolist() == [*b"seven!!", EOS_ID]


def test_short_run_learns_a_copy_task(tmp_path):
    torch.manual_seed(0)
    words = ["cat", "dog", "sun", "map", "red", "big", "top", "cup", "hat", "pen", "box", "fox"]
    pairs = [(a + b, b + a) for a in words for b in words]
    train, heldout = pairs[:120], pairs[120:]
    model = build_model(preset("tiny-seq2seq"))
    before = exact_match(model, heldout)
    cfg = Seq2SeqTrainConfig(max_steps=300, batch_size=32, lr=3e-3, warmup_steps=30, eval_every=1000)
    result = train_seq2seq(model, cfg, tmp_path / "checkpoint.pt", train, heldout, log=lambda *_: None)
    assert result["steps"] == 300 and result["heldout_pairs"] == len(heldout)
    assert result["heldout_exact_match"] > before + 0.2
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["heldout_exact_match"] == result["heldout_exact_match"]
    assert load_checkpoint(tmp_path / "checkpoint.pt").config.arch == "encoder-decoder"
