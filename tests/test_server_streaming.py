"""Token ids -> text: UTF-8 characters split across tokens are emitted whole; stop strings are cut."""

import json
import random

import pytest

from attnserve.engine.detokenizer import Detokenizer, TextStream, held_back
from attnserve.tokenizer import ByteTokenizer
from attnserve.tokenizer.bpe import BpeTokenizer, train_bpe
from attnserve.tokenizer.byte_stream import ByteStream

TOK = ByteTokenizer()
TEXT = "Καλημέρα κόσμε 😀 — naïve 日本語!"


def stream_deltas(text: str, stops=()) -> tuple[list[str], TextStream]:
    stream = TextStream(TOK, tuple(stops))
    deltas = [stream.push(b) for b in text.encode("utf-8")]
    deltas.append(stream.finish())
    return deltas, stream


def test_byte_tokenizer_encodes_bos_and_bytes_and_decodes_without_specials():
    assert TOK.encode_prompt("hé") == [256, 104, 195, 169] and TOK.encode("hé") == [104, 195, 169]
    assert TOK.decode([65, 256, 258, 66]) == "AB"


def test_detokenizer_waits_for_the_last_byte_of_a_character():
    detok = Detokenizer(TOK)
    assert [detok.push(b) for b in "😀".encode()] == ["", "", "", "😀"]  # 4 bytes, 4 tokens
    assert detok.flush() == ""


def test_bpe_tokens_that_cut_characters_give_whole_characters_that_join_to_the_original():
    bpe = train_bpe("ab " * 50, 300)  # never saw these characters: one token per byte
    ids = bpe.encode(TEXT)
    assert len(ids) == len(TEXT.encode())
    detok = Detokenizer(bpe)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)


def test_detokenizer_replaces_invalid_and_cut_bytes_and_never_rewrites_sent_text():
    detok = Detokenizer(TOK)
    assert [detok.push(b) for b in b"a\xffb"] == ["a", "", "\ufffdb"]
    assert detok.push("é".encode()[0]) == ""
    assert detok.flush() == "\ufffd"


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
    assert stream.push(ord("d")) == "abd"  # not the stop string after all
    assert stream.finish() == "" and not stream.stopped


def test_held_back_text_is_released_at_the_end():
    stream = TextStream(TOK, ("abc",))
    assert [stream.push(ord(c)) for c in "ab"] == ["", ""]
    assert stream.finish() == "ab"


def test_stop_string_split_across_multibyte_tokens():
    deltas, stream = stream_deltas("il fait beau 😀 demain", stops=["😀"])
    assert stream.stopped and "".join(deltas) == "il fait beau "


def test_earliest_of_several_stop_strings_wins():
    _deltas, stream = stream_deltas("one two three", stops=["three", "two"])
    assert stream.text == "one " and stream.stopped


def test_nothing_is_emitted_after_a_stop():
    stream = TextStream(TOK, ("b",))
    assert stream.push(ord("a")) == "a"
    assert stream.push(ord("b")) == "" and stream.stopped
    assert stream.push(ord("c")) == "" and stream.finish() == ""


@pytest.mark.parametrize(
    "text, stops, expected",
    [
        ("hello", ("lox",), 2),
        ("hello", ("xyz",), 0),
        ("hel", ("hello",), 3),
        ("ab", ("b", "abc"), 2),
    ],
)
def test_held_back_is_the_longest_stop_prefix_at_the_tail(text, stops, expected):
    assert held_back(text, stops) == expected


