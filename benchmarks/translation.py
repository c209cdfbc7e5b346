"""Translation: attnserve served through gRPC against CTranslate2 on the same Marian weights, greedy and
beam 4, at 1 and 16 requests at a time; and the `numbers` model's exact match, greedy against beam 4.
With --parity, the served hypotheses against transformers' at this shape first.

    python -m benchmarks.translation --work runs/translation --out reports/translation.json \\
        --plot reports/translation.png
    python -m benchmarks.translation --parity --skip-compare --skip-numbers --out reports/translation-parity.json
    git worktree add /tmp/before COMMIT
    python -m benchmarks.translation --tree-a /tmp/before --model-a DIR --skip-numbers --out reports/translation.json

The model is a Marian checkpoint of OPUS-MT's shape (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048,
58,101 ids; random weights and SentencePiece models trained on CPython's docs: nothing downloaded,
benchmarks/hf_checkpoints.py), imported and exported by attnserve (float32) and converted by
CTranslate2's own converter (float32). The sentences are lines of CPython's docs of mixed lengths.
attnserve: `attnserve serve --threads T`, each request a unary Generate call, `concurrency` callers at
a time. CTranslate2: a Translator (intra_threads T) in this process, `translate_batch` of
`concurrency` sentences at a time (its batches are static: a batch ends with its longest
translation), each request's latency its batch's. Both decode at most --new-tokens tokens per
sentence (random weights rarely choose EOS, so most run to it). The sides alternate in rounds;
medians with ranges. Tokens/s counts each request's best hypothesis. With --tree-a, a third side: attnserve
served from another checkout (a before/after of a change; --model-a: its export, where the change
altered the export), in the same rounds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnserve.report_stamp import Stamp, write_report

CASES = ((1, 1), (4, 1), (1, 16), (4, 16))  # (beams, concurrency)


def progress(message: str) -> None:
    print(f"[translation] {message}", file=sys.stderr, flush=True)


def attnserve(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "attnserve.cli", *args], check=True, stdout=subprocess.DEVNULL)


def build(work: Path, small: bool = False) -> tuple[Path, Path, Path]:
    """The Marian directory, attnserve's export of it and CTranslate2's conversion (each made once);
    `small`: the tests' small Marian instead of OPUS-MT's shape (a smoke run)."""
    from benchmarks.hf_checkpoints import OPUS_MT_SHAPE, OPUS_MT_VOCAB, save_marian

    hf, run, model, ct2 = work / "hf", work / "run", work / "model", work / "ct2"
    if not (hf / "model.safetensors").is_file():
        progress("making a Marian checkpoint (random weights)")
        if small:
            save_marian(hf)
        else:
            save_marian(hf, pieces=2000, vocab_size=OPUS_MT_VOCAB, init_std=0.02, **OPUS_MT_SHAPE)
    if not (run / "checkpoint.pt").is_file():
        progress("attnserve import (with its proof)")
        attnserve("import", str(hf), "--out", str(run))
    if not (model / "attnserve.json").is_file():
        progress("attnserve export (with its gate)")
        attnserve("export", str(run / "checkpoint.pt"), "--out", str(model))
    if not (ct2 / "model.bin").is_file():
        progress("CTranslate2's converter")
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(hf)).convert(str(ct2), force=True)
    return hf, model, ct2


def sentences(tokenizer, count: int) -> list[str]:
    """`count` lines of CPython's docs spread over lengths of 3 to 80 source tokens."""
    from benchmarks.hf_checkpoints import corpus_lines

    lines = sorted({line for line in corpus_lines(60, 19) if 3 <= len(tokenizer.encode(line)) <= 80}, key=len)
    step = max(1, len(lines) // count)
    return lines[::step][:count]


class Served:
    """attnserve serve's process and its unary Generate calls."""

    def __init__(self, model: Path, threads: int, tree: str | None = None):
        """`tree`: the checkout whose attnserve serves (None: this one)."""
        import grpc

        from attnserve.v1 import generation_pb2_grpc
        from benchmarks.loadtest.server_process import ServerProcess

        # an absolute path: another checkout's server runs in that checkout
        self.server = ServerProcess(
            str(Path(model).resolve()), "--threads", str(threads), "--max-batch", "64", cwd=tree
        )
        self.channel = grpc.insecure_channel(self.server.target)
        self.stub = generation_pb2_grpc.TextGenerationStub(self.channel)

    def call(self, text: str, new_tokens: int, beams: int, penalty: float = 1.0, returned: int = 1):
        """One unary Generate call: greedy, or beam search with `beams` beams."""
        from attnserve.v1 import generation_pb2 as pb

        request = pb.GenerateRequest(prompt=text, max_new_tokens=new_tokens)
        if beams > 1:
            request.num_beams, request.length_penalty, request.num_return_sequences = beams, penalty, returned
        return self.stub.Generate(request)

    def translate(self, texts: list[str], beams: int, concurrency: int, new_tokens: int) -> list[tuple]:
        """(token ids, seconds) of each text's best hypothesis, `concurrency` calls at a time."""

        def one(text: str) -> tuple:
            start = time.perf_counter()
            reply = self.call(text, new_tokens, beams)
            return list(reply.token_ids), time.perf_counter() - start

        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(one, texts))

    def hypotheses(self, texts: list[str], beams: int, penalty: float, returned: int, new_tokens: int) -> list:
        """Each text's hypotheses' token ids (best first), every text's call at once."""

        def one(text: str) -> list[list[int]]:
            reply = self.call(text, new_tokens, beams, penalty, returned)
            return [list(c.token_ids) for c in reply.completions] or [list(reply.token_ids)]

        with ThreadPoolExecutor(len(texts)) as pool:
            return list(pool.map(one, texts))

    def close(self) -> None:
        self.channel.close()
        self.server.stop()


