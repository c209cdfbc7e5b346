"""The number-words task: spelling, the fixed held-out split, and the TSV reader."""

import pytest

from attnserve.model.numbers import is_heldout, number_pairs, number_to_words, read_pairs


@pytest.mark.parametrize(
    "n, words",
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (21, "twenty-one"),
        (105, "one hundred five"),
        (4021, "four thousand twenty-one"),
        (100000, "one hundred thousand"),
        (999999, "nine hundred ninety-nine thousand nine hundred ninety-nine"),
        (1000001, "one million one"),
    ],
)
def test_number_to_words(n, words):
    assert number_to_words(n) == words


def test_heldout_numbers_never_appear_in_training():
    train = {int(s) for s, _ in number_pairs(5000, heldout=False, seed=1)}
    heldout = {int(s) for s, _ in number_pairs(500, heldout=True, seed=2)}
    assert train.isdisjoint(heldout)
    assert all(is_heldout(n) for n in heldout) and not any(is_heldout(n) for n in train)


def test_read_pairs_names_the_bad_line(tmp_path):
    good = tmp_path / "task.tsv"
    good.write_text("hello\tbonjour\n\ncat\tchat\n", encoding="utf-8")
    assert read_pairs(good) == [("hello", "bonjour"), ("cat", "chat")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\tbonjour\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected"):
        read_pairs(bad)
