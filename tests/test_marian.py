"""`attnserve import` of a Marian translation checkpoint (MarianMTModel, OPUS-MT's settings: post-LN,
SiLU, scaled embeddings, Marian's sinusoid, final_logits_bias, the pad id as the decoder's start) into
the lectures' encoder-decoder, random weights and SentencePiece models trained here: the import proves
itself against transformers, the export gates it, and the server's greedy tokens through every door
equal transformers' own `generate` for sources of mixed lengths, alone and batched, with the text
transformers' MarianTokenizer decodes; what cannot be imported is refused in one line naming it."""

from __future__ import annotations

import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from fixtures_server import start_server
from test_oip import inputs, text_of

from attnserve.cli import main as cli_main
from attnserve.tokenizer.sentencepiece import SentencePieceTokenizer
from attnserve.v1 import generation_pb2 as pb

pytestmark = pytest.mark.trains  # imports a model with torch: out of `make test-fast`

NEW_TOKENS = 24
TIMEOUT = 120


def sources() -> list[str]:
    """16 sources of mixed lengths: a word to a long sentence of CPython's docs, a language code, accents."""
    from benchmarks.hf_checkpoints import corpus_lines

    lines = [line for line in corpus_lines(60, 19) if 3 < len(line) < 200]
    picked = [lines[i] for i in range(0, len(lines), max(1, len(lines) // 12))][:12]
    return ["Hello", "héllo wörld", ">>fra<< The list", *picked, "x" * 3][:16]


@pytest.fixture(scope="module")
def reference(marian_dir):
    """transformers' own model and tokenizer of the directory."""
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(marian_dir).eval(), MarianTokenizer.from_pretrained(marian_dir)


def transformers_greedy(reference, source: str) -> list[int]:
    """transformers' greedy generate of one source: NEW_TOKENS tokens, EOS held back (as ignore_eos holds
    it) and none forced at the end (attnserve ends at max_new_tokens with what the model chose)."""
    model, tokenizer = reference
    batch = tokenizer([source], return_tensors="pt")
    with torch.no_grad():
        held = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, forced_eos_token_id=None)
        out = model.generate(**batch, num_beams=1, do_sample=False, **held)
    return out[0, 1:].tolist()  # after the decoder's start id


@pytest.fixture(scope="module")
def marian_server(marian_model_dir):
    running = start_server(marian_model_dir, max_batch=8, http_port=0)
    yield running
    running.stop()


def generate(stub, source: str, **fields) -> pb.GenerateResponse:
    request = pb.GenerateRequest(prompt=source, max_new_tokens=NEW_TOKENS, ignore_eos=True, **fields)
    return stub.Generate(request, timeout=TIMEOUT)


def test_the_import_proves_itself_and_writes_the_run(marian_checkpoint):
    report = json.loads((marian_checkpoint.parent / "import.json").read_text())
    assert report["architecture"] == "MarianMTModel"
    assert report["logits"]["max_abs_diff"] <= report["logits"]["tolerance"]
    assert report["greedy"]["identical"] and all(r["steps"] == 64 for r in report["greedy"]["sources"])
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (marian_checkpoint.parent / name).is_file()


def test_the_command_line_imports_and_says_what_it_proved(marian_dir, tmp_path, capsys):
    assert cli_main(["import", str(marian_dir), "--out", str(tmp_path / "run"), "--steps", "8"]) == 0
    said = capsys.readouterr().out
    assert "MarianMTModel" in said and "greedy tokens identical over 64 steps of 8 sources" in said


def test_the_tokenizer_encodes_and_decodes_as_marians(marian_dir, reference):
    """Source text in and target ids out as transformers' MarianTokenizer: lines of the docs the models
    were not trained on, a language code, odd spaces; and 500 random id sequences, specials among them."""
    from benchmarks.hf_checkpoints import corpus_lines

    _, theirs = reference
    ours = SentencePieceTokenizer.from_files(marian_dir, theirs.pad_token_id)
    texts = [*corpus_lines(75, 4)[:100], ">>fra<< bonjour", "  two  spaces ", "", "日本語"]
    for text in texts:
        assert ours.encode_prompt(text) == theirs(text).input_ids, text
    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(30))]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids


