"""The prompts `attnserve bench` sends: exact lengths of token ids drawn from the server's vocabulary
(the default), or ASCII text cut from one English passage (--prompt-text, and every prompt sent to an
OpenAI-compatible server), each set drawn from a seed so that a run is repeatable."""

from __future__ import annotations

import random

from .types import TokenizerInfo

# The local text prompts are cut from: varied slices, so no two requests share a prefix.
PASSAGE = (
    "An attention function can be described as mapping a query and a set of key-value pairs "
    "to an output, where the query, keys, values, and output are all vectors. The output is "
    "computed as a weighted sum of the values, where the weight assigned to each value is "
    "computed by a compatibility function of the query with the corresponding key. "
    "Multi-head attention allows the model to jointly attend to information from different "
    "representation subspaces at different positions. Since our model contains no recurrence "
    "and no convolution, in order for the model to make use of the order of the sequence, we "
    "must inject some information about the relative or absolute position of the tokens in "
    "the sequence. def parse_args(argv=None):\n    parser = argparse.ArgumentParser()\n"
    "    return parser.parse_args(argv)\nfor key, value in sorted(items.items()):\n"
)


def make_prompts(count: int, prompt_tokens: int, seed: int) -> list[str]:
    """`count` ASCII prompts of prompt_tokens byte tokenizer tokens (BOS + bytes), from PASSAGE."""
    rng = random.Random(seed)
    length = prompt_tokens - 1
    text = PASSAGE * (length // len(PASSAGE) + 2)
    return [text[start : start + length] for start in (rng.randrange(len(PASSAGE)) for _ in range(count))]


def make_token_prompts(count: int, prompt_tokens: int, seed: int, tokenizer: TokenizerInfo) -> list[list[int]]:
    """`count` prompts of exactly prompt_tokens ids, drawn from the vocabulary less BOS/EOS/PAD."""
    rng = random.Random(seed)
    ids = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids]
    return [rng.choices(ids, k=prompt_tokens) for _ in range(count)]
