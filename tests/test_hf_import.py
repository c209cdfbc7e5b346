"""`attnserve import` of Hugging Face checkpoints of each family (GPT-2; Llama with grouped KV heads and
an untied head; Qwen2 with q/k/v biases and a tied head; Mistral with a byte-fallback tokenizer),
random weights from configs made here: the import proves itself against transformers, the export
gates it as any model, and the server's greedy tokens over gRPC equal transformers' own `generate`,
alone and batched, with the streamed text the tokenizer's decode; what the import cannot express is
refused in one line naming the field."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest
import torch
from fixtures_server import start_server

from attnserve.cli import main as cli_main
from attnserve.model.hf.decoders import ARCHITECTURES
from attnserve.v1 import generation_pb2 as pb

pytestmark = pytest.mark.trains  # trains or imports a model with torch: out of `make test-fast`

PROMPTS = [
    "The",
    "def parse_args(argv):",
    "Once upon a time",
    "import os\nimport sys",
    "1, 2, 3, 5, 8,",
    "Paris is the capital of",
    "héllo wörld",
    "class Node:\n    def __init__(self):",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def reference(hf_dir):
    """transformers' own model and tokenizer of the directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return model, AutoTokenizer.from_pretrained(hf_dir)


def transformers_greedy(reference, prompt: str) -> list[int]:
    """transformers' generate(do_sample=False), EOS held back for NEW_TOKENS as ignore_eos holds it."""
    import torch

    model, tokenizer = reference
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        held = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.eos_token_id)
        out = model.generate(ids, do_sample=False, **held)
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def hf_server(hf_model_dir):
    running = start_server(hf_model_dir, max_batch=8)
    yield running
    running.stop()


def generate(stub, prompt: str, **fields) -> pb.GenerateResponse:
    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True, **fields)
    return stub.Generate(request, timeout=120)


def test_the_import_proves_itself_and_writes_the_run(hf_checkpoint):
    report = json.loads((hf_checkpoint.parent / "import.json").read_text())
    assert report["architecture"] in ARCHITECTURES and report["parameters"] > 0
    assert report["logits"]["max_abs_diff"] <= report["logits"]["tolerance"] <= 1e-4 * max(1, report["logits"]["scale"])
    assert report["greedy"]["identical"] and len(report["greedy"]["prompts"]) == 8
    assert all(row["steps"] == 64 for row in report["greedy"]["prompts"])
    assert {p.name for p in hf_checkpoint.parent.iterdir()} >= {"tokenizer.json", "tokenizer_config.json"}


def test_the_command_line_imports_and_says_what_it_proved(gpt2_dir, tmp_path, capsys):
    assert cli_main(["import", str(gpt2_dir), "--out", str(tmp_path / "run"), "--steps", "8"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"imported {gpt2_dir} (GPT2LMHeadModel, ") and "greedy tokens identical over" in said
    assert (tmp_path / "run" / "checkpoint.pt").is_file()


def test_served_greedy_tokens_are_transformers_alone_and_batched(hf_server, reference):
    expected = [transformers_greedy(reference, prompt) for prompt in PROMPTS]
    alone = [list(generate(hf_server.stub, prompt).token_ids) for prompt in PROMPTS]
    batched: dict[int, list[int]] = {}

    def call(i: int) -> None:
        batched[i] = list(generate(hf_server.stub, PROMPTS[i]).token_ids)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert alone == expected
    assert [batched[i] for i in range(len(PROMPTS))] == expected


def test_beam_search_of_a_decoder_is_transformers_alone_and_batched(hf_server, reference):
    """Beam search with 4 beams, two hypotheses back, on a decoder-only model: its prompt prefilled once
    and forked into 4 slots; tokens equal to transformers' generate(num_beams=4), alone and batched."""
    model, tokenizer = reference
    prompts, steps = PROMPTS[:4], 16
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(
                ids, num_beams=4, num_return_sequences=2, max_new_tokens=steps, pad_token_id=tokenizer.eos_token_id
            )
        found = [sequence[ids.shape[1] :] for sequence in out.tolist()]
        eos = tokenizer.eos_token_id
        expected.append([tokens[: tokens.index(eos)] if eos in tokens else tokens for tokens in found])
    asked = dict(max_new_tokens=steps, num_beams=4, num_return_sequences=2)
    call = lambda prompt: hf_server.stub.Generate(pb.GenerateRequest(prompt=prompt, **asked), timeout=120)
    run = lambda prompt: [list(c.token_ids) for c in call(prompt).completions]
    assert [run(prompt) for prompt in prompts] == expected
    results: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: results.setdefault(i, run(prompts[i]))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results[i] for i in range(4)] == expected


