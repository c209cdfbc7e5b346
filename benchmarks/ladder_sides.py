"""One side of the size ladder (benchmarks/size_ladder.py), in a process of its own that keeps its model
loaded between runs: the plain loop over attnserve's arena driver, onnxruntime-genai, PyTorch eager
or CTranslate2.

Reads one JSON request a line on stdin, {"prompts": [[id, ...], ...], "new_tokens": N}, decodes the
prompts (one length) as one batch, greedily, exactly N tokens each (no side stops at EOS), and
answers one JSON line: {"seconds": ..., "tokens": [first row's ids], "rss_bytes": peak resident set
size}. An error is answered as {"error": "..."}. Each side imports only what it needs: genai runs in
.venv-genai, the others in .venv.

    python -m benchmarks.ladder_sides plain --model models/NAME [--threads 2] [--intra-op-spinning auto|off|on]
    python -m benchmarks.ladder_sides torch --model HF_DIR_OR_CHECKPOINT_PT [--threads 2]
    python -m benchmarks.ladder_sides ct2 --model CT2_DIR --compute-type int8 [--threads 2]
    .venv-genai/bin/python -m benchmarks.ladder_sides genai --model models/NAME [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.loadtest.server_process import status_bytes

Decode = Callable[[list[list[int]], int], list[int]]  # (prompts, new tokens) -> the first row's new ids


def plain(args: argparse.Namespace) -> Decode:
    """attnserve's arena driver in a loop, no engine (graph_speed's greedy loop): prefill the batch,
    then one argmax a step. The arena of a batch's size is kept for the next batch of that size, as a
    server keeps its own: allocating it (75 MB a slot at GPT-2 124M) is start-up, not decoding."""
    from attnserve.runtime.model_sessions import ModelSessions
    from benchmarks.graph_speed import fresh_decoder, greedy

    spinning = {"on": True, "off": False}.get(args.intra_op_spinning)  # auto: as attnserve serve chooses
    model = ModelSessions(args.model, provider="cpu", threads=args.threads, spinning=spinning)
    kept: dict = {}  # batch size -> its arena driver; one at a time

    def decode(prompts: list[list[int]], new_tokens: int) -> list[int]:
        if (decoder := kept.get(len(prompts))) is None:
            kept.clear()
            decoder = kept[len(prompts)] = fresh_decoder(model, prompts)
        for slot in range(len(prompts)):
            decoder.clear(slot)
        return greedy(decoder, prompts, new_tokens)[:, 0].tolist()

    return decode


def genai(args: argparse.Namespace) -> Decode:
    """onnxruntime-genai's Generator on the same directory, one static batch, `threads` intra-op threads
    (set through its config, the directory unchanged)."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(args.model)
    options = {"intra_op_num_threads": args.threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)

    def decode(prompts: list[list[int]], new_tokens: int) -> list[int]:
        length = len(prompts[0]) + new_tokens
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(prompts))
        generator = og.Generator(model, params)
        generator.append_tokens(np.array(prompts, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)][len(prompts[0]) :]

    return decode


def torch_eager(args: argparse.Namespace) -> Decode:
    """PyTorch eager with its own KV cache: transformers' generate on a Hugging Face directory, or
    attnserve's reference decode loop (model/generate.py) on a checkpoint.pt of `attnserve train`."""
    import torch

    path: str = args.model
    torch.set_num_threads(args.threads)
    if path.endswith(".pt"):
        from attnserve.model.checkpoint import load_checkpoint
        from attnserve.model.generate import decode as reference_decode

        lm = load_checkpoint(path).eval()
        return lambda prompts, n: reference_decode(lm, prompts, n, lambda logits: logits.argmax(-1), 0)[0].tolist()
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def decode(prompts: list[list[int]], new_tokens: int) -> list[int]:
        ids = torch.tensor(prompts)
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, ids.shape[1] :].tolist()

    return decode


def ct2(args: argparse.Namespace) -> Decode:
    """CTranslate2's Generator on the weights converted by ct2-transformers-converter, greedy
    (sampling_topk=1), in `compute_type` (float32, or int8 quantized as it loads)."""
    import ctranslate2

    generator = ctranslate2.Generator(
        args.model, device="cpu", compute_type=args.compute_type, intra_threads=args.threads, inter_threads=1
    )
    vocabulary = json.loads((Path(args.model) / "vocabulary.json").read_text())  # a list: id -> token

    def decode(prompts: list[list[int]], new_tokens: int) -> list[int]:
        tokens = [[vocabulary[i] for i in prompt] for prompt in prompts]
        results = generator.generate_batch(
            tokens,
            max_length=new_tokens,
            min_length=new_tokens,
            sampling_topk=1,
            include_prompt_in_result=False,
            max_batch_size=len(prompts),
        )
        return list(results[0].sequences_ids[0])

    return decode


SIDES: dict[str, Callable[[argparse.Namespace], Decode]] = {
    "plain": plain,
    "genai": genai,
    "torch": torch_eager,
    "ct2": ct2,
}


def peak_rss_bytes() -> int:
    """This process's peak resident set size, VmHWM (not ru_maxrss: Linux keeps that across exec, so a
    child would report its parent's peak)."""
    return status_bytes("self", "VmHWM")


def serve(decode: Decode) -> None:
    """Answer requests on stdin, one JSON line each, until stdin closes."""
    for line in sys.stdin:
        request = json.loads(line)
        try:
            start = time.perf_counter()
            first = decode(request["prompts"], request["new_tokens"])
            answer = {"seconds": time.perf_counter() - start, "tokens": first, "rss_bytes": peak_rss_bytes()}
        except Exception as e:  # noqa: BLE001 - the coordinator reports it with the side's name
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("side", choices=sorted(SIDES))
    p.add_argument("--model", required=True, help="the side's model: a directory, or a checkpoint.pt for torch")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default: 2)")
    p.add_argument("--compute-type", default="float32", help="CTranslate2's compute type (default: float32)")
    p.add_argument(
        "--intra-op-spinning", choices=("auto", "off", "on"), default="auto", help="plain: as attnserve serve's"
    )
    args = p.parse_args(argv)
    decode = SIDES[args.side](args)
    print(json.dumps({"ready": True, "rss_bytes": peak_rss_bytes()}), flush=True)
    serve(decode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