class Ct2:
    """CTranslate2's Translator on the converted weights; `concurrency` sentences per batch."""

    def __init__(self, ct2: Path, hf: Path, threads: int):
        import ctranslate2
        from transformers import MarianTokenizer

        self.translator = ctranslate2.Translator(str(ct2), device="cpu", intra_threads=threads, inter_threads=1)
        self.tokenizer = MarianTokenizer.from_pretrained(hf)

    def translate(self, texts: list[str], beams: int, concurrency: int, new_tokens: int) -> list[tuple]:
        out = []
        for first in range(0, len(texts), concurrency):
            batch = texts[first : first + concurrency]
            tokens = [self.tokenizer.convert_ids_to_tokens(self.tokenizer(text).input_ids) for text in batch]
            start = time.perf_counter()
            results = self.translator.translate_batch(
                tokens, beam_size=beams, max_decoding_length=new_tokens, max_batch_size=concurrency
            )
            seconds = time.perf_counter() - start
            out += [(self.tokenizer.convert_tokens_to_ids(r.hypotheses[0]), seconds) for r in results]
        return out

    def close(self) -> None:
        pass


def tokens_per_s(run: list[tuple], seconds: float) -> float:
    """A round's best hypotheses' tokens (token ids, seconds each) over its `seconds`."""
    return sum(len(ids) for ids, _ in run) / seconds


def summary(runs: list[list[tuple]], elapsed: list[float]) -> dict:
    """Tokens/s and latency medians (min-max) over rounds."""
    rates = [tokens_per_s(run, seconds) for run, seconds in zip(runs, elapsed)]
    p50 = [statistics.median(s for _, s in run) * 1000 for run in runs]
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_range": [min(rates), max(rates)],
        "latency_p50_ms": statistics.median(p50),
        "latency_p50_ms_range": [min(p50), max(p50)],
        "tokens": sum(len(ids) for ids, _ in runs[0]),
    }


