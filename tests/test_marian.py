"""`attnserve import` of a Marian translation checkpoint (MarianMTModel, OPUS-MT's settings: post-LN,
SiLU, scaled embeddings, Marian's sinusoid, final_logits_bias, the pad id as the decoder's start) into
the lectures' encoder-decoder, random weights and SentencePiece models trained here: the import proves
itself against transformers, the export gates it, and the server's greedy tokens through every door
equal transformers' own `generate` for sources of mixed lengths, alone and batched, with the text
transformers' MarianTokenizer decodes; beam search (k = 2, 4, 5, two length penalties) gives
transformers' `generate(num_beams=k)` hypotheses and scores, alone, batched, and beside greedy
requests in the same batch; what cannot be imported is refused in one line naming it."""

from __future__ import annotations

import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from fixtures_server import idle, release_once_ended, start_server, wait_until
from test_oip import inputs, text_of
from tolerance import float32_sum

from attnserve.cli import main as cli_main
from attnserve.engine.domain import FinishReason
from attnserve.tokenizer.sentencepiece import SentencePieceTokenizer
from attnserve.v1 import generation_pb2 as pb
from benchmarks.hf_checkpoints import MARIAN_CONFIG

pytestmark = pytest.mark.trains  # imports a model with torch: out of `make test-fast`

NEW_TOKENS = 24
D_MODEL = MARIAN_CONFIG["d_model"]
TIMEOUT = 120