def test_streamed_text_is_the_tokenizers_decode_and_seeded_sampling_holds_in_a_batch(hf_server, reference):
    _, tokenizer = reference
    stream = list(hf_server.stub.GenerateStream(pb.GenerateRequest(prompt=PROMPTS[6], max_new_tokens=40), timeout=60))
    ids = [t for message in stream for t in message.token_ids]
    assert "".join(m.text for m in stream) == tokenizer.decode(ids, skip_special_tokens=True)
    sampled = dict(temperature=0.9, seed=11)
    alone = generate(hf_server.stub, PROMPTS[1], **sampled).token_ids
    beside: list = []
    other = threading.Thread(target=lambda: beside.append(generate(hf_server.stub, PROMPTS[2], **sampled)))
    other.start()
    assert generate(hf_server.stub, PROMPTS[1], **sampled).token_ids == alone
    other.join(60)


def test_model_info_names_the_imported_models_tokenizer(hf_server, reference):
    _, tokenizer = reference
    info = hf_server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.tokenizer.kind == "bpe" and info.tokenizer.eos_id == tokenizer.eos_token_id
    assert info.tokenizer.bos_prepended == (tokenizer("a").input_ids[0] == tokenizer.bos_token_id)
    assert info.vocab_size == len(tokenizer)


