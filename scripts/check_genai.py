"""Run an exported model directory unchanged in onnxruntime-genai and compare its greedy tokens
with attnserve's own ONNX Runtime loop (which the parity gate tied to PyTorch).

Runs in its own virtual environment: onnxruntime-genai pulls the CPU onnxruntime, which must not
share one with onnxruntime-gpu. `make genai-check MODEL=models/NAME` sets it up and runs this.
Prints one JSON object last; exits 1 if any token differs.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnxruntime_genai as og

from attnserve.runtime.ort_decoder import OrtDecoder

PROMPTS = ["def main():", "The ", "import os\nimport sys\n", "x"]


def genai_greedy(model: og.Model, prompt: list[int], steps: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps, min_length=len(prompt) + steps, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt) :]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--steps", type=int, default=64)
    args = p.parse_args()
    ours = OrtDecoder(args.model_dir)
    model = og.Model(args.model_dir)
    genai_tokenizer = og.Tokenizer(model) if ours.manifest.tokenizer["kind"] != "bytes" else None
    rows = []
    for text in PROMPTS:  # a BPE's prompts are encoded by genai's own tokenizer (tests/test_genai.py: ours agree)
        prompt = (
            [ours.bos_id, *text.encode()] if genai_tokenizer is None else [int(i) for i in genai_tokenizer.encode(text)]
        )
        expected = ours.greedy([prompt], args.steps)[0].tolist()
        got = genai_greedy(model, prompt, args.steps)
        rows.append({"prompt": text, "identical": got == expected, "genai": got, "attnserve": expected})
        print(
            f"{text!r:28} {'identical' if got == expected else 'DIFFERENT'} over {args.steps} tokens", file=sys.stderr
        )
    result = {
        "onnxruntime_genai": og.__version__ if hasattr(og, "__version__") else "unknown",
        "all_identical": all(r["identical"] for r in rows),
        "rows": rows,
    }
    print(json.dumps(result))
    return 0 if result["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