def test_served_greedy_tokens_are_transformers_alone_and_batched(marian_server, reference):
    """16 sources of mixed lengths: each alone, then all at once through 8 slots, equal to transformers'
    generate, and the text its tokenizer's decode."""
    texts = sources()
    expected = {text: transformers_greedy(reference, text) for text in texts}
    for text in texts:
        reply = generate(marian_server.stub, text)
        assert list(reply.token_ids) == expected[text], text
        assert reply.text == reference[1].decode(expected[text], skip_special_tokens=True)
    with ThreadPoolExecutor(len(texts)) as pool:
        replies = list(pool.map(lambda text: generate(marian_server.stub, text), texts))
    assert [list(r.token_ids) for r in replies] == [expected[text] for text in texts]


def test_every_door_translates_alike_and_a_stream_is_the_unary_text(marian_server):
    """attnserve.v1 (unary and streamed), the Open Inference Protocol (tritonclient) and the OpenAI
    HTTP API (openai's client) give one source the same text."""
    source = sources()[5]
    unary = generate(marian_server.stub, source).text
    streamed = marian_server.stub.GenerateStream(
        pb.GenerateRequest(prompt=source, max_new_tokens=NEW_TOKENS, ignore_eos=True), timeout=TIMEOUT
    )
    assert "".join(reply.text for reply in streamed) == unary
    model = marian_server.server.info.model_name
    triton = grpcclient.InferenceServerClient(url=marian_server.target)
    try:
        result = triton.infer(model, inputs(source, max_tokens=NEW_TOKENS, ignore_eos=True), client_timeout=TIMEOUT)
    finally:
        triton.close()
    assert text_of(result) == unary
    url = f"http://127.0.0.1:{marian_server.server.http.port}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT) as client:
        extra = {"ignore_eos": True}
        reply = client.completions.create(
            model=model, prompt=source, max_tokens=NEW_TOKENS, temperature=0, extra_body=extra
        )
    assert reply.choices[0].text == unary


def edited(marian_dir, tmp_path, config: dict | None = None, tokenizer_config: dict | None = None):
    """A copy of the checkpoint directory with fields of its config.json or tokenizer_config.json changed."""
    copy = tmp_path / "edited"
    shutil.copytree(marian_dir, copy)
    for name, changes in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        if changes:
            path = copy / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return copy


@pytest.mark.parametrize(
    ("config", "tokenizer_config", "message"),
    [
        ({"activation_function": "tanh"}, None, "activation_function 'tanh': not one of swish"),
        ({"share_encoder_decoder_embeddings": False}, None, "share_encoder_decoder_embeddings False: separate"),
        ({"encoder_attention_heads": 2}, None, "encoder_attention_heads 2: differs from decoder_attention_heads 4"),
        ({"encoder_ffn_dim": 64}, None, "encoder_ffn_dim 64: differs from decoder_ffn_dim 128"),
        ({"d_model": 60}, None, "d_model 60: / 4 heads must be a multiple of 8"),
        ({"eos_token_id": 5}, None, "eos_token_id 5, vocab.json's 0"),
        (None, {"separate_vocabs": True}, "separate_vocabs true: not implemented"),
    ],
    ids=["activation", "separate-embeddings", "heads", "ffn", "head-size", "eos", "separate-vocabs"],
)
def test_what_cannot_be_imported_is_refused_in_one_line_naming_it(
    marian_dir, tmp_path, capsys, config, tokenizer_config, message
):
    source = edited(marian_dir, tmp_path, config, tokenizer_config)
    assert cli_main(["import", str(source), "--out", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("attnserve import: error: ") and message in said and "\n" not in said
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
