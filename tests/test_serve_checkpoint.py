"""`attnserve serve --model HF_DIR`: a Hugging Face checkpoint directory (GPT-2, random weights, made
here) served in one command by a real `attnserve serve` process. Its first start imports and exports it
into --export-cache (the proof and the gate reported) and answers OpenAI's own client with what
transformers decodes; its second start serves the same export without importing again; a changed file
makes another export; a checkpoint that cannot be imported is refused with the importer's reason and
leaves nothing in the cache."""

from __future__ import annotations

import shutil

import openai
from fixtures_server import ServeProcess
from test_http_hostile import http_port_of

from attnserve.clients import Client
from attnserve.server.checkpoint_exports import export_key

PROMPT = "Once upon a time"
NEW_TOKENS = 12
READY_S = 300  # a first start imports and exports before it listens


def serve(checkpoint, cache, *flags: str) -> ServeProcess:
    return ServeProcess(
        *("--model", str(checkpoint), "--export-cache", str(cache), "--port", "0", "--http-port", "0"),
        *("--provider", "cpu", "--threads", "1", "--log-stats-interval", "0", *flags),
        ready_timeout=READY_S,
    )


def stopped(served: ServeProcess) -> str:
    """Stop the server (SIGTERM, drained) and return everything it printed."""
    served.proc.terminate()
    code, output = served.wait()
    assert code == 0, output
    return output


def transformers_greedy(checkpoint, prompt: str, steps: int) -> list[int]:
    """transformers' own greedy continuation of `prompt` in the checkpoint (up to its EOS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=steps, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1] :].tolist()


def answers(served: ServeProcess, name: str) -> tuple[str, list[int]]:
    """The openai client's greedy completion of PROMPT over HTTP, and the gRPC door's token ids for it."""
    http = http_port_of(served)
    with openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        assert [m.id for m in c.models.list().data] == [name]
        reply = c.completions.create(model=name, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0)
    with Client(f"127.0.0.1:{served.port}", timeout=60) as client:
        result = client.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert reply.choices[0].text == result.text
    return reply.choices[0].text, list(result.token_ids)


def test_a_checkpoint_is_served_by_one_command_and_its_next_start_reuses_the_export(gpt2_dir, tmp_path):
    cache = tmp_path / "cache"
    first = serve(gpt2_dir, cache)
    try:
        text, ids = answers(first, gpt2_dir.name)
    finally:
        output = stopped(first)
    assert "importing and exporting it once" in output
    assert "greedy tokens identical over" in output  # the import's proof against transformers
    assert "parity passed" in output  # the export's gate
    expected = transformers_greedy(gpt2_dir, PROMPT, NEW_TOKENS)
    assert ids == expected[: len(ids)] and len(ids) in (NEW_TOKENS, len(expected))

    (export,) = [p for p in (cache / "exports").iterdir() if p.is_dir()]
    assert export.name == export_key(gpt2_dir, "float32", None)
    made = {p.name: p.stat().st_mtime_ns for p in export.iterdir()}
    assert "import.json" in made

    second = serve(gpt2_dir, cache)
    try:
        assert answers(second, gpt2_dir.name) == (text, ids)
    finally:
        output = stopped(second)
    assert "serving its export" in output and "importing" not in output and "[export]" not in output
    assert {p.name: p.stat().st_mtime_ns for p in export.iterdir()} == made  # nothing exported again
    assert [p.name for p in (cache / "exports").iterdir() if p.is_dir()] == [export.name]  # no half export left


def test_export_key_follows_the_files_and_the_flags_not_hidden_ones(gpt2_dir, tmp_path):
    copy = shutil.copytree(gpt2_dir, tmp_path / gpt2_dir.name)
    key = export_key(copy, "float32", None)
    assert key == export_key(gpt2_dir, "float32", None)  # the same files, the same export
    assert export_key(copy, "float16", None) != key and export_key(copy, "float32", "int8") != key
    (copy / ".cache").mkdir()
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert export_key(copy, "float32", None) == key
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of one weight
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert export_key(copy, "float32", None) != key


def test_a_checkpoint_that_cannot_be_imported_is_refused_and_leaves_no_export(gpt2_dir, tmp_path):
    broken = shutil.copytree(gpt2_dir, tmp_path / "broken")
    (broken / "tokenizer.json").unlink()
    cache = tmp_path / "cache"
    served = serve(broken, cache)
    assert served.port is None  # it never listened
    code, output = served.wait()
    assert code == 2
    assert "attnserve import: error:" in output  # the importer's own reason
    assert "attnserve serve: error: attnserve import " in output and "failed (exit 2)" in output
    assert [p.name for p in (cache / "exports").iterdir() if not p.name.endswith(".lock")] == []


def test_context_length_is_the_served_models_and_names_its_own_export(gpt2_dir, tmp_path):
    cache = tmp_path / "cache"
    served = serve(gpt2_dir, cache, "--context-length", "32")
    try:
        with Client(f"127.0.0.1:{served.port}", timeout=60) as client:
            info = client.model_info()
            assert info.context_length == 32  # the checkpoint's n_positions is larger
            assert client.generate(PROMPT, max_new_tokens=4).text
    finally:
        stopped(served)
    (export,) = [p for p in (cache / "exports").iterdir() if p.is_dir()]
    assert export.name == export_key(gpt2_dir, "float32", None, 32) and export.name.endswith("-float32-ctx32")
