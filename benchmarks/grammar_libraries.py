r"""Three structured-output libraries side by side: llguidance, xgrammar and outlines-core, in one run.

Each builds its view of one Hugging Face tokenizer, compiles the same JSON schema and regex, and masks
the same kind of seeded random walks:

  import     ms to import the library (xgrammar brings torch)
  tok-set    ms to build the library's view of the tokenizer from tokenizer.json
  compile    ms per compile of the schema (`person`: an object of a name, an age and a flag) and the
             regex (`code`: "ABC-123 word word"): the first in the process, a second different one, and
             the median of five more different ones (med5; no cache can answer: each has another bound),
             with the first mask after each of those five (lazy libraries pay there)
  mask       us per next-token mask, as a bool per id (median, p90), over --gens seeded random walks that
             pick uniformly among the allowed ids until the grammar stops
  valid      walks whose text validates: jsonschema for the schema, re.fullmatch for the regex

Each (round, library) runs in a subprocess of its own (a cold import, tokenizer setup and first compile);
the library order rotates every round so that machine noise falls alike; the walks' seeds depend on the
round only, so every library walks from the same seed. Load average before and after. Prints a table
(medians over rounds, then each round), then one JSON object last: the summary, not the per-step samples.

The libraries are not attnserve's dependencies: the benchmark runs in a venv of its own and imports
nothing of attnserve but its standard-library stamp (attnserve/report_stamp.py). torch stays pinned:
xgrammar requires it, and any other version pulls gigabytes.

    python3 -m venv .venv-grammars && .venv-grammars/bin/pip install \
        llguidance==1.9.1 xgrammar==0.2.8 outlines-core==0.2.14 tokenizers numpy jsonschema torch==2.13.0

    .venv-grammars/bin/python -m benchmarks.grammar_libraries [--tokenizer models/small/tokenizer.json]
        [--eos-id 1] [--bos-id 0] [--pad-id 2] [--rounds 3] [--gens 200] [--out F.json]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from tokenizers import Tokenizer

from attnserve.report_stamp import Stamp, write_report

LIBRARIES = ("llguidance", "xgrammar", "outlines_core")
KINDS = ("schema", "regex")
FIRST_BOUND = {"schema": 10, "regex": 8}  # the walked grammar's bound; the other compiles count up from it
MAX_STEPS = 400  # a walk that has not stopped by then counts as failed
RESULT_MARK = "@@RESULT@@"  # the worker's result line on its stdout, apart from anything a library prints


@dataclass(frozen=True)
class Vocab:
    path: str  # a Hugging Face tokenizer.json
    size: int  # V: ids 0..V-1, read from the tokenizer (added tokens included)
    bos_id: int
    eos_id: int
    pad_id: int


def read_vocab(path: str, bos_id: int, eos_id: int, pad_id: int) -> Vocab:
    size = Tokenizer.from_file(path).get_vocab_size(with_added_tokens=True)
    return Vocab(str(Path(path).resolve()), size, bos_id, eos_id, pad_id)


def person(max_name: int) -> dict[str, Any]:
    """The JSON schema: a name of at most `max_name` characters, an age in 0..150, an admin flag."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": max_name},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "admin": {"type": "boolean"},
        },
        "required": ["name", "age", "admin"],
        "additionalProperties": False,
    }


def code(max_word: int) -> str:
    """The regex: three capitals, a dash, 2-4 digits, then up to two words of at most `max_word` letters."""
    return rf"[A-Z]{{3}}-[0-9]{{2,4}}( [a-z]{{1,{max_word}}}){{0,2}}"