def compare(args: argparse.Namespace, hf: Path, model: Path, ct2: Path) -> list[dict]:
    from transformers import MarianTokenizer

    texts = sentences(MarianTokenizer.from_pretrained(hf), args.sentences)
    sides: dict[str, Served | Ct2] = {}
    runs: dict[tuple, list] = {}
    try:  # a side that fails to start closes those started before it
        sides["attnserve"] = Served(model, args.threads)
        sides["ctranslate2"] = Ct2(ct2, hf, args.threads)
        if args.tree_a:
            sides["before"] = Served(args.model_a or model, args.threads, str(args.tree_a))
        for side in sides.values():  # warm-up: one pass of the smallest case
            side.translate(texts[:4], 1, 1, 8)
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for beams, concurrency in CASES:
                for name in order:
                    chosen = texts if concurrency > 1 else texts[: args.sentences_alone]
                    start = time.perf_counter()
                    out = sides[name].translate(chosen, beams, concurrency, args.new_tokens)
                    runs.setdefault((name, beams, concurrency), []).append((out, time.perf_counter() - start))
                    progress(
                        f"round {round_ + 1} {name} beams {beams} x {concurrency}: {time.perf_counter() - start:.1f} s"
                    )
    finally:
        for side in sides.values():
            side.close()
    rows = []
    for beams, concurrency in CASES:
        row: dict = {"beams": beams, "concurrency": concurrency}
        for name in sides:
            done = runs[(name, beams, concurrency)]
            row[name] = summary([out for out, _ in done], [seconds for _, seconds in done])
        mine, theirs = (runs[(name, beams, concurrency)][0][0] for name in ("attnserve", "ctranslate2"))
        row["same_tokens"] = sum(a[0] == b[0] for a, b in zip(mine, theirs))
        row["sentences"] = len(mine)
        row["ratio"] = row["attnserve"]["tokens_per_s"] / row["ctranslate2"]["tokens_per_s"]
        if "before" in sides:
            after, before = (runs[(name, beams, concurrency)] for name in ("attnserve", "before"))
            ratios = [tokens_per_s(a, sa) / tokens_per_s(b, sb) for (a, sa), (b, sb) in zip(after, before)]
            row["after_over_before"] = statistics.median(ratios)
            row["after_over_before_range"] = [min(ratios), max(ratios)]
            row["before_ratio"] = row["before"]["tokens_per_s"] / row["ctranslate2"]["tokens_per_s"]
            row["same_tokens_before"] = sum(a[0] == b[0] for a, b in zip(mine, before[0][0]))
        rows.append(row)
    return rows


PARITY_CASES = ((1, 1.0), (2, 0.6), (2, 1.0), (4, 0.6), (4, 1.0), (5, 0.6), (5, 1.0))  # (beams, length penalty)


def parity(args: argparse.Namespace, hf: Path, model: Path) -> list[dict]:
    """At this shape: 16 sources, all at once through the server, against transformers' generate (beam
    search with two hypotheses back), for each case: how many sources give the same tokens."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, reference = MarianTokenizer.from_pretrained(hf), MarianMTModel.from_pretrained(hf).eval()
    texts = sentences(tokenizer, 16)
    served = Served(model, args.threads)
    rows = []
    try:
        for beams, penalty in PARITY_CASES:
            returned = min(beams, 2)
            expected = []
            for text in texts:
                with torch.no_grad():
                    out = reference.generate(
                        **tokenizer([text], return_tensors="pt"),
                        num_beams=beams,
                        length_penalty=penalty,
                        num_return_sequences=returned,
                        max_new_tokens=args.new_tokens,
                        forced_eos_token_id=None,
                    )
                found = [seq[1:] for seq in out.tolist()]
                expected.append([seq[: seq.index(0)] if 0 in seq else seq for seq in found])
            got = served.hypotheses(texts, beams, penalty, returned, args.new_tokens)
            same = sum(mine == theirs for mine, theirs in zip(got, expected))
            rows.append({"beams": beams, "length_penalty": penalty, "sources": len(texts), "identical": same})
            progress(f"parity beams {beams} length_penalty {penalty}: {same} of {len(texts)} identical")
    finally:
        served.close()
    return rows


def numbers_match(args: argparse.Namespace) -> dict:
    """The `numbers` model's exact match on held-out numbers, greedy against beam 4, served."""
    from attnserve.model.numbers import number_pairs
    from attnserve.tokenizer.utf8 import decode  # the numbers model's byte tokenizer

    checkpoint = Path(args.numbers_checkpoint) if args.numbers_checkpoint else args.work / "numbers" / "checkpoint.pt"
    if not checkpoint.is_file():
        progress(f"training the numbers preset for {args.numbers_budget} s")
        attnserve(
            "train", "--preset", "numbers", "--out", str(checkpoint.parent), "--time-budget", str(args.numbers_budget)
        )
    model = args.work / "numbers-model"
    if not (model / "attnserve.json").is_file():
        attnserve("export", str(checkpoint), "--out", str(model))
    pairs = number_pairs(args.numbers, heldout=True, seed=0)
    served = Served(model, args.threads)
    try:
        found = {}
        for beams in (1, 4):
            out = served.translate([source for source, _ in pairs], beams, 16, 64)
            texts = [decode(ids) for ids, _ in out]
            found[beams] = sum(text == target for text, (_, target) in zip(texts, pairs))
    finally:
        served.close()
    return {"heldout": len(pairs), "greedy_exact": found[1], "beam4_exact": found[4], "checkpoint": str(checkpoint)}


