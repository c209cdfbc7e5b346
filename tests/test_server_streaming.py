"""Token ids -> text: UTF-8 characters split across tokens are emitted whole; stop strings are cut."""
import pytest

from attnserve.server.streaming import ByteTokenizer, TextStream, Utf8Decoder, held_back

TOK = ByteTokenizer(vocab_size=259, bos_id=256, eos_id=257, pad_id=258)
TEXT = "Καλημέρα κόσμε 😀 — naïve 日本語!"


def stream_deltas(text: str, stops=()) -> tuple[list[str], TextStream]:
    stream = TextStream(TOK, tuple(stops))
    deltas = [stream.push(b) for b in text.encode("utf-8")]
    deltas.append(stream.finish())
    return deltas, stream


def test_tokenizer_encodes_bos_and_bytes_from_manifest_ids():
    tok = ByteTokenizer.from_manifest({"tokenizer": {"kind": "bytes", "vocab_size": 259, "bos_id": 256,
                                                     "eos_id": 257, "pad_id": 258}})
    assert tok.encode("hé") == [256, 104, 195, 169]
    assert tok.token_bytes(65) == b"A" and tok.token_bytes(256) == b"" and tok.token_bytes(258) == b""


def test_decoder_waits_for_the_last_byte_of_a_character():
    decoder = Utf8Decoder()
    emoji = "😀".encode()                       # 4 bytes
    assert [decoder.push(emoji[i:i + 1]) for i in range(4)] == ["", "", "", "😀"]
    assert decoder.flush() == ""


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_decoder_on_any_split_gives_valid_text_that_joins_to_the_original(chunk):
    data, decoder, pieces = TEXT.encode(), Utf8Decoder(), []
    for i in range(0, len(data), chunk):
        pieces.append(decoder.push(data[i:i + chunk]))
    pieces.append(decoder.flush())
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)


def test_decoder_replaces_invalid_and_cut_bytes():
    decoder = Utf8Decoder()
    assert decoder.push(b"a\xffb") == "a\ufffdb"
    assert decoder.push("é".encode()[:1]) == ""
    assert decoder.flush() == "\ufffd"


def test_stream_deltas_are_whole_characters():
    deltas, stream = stream_deltas(TEXT)
    assert "".join(deltas) == TEXT == stream.text
    assert all("\ufffd" not in d for d in deltas)
    assert not stream.stopped


def test_special_tokens_add_no_text():
    stream = TextStream(TOK)
    assert [stream.push(t) for t in (104, 256, 105, 258)] == ["h", "", "i", ""]


def test_stop_string_ends_the_stream_and_is_not_emitted():
    deltas, stream = stream_deltas("hello world, more", stops=["world"])
    assert stream.stopped and stream.text == "hello " and "".join(deltas) == "hello "


def test_text_that_might_start_a_stop_string_is_held_back_then_released():
    stream = TextStream(TOK, ("abc",))
    assert [stream.push(ord(c)) for c in "xab"] == ["x", "", ""]
    assert stream.push(ord("d")) == "abd"          # not the stop string after all
    assert stream.finish() == "" and not stream.stopped


def test_held_back_text_is_released_at_the_end():
    stream = TextStream(TOK, ("abc",))
    assert [stream.push(ord(c)) for c in "ab"] == ["", ""]
    assert stream.finish() == "ab"


def test_stop_string_split_across_multibyte_tokens():
    deltas, stream = stream_deltas("il fait beau 😀 demain", stops=["😀"])
    assert stream.stopped and "".join(deltas) == "il fait beau "


def test_earliest_of_several_stop_strings_wins():
    deltas, stream = stream_deltas("one two three", stops=["three", "two"])
    assert stream.text == "one " and stream.stopped


def test_nothing_is_emitted_after_a_stop():
    stream = TextStream(TOK, ("b",))
    assert stream.push(ord("a")) == "a"
    assert stream.push(ord("b")) == "" and stream.stopped
    assert stream.push(ord("c")) == "" and stream.finish() == ""


@pytest.mark.parametrize("text, stops, expected", [
    ("hello", ("lox",), 2), ("hello", ("xyz",), 0), ("hel", ("hello",), 3), ("ab", ("b", "abc"), 2),
])
def test_held_back_is_the_longest_stop_prefix_at_the_tail(text, stops, expected):
    assert held_back(text, stops) == expected
