"""onnxruntime-genai's greedy decoding speed on a model directory, for attnserve's KV benchmark.

Runs in .venv-genai (onnxruntime-genai brings its own onnxruntime). Decodes the given prompts
(token ids, all the same length) as one static batch, exactly --new-tokens each (min_length =
max_length, so EOS does not end a row early), and times it after loading the model and one
warm-up. Prints one JSON object: tokens, seconds, tokens_per_s, and the tokens themselves.

    .venv-genai/bin/python benchmarks/genai_bench.py models/NAME --prompts '[[256, 84, ...], ...]' --new-tokens 256
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime_genai as og


def decode(model: og.Model, prompts: np.ndarray, new_tokens: int) -> list[list[int]]:
    """Greedy tokens after each prompt of the static batch."""
    length = prompts.shape[1] + new_tokens
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(prompts)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][prompts.shape[1] :] for i in range(len(prompts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--prompts", required=True, help="JSON list of token-id lists of one length")
    p.add_argument("--new-tokens", type=int, required=True)
    args = p.parse_args()
    prompts = np.array(json.loads(args.prompts), dtype=np.int32)
    model = og.Model(args.model_dir)
    decode(model, prompts, 8)  # warm-up
    start = time.perf_counter()
    tokens = decode(model, prompts, args.new_tokens)
    seconds = time.perf_counter() - start
    count = sum(len(t) for t in tokens)
    print(
        json.dumps(
            {
                "batch": len(prompts),
                "tokens": count,
                "seconds": seconds,
                "tokens_per_s": count / seconds,
                "token_ids": tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
