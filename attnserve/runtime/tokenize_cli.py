"""`attnserve tokenize`: a model directory's tokenizer from the command line, to find the ids a
request's `logit_bias`, `stop_token_ids` or `prompt_token_ids` want, or to read ids back as text.

    attnserve tokenize --model models/NAME "def parse_args("    one line per id: the id, its text (JSON)
    attnserve tokenize --model models/NAME --no-bos "def"       without the BOS a text prompt gets
    attnserve tokenize --model models/NAME --ids 256,100,101    the text of the ids
    attnserve tokenize ... --json                               one JSON object (vLLM's /tokenize shape)

The ids are the ones the server makes of the same text (the HTTP door's POST /tokenize answers the
same). Torch-free and server-free: the directory's manifest and tokenizer files only.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..tokenizer import TokenizerError, from_model_dir
from .contract import ModelDirError, read_manifest


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("text", nargs="?", help="the text to tokenize (without --ids)")
    p.add_argument("--ids", help="comma-separated token ids to turn back into text, e.g. 256,100,101")
    p.add_argument("--no-bos", action="store_true", help="leave out the BOS a text prompt gets (bytes models)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line per id")


def main(args) -> int:
    def refuse(message: str) -> int:
        print(f"attnserve tokenize: error: {message}", file=sys.stderr)
        return 2

    if (args.text is None) == (args.ids is None):
        return refuse("give a text or --ids, one of them")
    try:
        manifest = read_manifest(args.model)
        tokenizer = from_model_dir(args.model, manifest.tokenizer)
    except (ModelDirError, TokenizerError) as e:
        return refuse(f"--model {args.model}: {e}")
    if args.ids is not None:
        try:
            ids = [int(i) for i in args.ids.split(",")]
        except ValueError:
            return refuse(f"--ids {args.ids!r}: comma-separated integers expected, e.g. 256,100,101")
        wrong = next((i for i in ids if not 0 <= i < tokenizer.vocab_size), None)
        if wrong is not None:
            return refuse(f"--ids: id {wrong} is outside this model's [0, {tokenizer.vocab_size})")
        text = tokenizer.decode(ids)
        print(json.dumps({"prompt": text}) if args.json else text)
        return 0
    ids = tokenizer.encode(args.text) if args.no_bos else tokenizer.encode_prompt(args.text)
    pieces = [tokenizer.decode([i]) for i in ids]
    if args.json:
        print(json.dumps({"count": len(ids), "tokens": ids, "token_strs": pieces}))
        return 0
    for token_id, piece in zip(ids, pieces):
        print(f"{token_id}\t{json.dumps(piece, ensure_ascii=False)}")
    print(f"{len(ids)} tokens", file=sys.stderr)
    return 0