def deltas_of(detok: Detokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_the_incremental_decoders_give_the_deltas_of_decoding_slices():
    """BPE's decode_stream (a byte stream over each id's bytes, byte_stream.py) and Hugging Face's
    DecodeStream against this module's own slice decoding, over ids that cut characters, hold special
    ids and invalid bytes: the same delta at every step, the same end."""
    bpe = train_bpe("ab " * 50 + TEXT[:6] + TEXT * 3, 400)
    assert any(len(bpe.decode([i]).encode()) > 1 for i in range(bpe.vocab_size))  # merges of several bytes
    rng = random.Random(0)
    for trial in range(40):
        ids = bpe.encode(TEXT) + [rng.randrange(bpe.vocab_size) for _ in range(60)]
        if trial % 2:
            rng.shuffle(ids)
        native, library, sliced = Detokenizer(bpe), Detokenizer(bpe), Detokenizer(bpe, native=False)
        library.step = bpe.library_stream()
        assert isinstance(native.step, ByteStream) and sliced.step is None
        assert deltas_of(native, ids) == deltas_of(library, ids) == deltas_of(sliced, ids), trial


def test_the_byte_tokenizers_stream_gives_the_deltas_of_decoding_slices():
    rng = random.Random(1)
    for trial in range(40):
        ids = list(TEXT.encode()) + [rng.randrange(TOK.vocab_size) for _ in range(60)]
        if trial % 2:
            rng.shuffle(ids)
        native, sliced = Detokenizer(TOK), Detokenizer(TOK, native=False)
        assert isinstance(native.step, ByteStream)
        assert deltas_of(native, ids) == deltas_of(sliced, ids), trial


@pytest.mark.parametrize("change", ["decoder", "added token"])
def test_a_tokenizer_json_that_is_not_plain_byte_level_decodes_with_the_library(change):
    """Only a ByteLevel decoder over ids that each stand for bytes gets the byte stream (here a decoder
    of another type, an added token spelled outside the byte-level alphabet); any other file streams
    with Hugging Face's DecodeStream, whose deltas are still the slices'."""
    spec = json.loads(train_bpe("ab " * 50 + TEXT, 300).json)
    extra = len(spec["model"]["vocab"])
    if change == "decoder":
        spec["decoder"] = {"type": "Sequence", "decoders": [spec["decoder"]]}
    else:
        spec["added_tokens"].append({**spec["added_tokens"][0], "id": extra, "content": "an extra", "special": False})
    bpe = BpeTokenizer(json.dumps(spec))
    native, sliced = Detokenizer(bpe), Detokenizer(bpe, native=False)
    assert native.step is not None and not isinstance(native.step, ByteStream)
    ids = bpe.encode(TEXT) + ([extra] if change == "added token" else [])
    assert deltas_of(native, ids) == deltas_of(sliced, ids)


def test_a_byte_fallback_tokenizers_stream_joins_to_its_decode_where_decodestream_does_not():
    """Llama 2's and Mistral's kind of tokenizer.json (SentencePiece converted: "▁" for spaces, byte
    tokens for characters the merges lack): a run of byte tokens is held until it ends, since an
    invalid run decodes to one U+FFFD per byte (fallback_stream.py). Over random ids with cut and
    invalid runs, the deltas join to decode() of all ids; Hugging Face's DecodeStream, which sends a
    run's valid start early, does not for some of them."""
    from attnserve.tokenizer.fallback_stream import FallbackStream
    from benchmarks.hf_checkpoints import sentencepiece_tokenizer_json

    sp = BpeTokenizer(sentencepiece_tokenizer_json(), dict(bos_id=1, eos_id=2, pad_id=2, add_bos=True))
    text = "héllo wörld 日本語 😀 " + TEXT
    assert sp.decode(sp.encode(text)) == text and len(sp.byte_fallback_ids) == 256
    rng = random.Random(2)
    library_differs = 0
    for trial in range(40):
        ids = sp.encode(text) + [rng.randrange(sp.vocab_size) for _ in range(60)]
        if trial % 2:
            rng.shuffle(ids)
        native, library = Detokenizer(sp), Detokenizer(sp)
        library.step = sp.library_stream()
        assert isinstance(native.step, FallbackStream)
        assert "".join(deltas_of(native, ids)) == sp.decode(ids), trial
        library_differs += "".join(deltas_of(library, ids)) != sp.decode(ids)
    assert library_differs
