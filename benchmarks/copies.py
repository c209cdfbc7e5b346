"""Does a trained decoder continue text it has seen in its prompt? On COUNT passages of the default corpus's
held-out tail (benchmarks/speculative.py's): the checkpoint's bits per token on each passage, and on the same
passage again after a blank line (each but its first token; a model that copies knows the second far better
than the first); and, greedy, how many of its tokens after speculative.py's copy prompt (the passage, a blank
line and its first third again, one word changed) spell the rest of the passage, compared as text (the
prompt's cut may split a word, which the model then finishes in its own tokens). PyTorch, CPU.

    python -m benchmarks.copies runs/copy/checkpoint.pt [--count 12] [--new-tokens 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math

from benchmarks.speculative import copy_prompt, passages


def measure(checkpoint: str, count: int, new_tokens: int) -> dict:
    import torch

    from attnserve.model.checkpoint import load_checkpoint, load_state
    from attnserve.model.generate import generate
    from attnserve.tokenizer import from_state

    model, tokenizer = load_checkpoint(checkpoint).eval(), from_state(load_state(checkpoint).get("tokenizer"))
    bits = {"first": [0.0, 0], "second": [0.0, 0]}
    copied = []
    with torch.no_grad():
        for passage in passages(count, 0):
            once, head = tokenizer.encode(passage), tokenizer.encode(passage + "\n\n")
            ids = head + once
            logits, _ = model(torch.tensor([ids[:-1]]))
            nll = -torch.log_softmax(logits[0].float(), -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            for part, span in (("first", nll[: len(once) - 1]), ("second", nll[len(head) :])):
                bits[part][0] += span.sum().item() / math.log(2)
                bits[part][1] += span.numel()
            prompt = copy_prompt(passage)
            fed = tokenizer.encode(prompt)
            out = generate(model, [fed], new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)[0]
            rest = passage[len(passage) // 3 :]  # what follows the prompt, as text: its cut may split a word
            same = 0
            while same < len(out) and rest.startswith(tokenizer.decode(out[: same + 1])):
                same += 1
            copied.append(same)
    per_token = {part: total / max(n, 1) for part, (total, n) in bits.items()}
    return {"bits_per_token": per_token, "copied_tokens": copied, "new_tokens": new_tokens}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a decoder's checkpoint.pt (attnserve train's)")
    p.add_argument("--count", type=int, default=12, help="held-out passages (default: 12)")
    p.add_argument("--new-tokens", type=int, default=48, help="greedy tokens after each copy prompt (default: 48)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads (default: 2)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    result = measure(args.checkpoint, args.count, args.new_tokens)
    bits = result["bits_per_token"]
    print(f"bits per token: the passage {bits['first']:.3f}, the same again {bits['second']:.3f}")
    print(f"greedy tokens spelling the passage's rest (of {args.new_tokens}): {result['copied_tokens']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