def print_table(result: dict) -> None:
    for row in result.get("parity", []):
        print(
            f"parity: beams {row['beams']} length_penalty {row['length_penalty']:g}: {row['identical']} of "
            f"{row['sources']} sources identical to transformers'"
        )
    header = ("beams", "at a time", "attnserve tokens/s", "CTranslate2 tokens/s", "ratio", "p50 ms", "same tokens")
    print("| " + " | ".join(header) + " |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in result.get("rows", []):
        a, c = row["attnserve"], row["ctranslate2"]
        print(
            f"| {row['beams']} | {row['concurrency']} | {a['tokens_per_s']:.1f} | {c['tokens_per_s']:.1f} | "
            f"{row['ratio']:.2f} | {a['latency_p50_ms']:.0f} / {c['latency_p50_ms']:.0f} | "
            f"{row['same_tokens']} of {row['sentences']} |"
        )
        if "before" in row:
            low, high = row["after_over_before_range"]
            print(
                f"    before: {row['before']['tokens_per_s']:.1f} tokens/s ({row['before_ratio']:.2f}x CTranslate2); "
                f"after / before {row['after_over_before']:.2f} ({low:.2f}-{high:.2f}); "
                f"same tokens {row['same_tokens_before']} of {row['sentences']}"
            )
    n = result.get("numbers")
    if n:
        print(f"numbers, {n['heldout']} held-out: exact match greedy {n['greedy_exact']}, beam 4 {n['beam4_exact']}")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"beams {r['beams']}\n{r['concurrency']} at a time" for r in result["rows"]]
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(7, 4))
    names = ("before", "attnserve", "ctranslate2") if "before" in result["rows"][0] else ("attnserve", "ctranslate2")
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [r[name]["tokens_per_s"] for r in result["rows"]]
        label = {"before": "attnserve, before", "attnserve": "attnserve"}.get(name, name)
        ax.bar([x + (i - (len(names) - 1) / 2) * width for x in xs], values, width=width, label=label)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("output tokens/s (median)")
    ax.set_title("Marian, OPUS-MT's shape, float32, same weights")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("runs/translation"), help="where models go (kept)")
    p.add_argument("--out", default="reports/translation.json")
    p.add_argument("--plot", default=None, help="a PNG of the table")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime's and CTranslate2's threads")
    p.add_argument("--sentences", type=int, default=32, help="sentences at 16 at a time")
    p.add_argument("--sentences-alone", type=int, default=8, help="sentences at 1 at a time")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--numbers", type=int, default=200, help="held-out numbers for the exact match")
    p.add_argument("--numbers-checkpoint", default=None, help="a trained numbers checkpoint (else one is trained)")
    p.add_argument("--numbers-budget", type=int, default=300, help="seconds to train the numbers model")
    p.add_argument("--skip-numbers", action="store_true")
    p.add_argument("--skip-compare", action="store_true", help="leave out the comparison with CTranslate2")
    p.add_argument("--parity", action="store_true", help="served hypotheses against transformers' at this shape")
    p.add_argument("--small", action="store_true", help="the tests' small Marian, not OPUS-MT's shape (a smoke run)")
    p.add_argument("--tree-a", type=Path, default=None, help="a checkout to serve from too, side 'before'")
    p.add_argument("--model-a", type=Path, default=None, help="side 'before''s model directory (default: the work's)")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    stamp = Stamp.start("CPUExecutionProvider")
    hf, model, ct2 = build(args.work, args.small)
    result: dict = {"settings": {k: str(v) for k, v in vars(args).items()}}
    if args.parity:
        result["parity"] = parity(args, hf, model)
    if not args.skip_compare:
        result["rows"] = compare(args, hf, model, ct2)
    if not args.skip_numbers:
        result["numbers"] = numbers_match(args)
    result["stamp"] = stamp.finish()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.plot and "rows" in result:
        write_plot(result, args.plot)
    write_report(args.out, result, args.plot, "Translation: attnserve and CTranslate2 on the same Marian weights")
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