def test_the_exported_graph_is_fused_as_onnxruntime_genai_writes_it(hf_model_dir):
    """Each GroupQueryAttention turns rotary positions itself from the graph's position_ids where it can
    (head sizes of a multiple of 16; Mistral's here are 8: turned by separate nodes before it) and takes
    q/k/v packed from one projection (with or without biases) wherever nothing stands between them;
    RMSNorm is one SimplifiedLayerNormalization and GPT-2's tanh GELU one FastGelu (the parity gate
    passed on this graph)."""
    import onnx

    from attnserve.export.graphs import ROTARY_HEAD_MULTIPLE
    from attnserve.runtime import contract

    config = contract.read_manifest(hf_model_dir).config
    proto = onnx.load(str(hf_model_dir / contract.MODEL_FILE))
    ops = [node.op_type for node in proto.graph.node]
    producer = {output: node for node in proto.graph.node for output in node.output}
    in_op = config["positional"] == "rotary" and (config["d_model"] // config["n_heads"]) % ROTARY_HEAD_MULTIPLE == 0
    packed = in_op or config["positional"] != "rotary"
    for node in (n for n in proto.graph.node if n.op_type == "GroupQueryAttention"):
        assert (list(node.input[1:3]) == ["", ""]) == packed
        assert not packed or producer[node.input[0]].op_type in ("MatMul", "Add")
        rotary = {a.name: a.i for a in node.attribute}.get("do_rotary", 0)
        assert rotary == in_op and (node.input[9] == contract.POSITION_IDS if in_op else len(node.input) <= 7)
    rms = config["norm"] == "rmsnorm"
    assert ops.count("SimplifiedLayerNormalization") == (2 * config["n_layers"] + 1 if rms else 0)
    assert "ReduceMean" not in ops if rms else ops.count("LayerNormalization") == 2 * config["n_layers"] + 1
    assert ops.count("FastGelu") == (config["n_layers"] if config["activation"] == "gelu_tanh" else 0)
    assert "Tanh" not in ops and "Erf" not in ops


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
SCALINGS = {
    "linear": {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0},
    "llama3": {**LLAMA3, "rope_theta": 5e5, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_rotary_scalings_are_imported_and_proven(llama_dir, tmp_path, capsys, scaling):
    """Llama 3.1's scaled frequencies and linear interpolation: transformers' logits and greedy tokens."""
    hf = Path(shutil.copytree(llama_dir, tmp_path / "hf"))
    edit_config(hf, rope_parameters=SCALINGS[scaling])
    assert cli_main(["import", str(hf), "--out", str(tmp_path / "run"), "--steps", "16"]) == 0
    report = json.loads((tmp_path / "run" / "import.json").read_text())
    assert report["greedy"]["identical"] and report["logits"]["max_abs_diff"] <= report["logits"]["tolerance"]
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["config"]["rope_scaling"]["rope_type"] == scaling and state["config"]["rope_theta"] == 5e5


@pytest.mark.parametrize("family_dir", ["gpt2_dir", "llama_dir"])
def test_a_shorter_context_serves_fewer_positions_and_still_proves(request, tmp_path, family_dir):
    hf = request.getfixturevalue(family_dir)
    assert cli_main(["import", str(hf), "--out", str(tmp_path / "run"), "--context-length", "48"]) == 0
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["config"]["max_len"] == 48 and state["imported"]["greedy"]["identical"]
    assert all(row["prompt_tokens"] + row["steps"] <= 48 for row in state["imported"]["greedy"]["prompts"])


@pytest.mark.parametrize("family_dir", ["gpt2_dir", "marian_dir"])
def test_the_shortest_context_passes_every_export_gate_and_serves_within_it(request, tmp_path, family_dir):
    """--context-length 8, the least attnserve import takes: the import's proof and the export's gates
    fit their prompts and sources (13 positions and below, and a 12-token target, which crashed them)
    into the 8 positions, every gate passes, and the server generates within them."""
    run, model = tmp_path / "run", tmp_path / "model"
    hf = request.getfixturevalue(family_dir)
    assert cli_main(["import", str(hf), "--out", str(run), "--context-length", "8"]) == 0
    assert cli_main(["export", str(run / "checkpoint.pt"), "--out", str(model)]) == 0
    parity = json.loads((model / "attnserve.json").read_text())["parity"]
    assert parity["passed"] and parity["beams"]["identical"] and parity["greedy"]["steps"] >= 1
    concat = tmp_path / "concat"  # the layout before the arena: its gate's cases fitted too, none empty
    assert cli_main(["export", str(run / "checkpoint.pt"), "--out", str(concat), "--kv-cache", "concat"]) == 0
    cases = {c["case"] for c in json.loads((concat / "attnserve.json").read_text())["parity"]["checks"]}
    fitted = [dict(re.findall(r"\b([STP])(\d+)\b", case)) for case in cases]
    assert all(int(f["T"]) >= 1 and int(f["T"]) + int(f["P"]) <= 8 and int(f.get("S", 1)) <= 8 for f in fitted)
    served = start_server(model)
    try:
        ids = [11, 12, 13]
        reply = served.stub.Generate(pb.GenerateRequest(prompt_token_ids=ids, max_new_tokens=5, ignore_eos=True))
        assert len(reply.token_ids) == 5 and reply.finish_reason == pb.FINISH_REASON_LENGTH
    finally:
        served.stop()


def test_several_eos_ids_end_a_completion_where_transformers_ends_it(llama_dir, tmp_path):
    """generation_config.json's eos_token_id as a list (Llama 3's instruct models have three): any of
    them ends the completion with finish reason EOS, where transformers' generate stops."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnserve.export.onnx_export import export_checkpoint

    hf = Path(shutil.copytree(llama_dir, tmp_path / "hf"))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf).eval(), AutoTokenizer.from_pretrained(hf)
    free = transformers_greedy((model, tokenizer), PROMPTS[1])
    index = max(i for i in range(len(free)) if free[i] not in free[:i])  # a token the model says, first there
    generation = json.loads((hf / "generation_config.json").read_text())
    eos_ids = [tokenizer.eos_token_id, free[index]]
    (hf / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": eos_ids}))
    assert cli_main(["import", str(hf), "--out", str(tmp_path / "run"), "--steps", "8"]) == 0
    export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "model")
    running = start_server(tmp_path / "model")
    try:
        reply = running.stub.Generate(pb.GenerateRequest(prompt=PROMPTS[1], max_new_tokens=NEW_TOKENS), timeout=60)
        held = running.stub.Generate(
            pb.GenerateRequest(prompt=PROMPTS[1], max_new_tokens=NEW_TOKENS, ignore_eos=True), timeout=60
        )
    finally:
        running.stop()
    ids = tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    stopped = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos_ids)[0, ids.shape[1] :]
    assert list(reply.token_ids) == free[:index] == stopped.tolist()[:-1] and stopped.tolist()[-1] in eos_ids
    assert reply.finish_reason == pb.FINISH_REASON_EOS and not set(held.token_ids) & set(eos_ids)


KINDS = [{"dtype": "float16"}, {"quantize": "int8"}, {"quantize": "int4"}]


@pytest.mark.parametrize("kind", KINDS, ids=["float16", "int8", "int4"])
def test_an_imported_llama_exports_in_float16_int8_and_int4_through_their_gates(llama_dir, tmp_path, kind):
    """The export's gates hold for an imported model as for a trained one (grouped KV heads, rotary;
    the quantized gates on the default corpus's held-out text); each MLP's gate and up projections are
    one product by their weights side by side, split after (export/fusions.py's pack_siblings): no two
    products by a weight read one activation."""
    import onnx

    from attnserve.export.onnx_export import export_checkpoint
    from attnserve.model.hf.import_cli import run
    from attnserve.runtime import contract

    run(llama_dir, tmp_path / "run", steps=4)
    manifest = export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "model", **kind)
    assert manifest.dtype == kind.get("dtype", "float32") and manifest.quantization == kind.get("quantize")
    graph = onnx.load(str(tmp_path / "model" / contract.MODEL_FILE)).graph
    weights = {tensor.name for tensor in graph.initializer}
    products = [
        node.input[0]
        for node in graph.node
        if node.op_type in ("MatMul", "MatMulNBits", "MatMulIntegerToFloat") and node.input[1] in weights
    ]
    assert len(products) == len(set(products)) and len(products) >= 4 * manifest.n_layers
    assert [node.op_type for node in graph.node].count("Split") == manifest.n_layers
    assert (
        json.loads((tmp_path / "model" / "genai_config.json").read_text())["model"]["decoder"]["num_key_value_heads"]
        == 2
    )


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def parse_args(argv):"}]


def test_the_models_chat_template_serves_chat_completions_as_transformers_applies_it(llama_dir, tmp_path):
    """tokenizer_config.json's chat template goes with the model: /v1/chat/completions renders the
    messages with it, its BOS and EOS text read as their ids (as apply_chat_template tokenizes), and
    the greedy answer is transformers' generate on those ids."""
    import httpx2 as httpx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnserve.export.onnx_export import export_checkpoint

    hf = Path(shutil.copytree(llama_dir, tmp_path / "hf"))
    token_config = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**token_config, "chat_template": CHAT_TEMPLATE}))
    assert cli_main(["import", str(hf), "--out", str(tmp_path / "run"), "--steps", "8"]) == 0
    export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "model")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf).eval(), AutoTokenizer.from_pretrained(hf)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    assert ids[0, 0] == tokenizer.bos_token_id and (ids[0] == tokenizer.eos_token_id).sum() == 2
    expected = model.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16)[0, ids.shape[1] :]
    running = start_server(tmp_path / "model", http_port=0)
    try:
        body = {"model": "model", "messages": MESSAGES, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        url = f"http://127.0.0.1:{running.server.http.port}/v1/chat/completions"
        answer = httpx.post(url, json=body, timeout=60).json()
    finally:
        running.stop()
    assert answer["usage"]["prompt_tokens"] == ids.shape[1]
    assert answer["choices"][0]["message"]["content"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_pytorch_bin_and_sharded_safetensors_import_alike(llama_dir, tmp_path):
    """The other ways transformers saves weights: pytorch_model.bin (read with weights_only=True) and
    safetensors shards with their index: the same checkpoint as from model.safetensors."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(llama_dir / "model.safetensors"))
    names = sorted(weights)
    as_bin = Path(shutil.copytree(llama_dir, tmp_path / "bin"))
    (as_bin / "model.safetensors").unlink()
    torch.save(weights, as_bin / "pytorch_model.bin")
    sharded = Path(shutil.copytree(llama_dir, tmp_path / "sharded"))
    (sharded / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in halves.items():
        save_file({name: weights[name].contiguous() for name in part}, str(sharded / shard))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": {n: shard for shard, part in halves.items() for n in part},
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    states = []
    for name, hf in (("plain", llama_dir), ("bin", as_bin), ("sharded", sharded)):
        assert cli_main(["import", str(hf), "--out", str(tmp_path / name), "--steps", "4"]) == 0
        states.append(torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"])
    for state in states[1:]:
        assert state.keys() == states[0].keys() and all(torch.equal(state[k], states[0][k]) for k in state)


def refused(args: list[str], capsys) -> str:
    assert cli_main(["import", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("attnserve import: error: ")
    return err


def edit_config(hf: Path, **fields) -> None:
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, **fields}))


REFUSALS = [  # (id, the directory spoiled, how, what the one line says)
    ("config.json", "gpt2", lambda hf: (hf / "config.json").unlink(), "config.json: not found"),
    ("weights", "gpt2", lambda hf: (hf / "model.safetensors").unlink(), "no weights (model.safetensors"),
    ("tokenizer.json", "gpt2", lambda hf: (hf / "tokenizer.json").unlink(), "tokenizer.json: not found"),
    ("bad tokenizer", "gpt2", lambda hf: (hf / "tokenizer.json").write_text("{}"), "not a valid tokenizer.json"),
    ("architecture", "gpt2", lambda hf: edit_config(hf, architectures=["MambaForCausalLM"]), "architectures ['Mamba"),
    ("activation", "gpt2", lambda hf: edit_config(hf, activation_function="swish"), "activation_function 'swish'"),
    (
        "layer scaling",
        "gpt2",
        lambda hf: edit_config(hf, scale_attn_by_inverse_layer_idx=True),
        "scale_attn_by_inverse",
    ),
    ("head size", "gpt2", lambda hf: edit_config(hf, n_head=16), "n_embd 64: / n_head 16 must be a multiple of 8"),
    (
        "rope scaling",
        "llama",
        lambda hf: edit_config(hf, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
        "rope_parameters rope_type 'yarn': not one of default, linear, llama3",
    ),
    ("sliding window", "llama", lambda hf: edit_config(hf, sliding_window=64), "sliding_window 64: sliding-window"),
    ("hidden_act", "llama", lambda hf: edit_config(hf, hidden_act="gelu"), "hidden_act 'gelu': the feed-forward"),
    ("vocabulary", "llama", lambda hf: edit_config(hf, vocab_size=512), "tokenizer.json has 402 ids, config.json's"),
]


@pytest.mark.parametrize("base, spoil, message", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_what_cannot_be_imported_is_refused_in_one_line_naming_it(
    gpt2_dir, llama_dir, tmp_path, capsys, base, spoil, message
):
    hf = Path(shutil.copytree({"gpt2": gpt2_dir, "llama": llama_dir}[base], tmp_path / "hf"))
    spoil(hf)
    assert message in refused([str(hf), "--out", str(tmp_path / "run")], capsys)
    assert not (tmp_path / "run").exists()
