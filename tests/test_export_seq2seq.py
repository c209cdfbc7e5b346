"""Encoder-decoder export: encoder.onnx computes the cross-attention keys and values once per
source, decoder.onnx takes them with its own cache; the parity gate holds on padded sources."""

import shutil

import numpy as np
import onnx
from fixtures_train import SEQ2SEQ_IDS
from test_export import perturb

from attnserve.export.parity_seq2seq import run_seq2seq_arena_gate
from attnserve.model.generate import generate_seq2seq
from attnserve.runtime import contract
from attnserve.runtime.ort_decoder import OrtSeq2Seq
from attnserve.tokenizer.utf8 import encode

SOURCES = ["4021", "7", "1000000", "98765"]


def test_manifest_names_the_architecture_and_records_a_passed_gate(tiny_seq2seq_model_dir):
    manifest = contract.read_manifest(tiny_seq2seq_model_dir)  # verifies every sha256
    assert manifest.architecture == "encoder-decoder"
    assert set(manifest.files) == {contract.ENCODER_FILE, contract.DECODER_FILE}
    parity = manifest.parity
    assert parity["passed"] is True and parity["greedy"]["steps"] == 64
    assert all(c["ok"] and c["max_abs_diff"] <= 1e-4 for c in parity["checks"])
    assert manifest.kv_cache == "arena" and len(parity["greedy"]["rows"]) == 5  # arriving at different steps
    assert {"admit B3 sources right-padded slot 2", "admit into slot 3 slot 3", "decode B3 after refill slot 1"} <= {
        c["case"] for c in parity["checks"]
    }
    outputs = {c["output"] for c in parity["checks"]}
    assert {"present.0.decoder.key", "past_key_values.0.encoder.value"} <= outputs  # both arenas, slot by slot


def test_graphs_have_the_contract_io_and_the_decoder_never_sees_the_source(tiny_seq2seq_model_dir):
    n = contract.read_manifest(tiny_seq2seq_model_dir).n_layers
    encoder = onnx.load(str(tiny_seq2seq_model_dir / contract.ENCODER_FILE))
    decoder = onnx.load(str(tiny_seq2seq_model_dir / contract.DECODER_FILE))
    for proto in (encoder, decoder):
        onnx.checker.check_model(proto)
    assert [i.name for i in encoder.graph.input] == contract.seq2seq_encoder_inputs()
    assert [o.name for o in encoder.graph.output] == contract.seq2seq_encoder_outputs(n)
    assert [i.name for i in decoder.graph.input] == contract.seq2seq_decoder_inputs(n)
    # an arena export's decoder ends with each position's greedy token (the server's argmax and logits pass)
    assert [o.name for o in decoder.graph.output] == [*contract.seq2seq_decoder_outputs(n), contract.NEXT_TOKEN]
    # The source reaches the decoder only as the encoder's keys and values (B, H, S, D): they
    # are computed once per request, never per step.
    cross = next(i for i in decoder.graph.input if i.name == "past_key_values.0.encoder.key")
    assert [d.dim_param or d.dim_value for d in cross.type.tensor_type.shape.dim][::2] == ["batch", "source_sequence"]


def test_onnx_greedy_on_a_padded_batch_equals_pytorch(tiny_seq2seq_model_dir, seq2seq_model):
    runtime = OrtSeq2Seq(tiny_seq2seq_model_dir)
    sources = [encode(s) for s in SOURCES]
    got = runtime.greedy(sources, 40)
    expected = generate_seq2seq(seq2seq_model, sources, 40, **{**SEQ2SEQ_IDS, "eos_id": -1})
    assert got.tolist() == expected
    assert len({tuple(row) for row in expected}) == len(SOURCES)  # the model tells sources apart


def test_gate_fails_with_numbers_on_a_perturbed_decoder(tiny_seq2seq_model_dir, seq2seq_model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_seq2seq_model_dir, bad)
    perturb(bad / contract.DECODER_FILE, scale=0.2)
    report = run_seq2seq_arena_gate(seq2seq_model, OrtSeq2Seq(bad, verify=False), steps=64)
    assert not report["passed"]
    failing = [c for c in report["checks"] if not c["ok"]]
    assert failing and all(c["max_abs_diff"] > c["tolerance"] for c in failing)
    assert "logits" in {c["output"] for c in failing}
    assert all(np.isfinite(c["max_abs_diff"]) for c in failing)