def grammar(kind: str, bound: int) -> Any:
    return person(bound) if kind == "schema" else code(bound)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q`th percentile (nan for none)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def bits_to_bool(bitmask: np.ndarray, size: int) -> np.ndarray:
    """An int32 (1, ceil(V/32)) bitmask as bool (V,): bit j of word i is id 32*i+j (little-endian)."""
    return np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:size].view(bool)


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte, back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class Library(ABC):
    """One library behind the calls the benchmark makes: set up, compile, start a walk, mask, consume."""

    name = ""
    has_alternative_mask = False  # outlines-core has a second way to the mask; both are timed

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        start = time.perf_counter_ns()
        self.load()
        self.import_ms = (time.perf_counter_ns() - start) / 1e6
        self.version = importlib.metadata.version(self.name)

    @abstractmethod
    def load(self) -> None:
        """Import the library (timed)."""

    @abstractmethod
    def setup(self) -> None:
        """Build the library's view of the tokenizer (timed)."""

    @abstractmethod
    def compile_schema(self, schema: dict[str, Any]) -> Any: ...

    @abstractmethod
    def compile_regex(self, regex: str) -> Any: ...

    @abstractmethod
    def new_state(self, compiled: Any) -> Any:
        """A matcher at the start of a walk over `compiled`."""

    @abstractmethod
    def mask(self, state: Any) -> np.ndarray:
        """The ids allowed next, a bool per id (V,)."""

    def alternative_mask(self, state: Any) -> np.ndarray:
        raise NotImplementedError

    @abstractmethod
    def consume(self, state: Any, token: int) -> None:
        """Advance by the picked id; RuntimeError or ValueError when the library refuses it."""

    @abstractmethod
    def stopped(self, state: Any) -> bool:
        """Whether the walk has ended."""

    def new_bitmask(self) -> np.ndarray:
        return np.zeros((1, (self.vocab.size + 31) // 32), dtype=np.int32)


class LLGuidance(Library):
    name = "llguidance"

    def load(self) -> None:
        import llguidance
        import llguidance.numpy

        self.ll, self.ll_numpy = llguidance, llguidance.numpy

    def setup(self) -> None:
        spec = Path(self.vocab.path).read_text()
        self.tokenizer = self.ll.LLTokenizer(spec, n_vocab=self.vocab.size, eos_token=self.vocab.eos_id)

    def matcher(self, source: str) -> Any:
        matcher = self.ll.LLMatcher(self.tokenizer, source, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher  # the matcher is the compiled grammar: compiled lazily, mask by mask

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        return self.matcher(self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}))

    def compile_regex(self, regex: str) -> Any:
        return self.matcher(self.ll.LLMatcher.grammar_from_regex(regex))

    def new_state(self, compiled: Any) -> Any:
        compiled.reset()
        self.bitmask = self.ll_numpy.allocate_token_bitmask(1, self.vocab.size)
        return compiled

    def mask(self, state: Any) -> np.ndarray:
        self.ll_numpy.fill_next_token_bitmask(state, self.bitmask)
        return bits_to_bool(self.bitmask, self.vocab.size)

    def consume(self, state: Any, token: int) -> None:
        if state.consume_token(token) is False or state.is_error():
            raise RuntimeError(f"llguidance consume_token({token}) failed: {state.get_error()}")

    def stopped(self, state: Any) -> bool:
        return bool(state.is_stopped())


class XGrammar(Library):
    name = "xgrammar"

    def load(self) -> None:
        import xgrammar

        self.xgr = xgrammar

    def setup(self) -> None:
        spec = json.loads(Path(self.vocab.path).read_text())
        vocab = [token for token, _ in sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])]
        if len(vocab) != self.vocab.size:
            raise ValueError(f"{len(vocab)} ids in the model's vocab, {self.vocab.size} in the tokenizer")
        # Special tokens other than EOS blanked: with their text ("<|bos|>", "<|pad|>") xgrammar takes them
        # for ordinary text and allows them inside JSON strings; an empty string makes them special.
        for added in spec["added_tokens"]:
            if added["special"] and added["id"] != self.vocab.eos_id:
                vocab[added["id"]] = ""
        info = self.xgr.TokenizerInfo(
            vocab,
            vocab_type=self.xgr.VocabType.BYTE_LEVEL,
            vocab_size=self.vocab.size,
            stop_token_ids=[self.vocab.eos_id],
        )
        self.compiler = self.xgr.GrammarCompiler(info, cache_enabled=False)

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def compile_regex(self, regex: str) -> Any:
        return self.compiler.compile_regex(regex)

    def new_state(self, compiled: Any) -> Any:
        self.bitmask = self.new_bitmask()  # xgrammar takes a numpy bitmask through DLPack
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, state: Any) -> np.ndarray:
        state.fill_next_token_bitmask(self.bitmask)
        return bits_to_bool(self.bitmask, self.vocab.size)

    def consume(self, state: Any, token: int) -> None:
        if not state.accept_token(token):
            raise RuntimeError(f"xgrammar accept_token({token}) rejected it")

    def stopped(self, state: Any) -> bool:
        return bool(state.is_terminated())


class OutlinesCore(Library):
    name = "outlines_core"
    has_alternative_mask = True

    def load(self) -> None:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.build_regex_from_schema = outlines_core, build_regex_from_schema

    def setup(self) -> None:
        spec = json.loads(Path(self.vocab.path).read_text())
        decoder = byte_decoder()
        special = {added["id"] for added in spec["added_tokens"] if added["special"]}
        ids_by_bytes: dict[bytes, list[int]] = {}
        for token, i in spec["model"]["vocab"].items():
            if i not in special:
                ids_by_bytes.setdefault(bytes(decoder[ch] for ch in token), []).append(i)
        self.index_vocab = self.oc.Vocabulary(self.vocab.eos_id, ids_by_bytes)

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        # whitespace_pattern="" gives compact JSON like the other two. The regex it builds ignores the
        # integer's minimum and maximum, so ages above 150 come out and fail validation.
        regex = self.build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
        return self.oc.Index(regex, self.index_vocab)

    def compile_regex(self, regex: str) -> Any:
        return self.oc.Index(regex, self.index_vocab)

    def new_state(self, compiled: Any) -> Any:
        self.bitmask = self.new_bitmask()
        self.allowed = np.zeros(self.vocab.size, dtype=bool)
        return GuideWalk(self.oc.Guide(compiled))

    def mask(self, state: Any) -> np.ndarray:
        """The main path: the allowed ids as a list, set into a bool per id."""
        self.allowed[:] = False
        self.allowed[state.guide.get_tokens()] = True
        return self.allowed

    def alternative_mask(self, state: Any) -> np.ndarray:
        """The other path: write_mask_into an int32 bitmask, unpacked to a bool per id."""
        state.guide.write_mask_into(self.bitmask.ctypes.data, self.bitmask.size, self.bitmask.itemsize)
        return bits_to_bool(self.bitmask, self.vocab.size)

    def consume(self, state: Any, token: int) -> None:
        # Guide.advance(EOS) always raises "No next state found" in 0.2.14: Index.get_next_state returns
        # None for EOS although get_transitions() lists an EOS self-loop on final states. EOS is offered
        # only in final states, so it is taken as the end of the walk.
        if token == self.vocab.eos_id:
            state.ended = True
        else:
            state.guide.advance(token)

    def stopped(self, state: Any) -> bool:
        return bool(state.ended)  # not Guide.is_finished(): that holds in any final state, not only after EOS


@dataclass
class GuideWalk:
    """An outlines-core Guide and whether the walk has consumed EOS (the Guide cannot)."""

    guide: Any
    ended: bool = False


ADAPTERS: dict[str, type[Library]] = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines_core": OutlinesCore}


@dataclass
class Samples:
    """What the walks of one grammar recorded, step by step."""

    mask_ns: list[int] = field(default_factory=list)
    alternative_mask_ns: list[int] = field(default_factory=list)
    consume_ns: list[int] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)
    special_leak_steps: int = 0  # steps whose mask allowed BOS or PAD


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.perf_counter_ns()
    value = fn(*args)
    return value, (time.perf_counter_ns() - start) / 1e6


def first_mask_ms(library: Library, compiled: Any) -> float:
    """ms to the first mask of a freshly compiled grammar: where a lazy library compiles."""
    state = library.new_state(compiled)
    return timed(library.mask, state)[1]


def time_compiles(library: Library, kind: str) -> tuple[Any, dict[str, Any]]:
    """The walked grammar compiled first, then a different one, then five more with the first mask of
    each; the first compiled grammar and the ms."""
    compile_grammar = library.compile_schema if kind == "schema" else library.compile_regex
    bound = FIRST_BOUND[kind]
    walked, first_ms = timed(compile_grammar, grammar(kind, bound))
    second, second_ms = timed(compile_grammar, grammar(kind, bound + 1))
    times: dict[str, Any] = {
        "first_ms": first_ms,
        "second_ms": second_ms,
        "first_mask_ms": first_mask_ms(library, second),
    }
    times["fresh_ms"], times["fresh_first_mask_ms"] = [], []
    for fresh_bound in range(bound + 2, bound + 7):
        compiled, ms = timed(compile_grammar, grammar(kind, fresh_bound))
        times["fresh_ms"].append(ms)
        times["fresh_first_mask_ms"].append(first_mask_ms(library, compiled))
    return walked, times


def measured_mask(library: Library, state: Any, samples: Samples, where: str) -> np.ndarray:
    """The mask for the next token, timed; the alternative path timed and compared with it."""
    start = time.perf_counter_ns()
    allowed = library.mask(state)
    samples.mask_ns.append(time.perf_counter_ns() - start)
    if library.has_alternative_mask:
        start = time.perf_counter_ns()
        other = library.alternative_mask(state)
        samples.alternative_mask_ns.append(time.perf_counter_ns() - start)
        if not np.array_equal(other, allowed):
            samples.fails.append(f"alternative mask differs at {where}")
    if allowed[library.vocab.bos_id] or allowed[library.vocab.pad_id]:
        samples.special_leak_steps += 1
    return allowed


def walk(library: Library, compiled: Any, rng: np.random.Generator, samples: Samples, n: int) -> tuple[list[int], str]:
    """One random walk: a uniform pick among the allowed ids each step until the grammar stops; its ids
    (EOS left out) and how it ended."""
    state = library.new_state(compiled)
    ids: list[int] = []
    for step in range(MAX_STEPS):
        if library.stopped(state):
            return ids, "stopped"
        candidates = np.flatnonzero(measured_mask(library, state, samples, f"walk {n} step {step}"))
        if candidates.size == 0:
            return ids, "empty-mask"
        if candidates.size == 1 and candidates[0] == library.vocab.eos_id:
            return ids, "eos-only"
        token = int(candidates[rng.integers(candidates.size)])
        start = time.perf_counter_ns()
        try:
            library.consume(state, token)
        except (RuntimeError, ValueError) as e:
            return ids, f"consume-error: {e}"
        samples.consume_ns.append(time.perf_counter_ns() - start)
        if token != library.vocab.eos_id:
            ids.append(token)
    return ids, "maxsteps"


def invalid(kind: str, text: str) -> str | None:
    """Why the walk's text does not validate against the walked grammar, or None when it does."""
    if kind == "regex":
        return None if re.fullmatch(code(FIRST_BOUND["regex"]), text) else "regex fullmatch failed"
    try:
        jsonschema.validate(json.loads(text), person(FIRST_BOUND["schema"]))
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0][:90]
    return None


def run_walks(library: Library, kind: str, compiled: Any, gens: int, seed: int, text: Tokenizer) -> dict[str, Any]:
    """`gens` seeded walks of one grammar: the mask and consume times, how many validate, examples."""
    rng, samples = np.random.default_rng(seed), Samples()
    walks = [walk(library, compiled, rng, samples, n) for n in range(gens)]
    finished = [ids for ids, status in walks if status in ("stopped", "eos-only")]
    samples.fails += [
        f"walk {n}: {status}" for n, (_, status) in enumerate(walks) if status not in ("stopped", "eos-only")
    ]
    texts = [text.decode(ids, skip_special_tokens=False) for ids in finished]
    bad = [(t, why) for t in texts if (why := invalid(kind, t))]
    return {
        "mask_us": [ns / 1e3 for ns in samples.mask_ns],
        "alternative_mask_us": [ns / 1e3 for ns in samples.alternative_mask_ns],
        "consume_us": [ns / 1e3 for ns in samples.consume_ns],
        "walks": gens,
        "finished": len(finished),
        "valid": len(finished) - len(bad),
        "bad_examples": [f"{t!r} -> {why}" for t, why in bad[:4]],
        "fails": samples.fails[:5],
        "n_fails": len(samples.fails),
        "special_leak_steps": samples.special_leak_steps,
        "examples": [text.decode(ids) for ids, _ in walks[:3]],
        "mean_len_tokens": statistics.mean(len(ids) for ids, _ in walks),
    }


def run_worker(name: str, round_index: int, gens: int, vocab: Vocab) -> dict[str, Any]:
    """One library's round, in this process: import, tokenizer setup, compiles, walks (GC off while timing)."""
    text = Tokenizer.from_file(vocab.path)
    library = ADAPTERS[name](vocab)
    result: dict[str, Any] = {"library": name, "round": round_index, "version": library.version}
    result["import_ms"] = library.import_ms
    gc.collect()
    gc.disable()
    result["setup_ms"] = timed(library.setup)[1]
    compiled = {}
    for kind in KINDS:
        compiled[kind], result[kind] = time_compiles(library, kind)
    for kind, seed in (("schema", 1000 * round_index + 1), ("regex", 1000 * round_index + 2)):
        gc.collect()
        result[kind] |= run_walks(library, kind, compiled[kind], gens, seed, text)
    gc.enable()
    return result


def run_round(name: str, round_index: int, args: argparse.Namespace, vocab: Vocab) -> dict[str, Any]:
    """One library's round in a fresh subprocess; its result, or its exit status and stderr."""
    flags = ["--tokenizer", vocab.path, "--bos-id", str(vocab.bos_id), "--eos-id", str(vocab.eos_id)]
    flags += ["--pad-id", str(vocab.pad_id), "--gens", str(args.gens), "--round", str(round_index), "--worker", name]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.grammar_libraries", *flags],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode or not lines:
        return {"library": name, "round": round_index, "rc": done.returncode, "stderr": done.stderr[-2000:]}
    return json.loads(lines[0][len(RESULT_MARK) :])


def median_p90(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "p90": percentile(values, 90)} if values else {}


def round_summary(run: dict[str, Any]) -> dict[str, Any]:
    """A round's result with its per-step samples cut to median and p90."""
    summary = dict(run)
    for kind in KINDS:
        part = summary[kind] = dict(run[kind])
        part["steps"] = len(part["mask_us"])
        part["mask_us"] = median_p90(part["mask_us"])
        part["alternative_mask_us"] = median_p90(part["alternative_mask_us"])
        part["consume_us"] = statistics.median(part["consume_us"])
    return summary


def library_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One library over its rounds: medians of the per-round figures, masks pooled over every round."""
    summary: dict[str, Any] = {"version": runs[0]["version"], "rounds": len(runs)}
    for key in ("import_ms", "setup_ms"):
        summary[key] = statistics.median(r[key] for r in runs)
    for kind in KINDS:
        parts = [r[kind] for r in runs]
        summary[kind] = {
            "first_ms": statistics.median(p["first_ms"] for p in parts),
            "second_ms": statistics.median(p["second_ms"] for p in parts),
            "fresh_ms": statistics.median(ms for p in parts for ms in p["fresh_ms"]),
            "mask_us": median_p90([us for p in parts for us in p["mask_us"]]),
            "valid": sum(p["valid"] for p in parts),
            "walks": sum(p["walks"] for p in parts),
        }
    return summary


def print_table(result: dict[str, Any]) -> None:
    head = ["library", "version", "import", "tok-set", "sch 1st", "sch 2nd", "sch med5", "re 1st", "re 2nd"]
    head += ["re med5", "mask sch med/p90", "mask re med/p90", "sch valid", "re valid"]
    print(
        "{:<14} {:<7} {:>8} {:>8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:<17} {:<17} | {:<9} {:<9}".format(*head)
    )
    units = ("", "", "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms", "us", "us")
    print("{:<14} {:<7} {:>8} {:>8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:<17} {:<17} |".format(*units))
    for name in LIBRARIES:
        lib = result["libraries"].get(name)
        if lib is None:
            print(f"{name:<14}  (no results)")
            continue
        s, x = lib["schema"], lib["regex"]
        print(
            f"{name:<14} {lib['version']:<7} {lib['import_ms']:8.1f} {lib['setup_ms']:8.2f} | "
            f"{s['first_ms']:9.2f} {s['second_ms']:9.2f} {s['fresh_ms']:9.2f} | "
            f"{x['first_ms']:9.2f} {x['second_ms']:9.2f} {x['fresh_ms']:9.2f} | "
            f"{s['mask_us']['median']:7.1f} / {s['mask_us']['p90']:<7.1f} {x['mask_us']['median']:7.1f} / "
            f"{x['mask_us']['p90']:<7.1f} | {s['valid']:4d}/{s['walks']:<4d} {x['valid']:4d}/{x['walks']:<4d}"
        )
    print(
        "\nper-round detail (setup ms | schema 1st/2nd/med5 compile ms | regex the same | first mask after a "
        "fresh compile ms sch/re | mask med/p90 us sch, re | consume med us sch/re | steps | fails | "
        "special-leak steps)"
    )
    for run in sorted(result["runs"], key=lambda r: (LIBRARIES.index(r["library"]), r["round"])):
        print_round(run)
    print(f"load average before {result['stamp']['load_before']}, after {result['stamp']['load_after']}")


def print_round(run: dict[str, Any]) -> None:
    s, x = run["schema"], run["regex"]
    med = statistics.median
    print(
        f"  r{run['round']} {run['library']:<13} {run['setup_ms']:7.2f} | {s['first_ms']:8.2f} {s['second_ms']:8.2f} "
        f"{med(s['fresh_ms']):8.2f} | re {x['first_ms']:7.2f} {x['second_ms']:7.2f} {med(x['fresh_ms']):7.2f} | "
        f"fm {med(s['fresh_first_mask_ms']):6.3f}/{med(x['fresh_first_mask_ms']):6.3f} | "
        f"{s['mask_us']['median']:6.1f}/{s['mask_us']['p90']:6.1f}  {x['mask_us']['median']:6.1f}/"
        f"{x['mask_us']['p90']:6.1f} | {s['consume_us']:5.1f}/{x['consume_us']:5.1f} | {s['steps']:5d}/{x['steps']:5d} "
        f"| {s['n_fails']}/{x['n_fails']} | {s['special_leak_steps']}/{x['special_leak_steps']}"
    )
    if s["alternative_mask_us"]:
        sa, xa = s["alternative_mask_us"], x["alternative_mask_us"]
        print(
            f"      outlines write_mask_into path: mask med/p90 us sch {sa['median']:.1f}/{sa['p90']:.1f} "
            f"re {xa['median']:.1f}/{xa['p90']:.1f}"
        )
    for kind in KINDS:
        if run[kind]["bad_examples"]:
            print(f"      {kind} invalid e.g.: {' | '.join(run[kind]['bad_examples'][:2])}")
        if run[kind]["fails"]:
            print(f"      {kind} fails: {run[kind]['fails'][:3]}")
    print(f"      examples: {s['examples'][:2] + x['examples'][:2]}")


def measure(args: argparse.Namespace, vocab: Vocab) -> dict[str, Any]:
    """Every round, each library in a subprocess of its own, the order rotated by one each round."""
    runs, errors = [], []
    for r in range(args.rounds):
        for name in LIBRARIES[r % 3 :] + LIBRARIES[: r % 3]:
            start = time.perf_counter()
            run = run_round(name, r, args, vocab)
            if "rc" in run:
                errors.append(run)
                print(f"round {r} {name} failed, rc {run['rc']}:\n{run['stderr'][-1500:]}", file=sys.stderr)
                continue
            runs.append(run)
            print(f"round {r} {name:<13} done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    libraries = {}
    for name in LIBRARIES:
        if own := [run for run in runs if run["library"] == name]:
            libraries[name] = library_summary(own)
    return {
        "tokenizer": vocab.path,
        "vocab_size": vocab.size,
        "ids": {"bos": vocab.bos_id, "eos": vocab.eos_id, "pad": vocab.pad_id},
        "rounds": args.rounds,
        "gens": args.gens,
        "cpu_count": os.cpu_count(),
        "libraries": libraries,
        "runs": [round_summary(run) for run in runs],
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="models/small/tokenizer.json", help="a Hugging Face tokenizer.json")
    p.add_argument("--eos-id", type=int, default=1, help="the id that ends a walk")
    p.add_argument("--bos-id", type=int, default=0, help="a special id no mask may allow")
    p.add_argument("--pad-id", type=int, default=2, help="a special id no mask may allow")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each library in a fresh subprocess each round")
    p.add_argument("--gens", type=int, default=200, help="random walks per grammar per round")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)  # one library's round, in a subprocess
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    vocab = read_vocab(args.tokenizer, args.bos_id, args.eos_id, args.pad_id)
    if args.worker:
        print(RESULT_MARK + json.dumps(run_worker(args.worker, args.round, args.gens, vocab)))
        return 0
    stamp = Stamp.start()
    result = {**measure(args, vocab), "stamp": stamp.finish()}
    print_table(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_report(args.out, result, title="Structured-output libraries: llguidance, xgrammar, outlines-core")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