def sources() -> list[str]:
    """16 sources of mixed lengths: a word to a long sentence of CPython's docs, a language code, accents."""
    from benchmarks.hf_checkpoints import corpus_lines

    lines = [line for line in corpus_lines(60, 19) if 3 < len(line) < 200]
    picked = [lines[i] for i in range(0, len(lines), max(1, len(lines) // 12))][:12]
    return ["Hello", "héllo wörld", ">>fra<< The list", *picked, "x" * 3][:16]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """transformers' reference decoding of a small model on one thread: beside a busy core (CI's), two
    threads wait on each other at every op (the export's beam gate measured it: 18x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def transformers_beams(
    reference, source: str, k: int, penalty: float, returned: int, early: bool | str = False
) -> list[tuple[list[int], float]]:
    """transformers' beam search of one source: each returned hypothesis's tokens (after the start id, its
    EOS dropped) and score; no EOS forced at the length limit (as attnserve)."""
    model, tokenizer = reference
    batch = tokenizer([source], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **batch,
            num_beams=k,
            length_penalty=penalty,
            num_return_sequences=returned,
            early_stopping=early,
            max_new_tokens=NEW_TOKENS,
            forced_eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
        )
    found = []
    for sequence, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        tokens = sequence[1:]
        found.append((tokens[: tokens.index(0)] if 0 in tokens else tokens, score))
    return found


def score_tolerance(tokens: list[int], score: float) -> float:
    """A hypothesis's score is a sum of one log-probability per token (its end id too), each from logits that
    are dot products of D_MODEL terms, over a length power: float32's rounding of those terms, scaled."""
    return float32_sum((len(tokens) + 1) * D_MODEL, score)


def beams(stub, source: str, k: int, penalty: float, returned: int, early: str = "") -> list[tuple[list[int], float]]:
    """The server's hypotheses (tokens, score) of one source, best first."""
    fields = dict(num_beams=k, length_penalty=penalty, num_return_sequences=returned, early_stopping=early)
    reply = stub.Generate(pb.GenerateRequest(prompt=source, max_new_tokens=NEW_TOKENS, **fields), timeout=TIMEOUT)
    if returned == 1:
        return [(list(reply.token_ids), reply.score)]
    return [(list(c.token_ids), c.score) for c in reply.completions]


@pytest.mark.parametrize("k", [2, 4, 5])
@pytest.mark.parametrize("penalty", [0.6, 1.0])
def test_beam_search_is_transformers_alone_and_batched(marian_server, reference, k, penalty):
    """16 sources of mixed lengths with k beams: every hypothesis's tokens equal transformers' (its score
    within float32's rounding of the other arithmetic), alone, then all 16 at once through 8 slots."""
    texts, returned = sources(), min(k, 2)
    expected = [transformers_beams(reference, text, k, penalty, returned) for text in texts]
    alone = [beams(marian_server.stub, text, k, penalty, returned) for text in texts]
    for text, mine, theirs in zip(texts, alone, expected):
        assert [tokens for tokens, _ in mine] == [tokens for tokens, _ in theirs], text
        for (tokens, score), (_, expected_score) in zip(mine, theirs):
            assert score == pytest.approx(expected_score, abs=score_tolerance(tokens, score)), text
    with ThreadPoolExecutor(len(texts)) as pool:
        batched = list(pool.map(lambda text: beams(marian_server.stub, text, k, penalty, returned), texts))
    assert batched == alone


@pytest.mark.parametrize(("early", "theirs"), [("true", True), ("never", "never")])
def test_early_stopping_true_and_never_are_transformers(marian_server, reference, early, theirs):
    """transformers' other stopping rules: once k hypotheses are kept (true), or once none could be beaten
    at the longest length (never), with a length penalty that favours long and one that favours short."""
    for penalty in (2.0, -1.0):
        for text in sources()[:4]:
            mine = beams(marian_server.stub, text, 4, penalty, 2, early)
            expected = transformers_beams(reference, text, 4, penalty, 2, theirs)
            assert [tokens for tokens, _ in mine] == [tokens for tokens, _ in expected], (penalty, text)


def test_beam_search_across_the_engine_core_process(marian_server, marian_model_dir):
    """The engine core in its own process gives the thread mode's hypotheses and scores."""
    texts = sources()[:4]
    here = [beams(marian_server.stub, text, 4, 0.6, 2) for text in texts]
    core = start_server(marian_model_dir, engine_core="process")
    try:
        assert [beams(core.stub, text, 4, 0.6, 2) for text in texts] == here
    finally:
        core.stop()


def test_beam_groups_share_the_batch_with_greedy_requests_and_a_cancel_frees_every_slot(marian_server):
    """16 beam-4 requests and 16 greedy ones at once: each result is its alone result. A beam request's
    stream sends its hypotheses at the end, each with its score; cancelled, it frees its 4 slots."""
    texts = sources()
    alone_beams = {text: beams(marian_server.stub, text, 4, 1.0, 2) for text in texts}
    alone_greedy = {text: list(generate(marian_server.stub, text).token_ids) for text in texts}
    calls = [("beam", text) for text in texts] + [("greedy", text) for text in texts]
    run = lambda call: (
        beams(marian_server.stub, call[1], 4, 1.0, 2)
        if call[0] == "beam"
        else list(generate(marian_server.stub, call[1]).token_ids)
    )
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(run, calls))
    assert results == [alone_beams[text] if kind == "beam" else alone_greedy[text] for kind, text in calls]
    source = texts[3]
    stream = list(marian_server.stub.GenerateStream(beam_request(source), timeout=TIMEOUT))
    finals = [m for m in stream if m.finish_reason != pb.FINISH_REASON_UNSPECIFIED]
    assert [m.index for m in finals] == [0, 1] and len(stream) == 4  # each hypothesis: its tokens, its end
    assert [list(m.token_ids) for m in stream if m.token_ids] == [tokens for tokens, _ in alone_beams[source]]
    assert [m.score for m in finals] == [score for _, score in alone_beams[source]]
    marian_server.pacer.hold()  # the search stops at its first step: cancelled long before its end
    cancelled = marian_server.stub.GenerateStream(beam_request(source), timeout=TIMEOUT)
    wait_until(lambda: marian_server.engine.stats()["active"] == 4, what="the 4 beams to take their slots")
    cancelled.cancel()
    release_once_ended(marian_server)
    wait_until(lambda: idle(marian_server.engine), what="the 4 slots to be freed")
    assert marian_server.pacer.finals[-1].reason == FinishReason.CANCELLED


def beam_request(source: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=source, max_new_tokens=NEW_TOKENS, num_beams=4, num_return_sequences=2, length_penalty=1.0
    )


def test_beam_search_through_the_other_doors_the_client_and_the_cli(marian_server, capsys):
    """vLLM's names on the Open Inference Protocol (use_beam_search, best_of) and the OpenAI API (n
    hypotheses as the choices); the Python client's result and `attnserve generate --num-beams`."""
    from attnserve.clients.client import Client

    source = sources()[7]
    expected = beams(marian_server.stub, source, 4, 1.0, 2)
    texts = [reference_text(marian_server, tokens) for tokens, _ in expected]
    model = marian_server.server.info.model_name
    triton = grpcclient.InferenceServerClient(url=marian_server.target)
    try:
        asked = dict(max_tokens=NEW_TOKENS, use_beam_search=True, best_of=4, temperature=0)
        result = triton.infer(model, inputs(source, **asked), client_timeout=TIMEOUT)
    finally:
        triton.close()
    assert text_of(result) == texts[0]
    url = f"http://127.0.0.1:{marian_server.server.http.port}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT) as client:
        extra = {"use_beam_search": True, "best_of": 4}
        reply = client.completions.create(model=model, prompt=source, max_tokens=NEW_TOKENS, n=2, extra_body=extra)
    assert [choice.text for choice in sorted(reply.choices, key=lambda c: c.index)] == texts
    with Client(marian_server.target) as client:
        result = client.generate(source, max_new_tokens=NEW_TOKENS, num_beams=4, num_return_sequences=2)
    assert [(list(c.token_ids), c.score) for c in result.completions] == expected
    command = ["generate", source, "--target", marian_server.target, "--max-new-tokens", str(NEW_TOKENS)]
    assert cli_main([*command, "--num-beams", "4", "--num-return-sequences", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed == "".join(
        f"[{i}, score {score:.4f}] {text}\n" for i, ((_, score), text) in enumerate(zip(expected, texts))
    )


def reference_text(server, tokens: list[int]) -> str:
    return server.engine.tokenizer.decode(tokens)


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


def logits_scale(reference) -> float:
    """The largest |logit| of the model's first decoder step over the test sources."""
    model, tokenizer = reference
    batch = tokenizer(sources(), return_tensors="pt", padding=True)
    start = torch.full((len(sources()), 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        return float(model(**batch, decoder_input_ids=start).logits.abs().max())


def test_the_ids_opus_mt_bans_are_never_generated_as_transformers_never_generates_them(marian_dir, tmp_path, reference):
    """OPUS-MT's generation config bans the pad id (bad_words_ids), which its logits can favour: here
    its final_logits_bias is raised until the pad would be every step's argmax. The import carries the
    ban into the export; served greedy and beam tokens are transformers' (which applies it), no pad."""
    from safetensors.torch import load_file, save_file

    from attnserve.export.onnx_export import export_checkpoint
    from attnserve.model.hf.import_cli import run

    hf = edited(marian_dir, tmp_path)
    weights = load_file(str(hf / "model.safetensors"))
    pad = json.loads((hf / "config.json").read_text())["pad_token_id"]
    scale = logits_scale(reference)
    weights["final_logits_bias"][0, pad] = 2 * scale  # the pad above every other logit, as a zero embedding can be
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    run(hf, tmp_path / "run", steps=8)
    export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "model")
    assert json.loads((tmp_path / "model" / "attnserve.json").read_text())["tokenizer"]["suppressed_ids"] == [pad]
    from transformers import MarianMTModel

    favoured = (MarianMTModel.from_pretrained(hf).eval(), reference[1])
    running = start_server(tmp_path / "model", max_batch=8)
    try:
        for text in sources()[:4]:
            greedy = list(generate(running.stub, text).token_ids)
            assert greedy == transformers_greedy(favoured, text) and pad not in greedy
            found = beams(running.stub, text, 4, 1.0, 2)
            assert [tokens for tokens, _ in found] == [
                tokens for tokens, _ in transformers_beams(favoured, text, 4, 1.0, 2)
            ]
            assert all(pad not in tokens for tokens, _ in found)
    finally:
        running.stop()


def test_the_beam_gate_fails_an_arena_that_loses_its_beams_copies(marian_checkpoint, marian_model_dir, monkeypatch):
    """The export's beam gate runs the served search over the arena against PyTorch's: it passes the
    exported model, and fails it where a beam that continues another's does not get its cache
    (copy_cache does nothing), with the cases that differ in the gate's failure message."""
    from attnserve.export.onnx_export import load_model
    from attnserve.export.parity import failure_message
    from attnserve.export.parity_beams import beam_report
    from attnserve.runtime import contract
    from attnserve.runtime.arena_decoder import ArenaDecoder
    from attnserve.runtime.ort_decoder import OrtSeq2Seq

    model = load_model(marian_checkpoint)[0]
    manifest = contract.read_manifest(marian_model_dir)
    runtime = OrtSeq2Seq(marian_model_dir, manifest=manifest, provider="CPUExecutionProvider")
    gate = lambda: beam_report(model, runtime, "float32", manifest.eos_id, manifest.bos_id)
    assert gate()["ok"] and manifest.parity["beams"]["identical"]  # as the export stored it
    monkeypatch.setattr(ArenaDecoder, "copy_cache", lambda self, src, dst: None)
    broken = gate()
    assert not broken["ok"]
    message = failure_message({"checks": [], "problems": [], "greedy": {"rows": []}, "beams": broken})
    assert "parity gate failed: beam search k=" in message and "hypotheses differ" in message
