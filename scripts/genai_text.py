"""Text in, text out through onnxruntime-genai alone: its own tokenizer reads the model directory's
tokenizer.json, encodes each text, decodes the ids back, and greedily continues each text.

Runs in .venv-genai (see check_genai.py). tests/test_genai.py compares what this prints with
attnserve's tokenizer and server on the same directory. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnxruntime_genai as og


def continue_text(model: og.Model, tokenizer: og.Tokenizer, text: str, new_tokens: int) -> str:
    """Greedy continuation of `text` (stops at EOS or after new_tokens), decoded by genai."""
    prompt = tokenizer.encode(text)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return tokenizer.decode(generator.get_sequence(0)[len(prompt) :])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--texts", required=True, help="JSON list of texts")
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args()
    model = og.Model(args.model_dir)
    tokenizer = og.Tokenizer(model)
    rows = []
    for text in json.loads(args.texts):
        ids = [int(i) for i in tokenizer.encode(text)]
        rows.append(
            {
                "text": text,
                "ids": ids,
                "decoded": tokenizer.decode(np.array(ids, dtype=np.int32)),
                "continuation": continue_text(model, tokenizer, text, args.new_tokens),
            }
        )
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
