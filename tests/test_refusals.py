"""Every flag of every subcommand refuses a bad value in one line before any work: the README's
promise ("one line on stderr and exit code 2, never a traceback").

TABLE holds, per subcommand, rows of (flag, arguments, fragment): the command line is `attnserve
COMMAND` with BASE[COMMAND] (good values for what the command needs, and a cheap end for its work
should a check be missing) and then the row's arguments, which override the base's. The refusal
must be exactly one line on stderr, `attnserve COMMAND: error: ...`, naming the flag (or the
positional argument) and holding the fragment, with nothing on stdout and exit code 2.
`test_every_flag_has_a_row` makes a new flag without a row (or a stated reason in NO_BAD_VALUE)
fail, so that a flag cannot be added without its check.

The command lines run in one process per subcommand (tests/cli_driver.py) against real parts: the
tiny checkpoints and model directory, a real server for the clients (values only the server can
judge come back from it), a port this test holds for `serve` (a missing check would then be
refused for the port, not the flag, and fail the row), and for `ray-serve` a tripwire on starting
Ray. A missing check in `train` or `export` runs a one-step training or a tiny export, which
exits 0 and fails the row.
"""

from __future__ import annotations

import argparse
import socket

import pytest
from cli_driver import run_in_one_process

from attnserve.cli import SUBCOMMANDS, subcommand_parser

LONG_SOURCE = "4" * 300

# Good values for what each subcommand needs; a row's own arguments come after and override them.
BASE = {
    "train": ["--preset", "tiny", "--max-steps", "1", "--tokenizer", "bytes", "--out", "{tmp}/run", "--threads", "1"],
    "import": ["--out", "{tmp}/imported"],
    "export": ["--out", "{tmp}/exported"],
    "attention-map": ["--out", "{tmp}/map.png"],
    "serve": ["--model", "{model}", "--port", "{busy}", "--threads", "1"],
    "ray-serve": ["--model", "{model}"],
    "tokenize": ["--model", "{model}"],
    "generate": ["--target", "{target}", "--max-new-tokens", "2"],
    "bench": [
        "--target",
        "{target}",
        "--requests",
        "1",
        "--warmup",
        "0",
        "--concurrency",
        "1",
        "--max-new-tokens",
        "2",
    ],
}

# The positional arguments, which a row for a positional argument replaces with its own.
POSITIONALS = {
    "import": ["{hf}"],
    "export": ["{ckpt}"],
    "attention-map": ["{s2s}", "42"],
    "tokenize": ["hi"],
    "generate": ["hi"],
}

INSTEAD_OF_POSITIONALS = {"--prompt-token-ids", "--ids"}  # a text's other form: their rows give no text

# A flag whose every value means something has no row: the reason why.
NO_BAD_VALUE = {
    ("bench", "--seed"): "any integer seeds the prompt ids' draw (Python's random)",
    ("tokenize", "text"): "any text has ids",
    ("tokenize", "--no-bos"): "a switch",
    ("tokenize", "--json"): "a switch",
}

TABLE: dict[str, list[tuple[str, list[str], str]]] = {
    "train": [
        ("--preset", ["--preset", "huge"], "--preset must be one of numbers, small, tiny, tiny-seq2seq, not 'huge'"),
        ("--corpus", ["--corpus", "/no/such/corpus.txt"], "--corpus /no/such/corpus.txt: no such file or folder"),
        ("--corpus", ["--corpus", "{binary}"], "--corpus {binary}: not UTF-8 text (byte 128"),
        ("--corpus", ["--corpus", "{empty}"], "--corpus {empty}: is empty"),
        ("--corpus", ["--corpus", "{notxt}"], "--corpus {notxt}: a folder with no .txt files"),
        ("--corpus", ["--corpus", "{short}"], "corpus too short: 120 bytes"),
        ("--corpus", ["--preset", "tiny-seq2seq", "--corpus", "{bad_tsv}"], "bad.tsv:2: expected 'source<TAB>target'"),
        (
            "--corpus",
            ["--preset", "tiny-seq2seq", "--corpus", "{long_tsv}"],
            "pair 2 needs 81 tokens, the context (max_len) is 64",
        ),
        ("--out", ["--out", "{file}/run"], "--out {file}/run: {file} is a file, not a directory"),
        ("--tokenizer", ["--tokenizer", "words"], "invalid choice: 'words'"),
        ("--tokenizer", ["--preset", "numbers", "--tokenizer", "bpe"], "--tokenizer bpe is for decoder-only models"),
        ("--vocab-size", ["--tokenizer", "bytes", "--vocab-size", "512"], "--vocab-size is the BPE tokenizer's"),
        ("--vocab-size", ["--tokenizer", "bpe", "--vocab-size", "100"], "--vocab-size 100 is outside [259, "),
        ("--max-steps", ["--max-steps", "-1"], "--max-steps must not be negative, got -1"),
        ("--time-budget", ["--time-budget", "0"], "--time-budget must be positive, got 0"),
        ("--device", ["--device", "tpu"], "invalid choice: 'tpu'"),
        ("--precision", ["--precision", "fp8"], "invalid choice: 'fp8'"),
        ("--seed", ["--seed", "-1"], "--seed must be 0 to"),
        ("--resume", ["--resume", "--out", "{tmp}/fresh"], "--resume: checkpoint not found"),
        ("--resume", ["--preset", "numbers", "--resume", "--out", "{tmp}/fresh"], "--resume: checkpoint not found"),
        ("--batch-size", ["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        ("--lr", ["--lr", "-1"], "--lr must be positive, got -1"),
        ("--eval-interval", ["--eval-interval", "0"], "--eval-interval must be at least 1, got 0"),
        ("--threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
        ("--positional", ["--positional", "alibi"], "invalid choice: 'alibi'"),
        (
            "--positional",
            ["--preset", "tiny-seq2seq", "--positional", "rotary"],
            "--positional rotary is for decoder-only models",
        ),
        ("--context-length", ["--context-length", "4"], "--context-length must be at least 8, got 4"),
        ("--d-model", ["--d-model", "0"], "--d-model must be a positive integer, got 0"),
        ("--n-layers", ["--n-layers", "0"], "--n-layers must be a positive integer, got 0"),
        ("--n-heads", ["--n-heads", "0"], "--n-heads must be a positive integer, got 0"),
        ("--n-heads", ["--n-heads", "3"], "is not divisible by --n-heads 3"),
        ("--d-ff", ["--d-ff", "0"], "--d-ff must be a positive integer, got 0"),
    ],
    "import": [
        ("hf_dir", ["/no/such/hf"], "/no/such/hf: no such directory"),
        ("hf_dir", ["{tmp}"], "{tmp}/config.json: not found"),
        ("--out", ["--out", "{file}/run"], "--out {file}/run: {file} is a file, not a directory"),
        ("--steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
        ("--context-length", ["--context-length", "4"], "--context-length must be 8 to 128 (the model's positions)"),
        ("--context-length", ["--context-length", "129"], "--context-length must be 8 to 128"),
    ],
    "export": [
        ("checkpoint", ["/no/such/checkpoint.pt"], "/no/such/checkpoint.pt"),
        ("checkpoint", ["{file}"], "{file}"),
        ("--out", ["--out", "{file}/exported"], "--out {file}/exported: {file} is a file, not a directory"),
        ("--dtype", ["--dtype", "int4"], "invalid choice: 'int4'"),
        ("--dtype", ["--dtype", "bfloat16"], "--dtype bfloat16"),
        ("--quantize", ["--quantize", "int2"], "invalid choice: 'int2'"),
        ("--int4-block-size", ["--quantize", "int4", "--int4-block-size", "48"], "invalid choice: 48"),
        ("--int4-block-size", ["--int4-block-size", "64"], "--int4-block-size is for --quantize int4"),
        ("--int4-head-block-size", ["--quantize", "int4", "--int4-head-block-size", "48"], "invalid choice: 48"),
        ("--int4-head-block-size", ["--int4-head-block-size", "128"], "--int4-head-block-size is for --quantize int4"),
        ("--int4-accuracy-level", ["--quantize", "int4", "--int4-accuracy-level", "5"], "invalid choice: 5"),
        ("--int4-accuracy-level", ["--quantize", "int8", "--int4-accuracy-level", "0"], "is for --quantize int4"),
        ("--parity-steps", ["--parity-steps", "0"], "--parity-steps must be at least 1, got 0"),
        ("--kv-cache", ["--kv-cache", "paged"], "invalid choice: 'paged'"),
        ("--chat-template", ["--chat-template", "/no/such.jinja"], "--chat-template /no/such.jinja: No such file"),
        ("--chat-template", ["--chat-template", "{file}"], "--chat-template: a chat template lives in a BPE model's"),
    ],
    "attention-map": [
        ("checkpoint", ["/no/such/checkpoint.pt", "42"], "/no/such/checkpoint.pt"),
        ("checkpoint", ["{ckpt}", "42"], "{ckpt}: needs an encoder-decoder checkpoint"),
        ("source", ["{s2s}", LONG_SOURCE], "the source is 301 tokens"),
        ("source", ["{s2s}", ""], "the source is empty"),
        ("--out", ["--out", "{tmp}/map.txt"], "--out {tmp}/map.txt"),
        ("--out", ["--out", "{file}/map.png"], "is a file, not a directory"),
        ("--per-head", ["--per-head=yes"], "--per-head"),
        ("--layer", ["--layer", "1"], "--layer"),
        ("--layer", ["--per-head", "--layer", "99"], "--layer must be 0 to 1 (the model's layers), got 99"),
        ("--layer", ["--per-head", "--layer", "-1"], "--layer must be 0 to 1 (the model's layers), got -1"),
    ],
    "serve": [
        ("--model", ["--model", "/no/such/model"], "--model /no/such/model: no such directory"),
        ("--served-model-name", ["--served-model-name", "my model"], "--served-model-name must be"),
        ("--dtype", ["--dtype", "float8"], "invalid choice: 'float8'"),
        ("--dtype", ["--dtype", "float16"], "--dtype float16 is for a Hugging Face checkpoint directory (config.json)"),
        ("--quantize", ["--quantize", "int3"], "invalid choice: 'int3'"),
        ("--quantize", ["--quantize", "int4"], "--quantize int4 is for a Hugging Face checkpoint directory"),
        ("--export-cache", ["--export-cache", "{file}/exports"], "--export-cache {file}/exports: {file} is a file"),
        ("--context-length", ["--context-length", "4"], "--context-length must be at least 8, got 4"),
        ("--context-length", ["--context-length", "64"], "--context-length 64 is for a Hugging Face checkpoint"),
        ("--host", ["--host", "256.1.1.1"], "--host 256.1.1.1: cannot listen on 256.1.1.1:"),
        ("--port", ["--port", "70000"], "--port must be 0 to 65535, got 70000"),
        ("--port", ["--port", "{busy}"], "--port {busy}: cannot listen on 127.0.0.1:{busy}: the port is in use"),
        ("--provider", ["--provider", "tpu"], "invalid choice: 'tpu'"),
        ("--threads", ["--threads", "-1"], "--threads must be 0 or more (0: chosen by the model's size), got -1"),
        ("--intra-op-spinning", ["--intra-op-spinning", "fast"], "invalid choice: 'fast'"),
        ("--no-cuda-graphs", ["--no-cuda-graphs=yes"], "--no-cuda-graphs"),
        ("--logits-pass", ["--logits-pass", "gpu"], "invalid choice: 'gpu'"),
        ("--run-ahead", ["--run-ahead", "always"], "invalid choice: 'always'"),
        (
            "--speculative-config",
            ["--speculative-config", '{{"num_speculative_tokens": 0}}'],
            "--speculative-config: num_speculative_tokens must be 1 to 16, not 0",
        ),
        ("--speculative-config", ["--speculative-config", "ngram"], "--speculative-config must be a JSON object"),
        (
            "--speculative-config",
            ["--port", "0", "--speculative-config", '{{"model": "/no/such/draft"}}'],
            "--speculative-config's draft model /no/such/draft: ",
        ),
        (
            "--speculative-config",
            ["--port", "0", "--speculative-config", '{{"model": "{bpe_model}"}}'],
            "--speculative-config's draft model {bpe_model}: its vocabulary has",
        ),
        (
            "--speculative-config",
            ["--port", "0", "--model", "{s2s_model}", "--speculative-config", "{{}}"],
            "--speculative-config needs a decoder-only model, not an encoder-decoder",
        ),
        ("--engine-core", ["--engine-core", "fiber"], "invalid choice: 'fiber'"),
        ("--max-batch", ["--max-batch", "0"], "--max-batch"),
        ("--max-batch", ["--max-batch", "many"], "--max-batch"),
        ("--kv-cache-memory", ["--kv-cache-memory", "lots"], "--kv-cache-memory"),
        ("--kv-cache-memory", ["--kv-cache-memory", "0"], "--kv-cache-memory must be at least 1 (bytes), got 0"),
        ("--prefill-chunk", ["--prefill-chunk", "0"], "--prefill-chunk must be at least 1, got 0"),
        ("--max-waiting-steps", ["--max-waiting-steps", "-1"], "--max-waiting-steps must be 0 to 1024, got -1"),
        ("--api-server-count", ["--api-server-count", "0"], "--api-server-count must be 1 to 64, got 0"),
        ("--max-waiting-steps", ["--max-waiting-steps", "soon"], "--max-waiting-steps: invalid int value: 'soon'"),
        ("--prefix-cache", ["--prefix-cache", "maybe"], "invalid choice: 'maybe'"),
        ("--prefix-cache-memory", ["--prefix-cache-memory", "lots"], "--prefix-cache-memory"),
        (
            "--prefix-cache-memory",
            ["--port", "0", "--prefix-cache-memory", "1000"],
            "--prefix-cache-memory 1,000 bytes holds no block: one block of 16 positions needs 16,384 bytes",
        ),
        (
            "--prefix-cache-memory",
            ["--port", "0", "--prefix-cache-memory", "100000G"],
            "--prefix-cache-memory 100,000,000,000,000 bytes does not fit: ",
        ),
        ("--stream-interval-tokens", ["--stream-interval-tokens", "0"], "must be at least 1, got 0"),
        ("--stream-interval-ms", ["--stream-interval-ms", "-1"], "--stream-interval-ms must be 0 to 60000, got -1"),
        ("--max-queue", ["--max-queue", "0"], "--max-queue must be at least 1, got 0"),
        ("--core-nice", ["--core-nice", "20"], "--core-nice must be 0 to 19, got 20"),
        ("--stream-buffer-events", ["--stream-buffer-events", "0"], "--stream-buffer-events must be at least 1, got 0"),
        ("--write-timeout", ["--write-timeout", "0"], "--write-timeout must be positive, got 0"),
        ("--max-concurrent-streams", ["--max-concurrent-streams", "0"], "must be at least 1, got 0"),
        ("--max-connection-age", ["--max-connection-age", "-5"], "--max-connection-age must be positive, got -5"),
        ("--max-new-tokens-cap", ["--max-new-tokens-cap", "0"], "--max-new-tokens-cap must be at least 1, got 0"),
        (
            "--log-stats-interval",
            ["--log-stats-interval", "-1"],
            "--log-stats-interval must be 0 or more (0: off), got -1",
        ),
        ("--metrics-port", ["--metrics-port", "70000"], "--metrics-port must be 0 to 65535, got 70000"),
        ("--http-port", ["--http-port", "70000"], "--http-port must be 0 to 65535, got 70000"),
        ("--http-max-body-bytes", ["--http-max-body-bytes", "lots"], "--http-max-body-bytes"),
        (
            "--http-max-body-bytes",
            ["--http-max-body-bytes", "0"],
            "--http-max-body-bytes must be at least 1 (bytes), got 0",
        ),
        (
            "--http-port",
            ["--port", "0", "--http-port", "{busy}"],
            "--http-port {busy}: cannot listen on 127.0.0.1:{busy}",
        ),
        ("--reflection", ["--reflection=yes"], "--reflection"),
        ("--tls-cert", ["--tls-cert", "{pem}"], "--tls-cert and --tls-key go together"),
        ("--tls-cert", ["--tls-cert", "/no/such.pem", "--tls-key", "{pem}"], "--tls-cert /no/such.pem: No such file"),
        ("--tls-key", ["--tls-cert", "{pem}", "--tls-key", "{file}"], "--tls-key {file}: not a PEM file"),
        ("--tls-client-ca", ["--tls-client-ca", "{pem}"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (
            "--tls-client-ca",
            ["--tls-cert", "{pem}", "--tls-key", "{pem}", "--tls-client-ca", "/no/ca"],
            "--tls-client-ca /no/ca: No such file",
        ),
        (
            "--auth-token-file",
            ["--auth-token-file", "/no/such/token"],
            "--auth-token-file /no/such/token: No such file",
        ),
        ("--auth-token-file", ["--auth-token-file", "{empty}"], "--auth-token-file {empty}: is empty"),
        ("--drain-timeout", ["--drain-timeout", "-1"], "--drain-timeout must be 0 or more, got -1"),
        (
            "--otlp-traces-endpoint",
            ["--otlp-traces-endpoint", "collector:4317"],
            "--otlp-traces-endpoint must be an http:// or https:// URL such as http://127.0.0.1:4317, "
            "not 'collector:4317'",
        ),
        ("--otlp-traces-endpoint", ["--otlp-traces-endpoint", "http://c:99999"], "has no valid port: 'http://c:99999'"),
        ("--log-format", ["--log-format", "yaml"], "invalid choice: 'yaml'"),
        ("--log-requests", ["--log-requests=yes"], "--log-requests"),
    ],
    "ray-serve": [
        ("--model", ["--model", "/no/such/model"], "--model /no/such/model"),
        ("--dtype", ["--dtype", "float8"], "invalid choice: 'float8'"),
        ("--dtype", ["--dtype", "bfloat16"], "--dtype bfloat16 is for a Hugging Face checkpoint directory"),
        ("--quantize", ["--quantize", "int8"], "--quantize int8 is for a Hugging Face checkpoint directory"),
        ("--context-length", ["--context-length", "x"], "--context-length: invalid int value: 'x'"),
        ("--export-cache", ["--export-cache", "{file}/exports"], "--export-cache {file}/exports: {file} is a file"),
        ("--provider", ["--provider", "tpu"], "invalid choice: 'tpu'"),
        ("--threads", ["--threads", "-1"], "--threads must be 0 or more (0: chosen by the model's size), got -1"),
        ("--intra-op-spinning", ["--intra-op-spinning", "fast"], "invalid choice: 'fast'"),
        ("--logits-pass", ["--logits-pass", "gpu"], "invalid choice: 'gpu'"),
        ("--kv-cache-memory", ["--kv-cache-memory", "0"], "--kv-cache-memory must be at least 1 (bytes), got 0"),
        ("--prefill-chunk", ["--prefill-chunk", "0"], "--prefill-chunk must be at least 1, got 0"),
        ("--prefix-cache", ["--prefix-cache", "maybe"], "invalid choice: 'maybe'"),
        (
            "--prefix-cache-memory",
            ["--prefix-cache-memory", "0"],
            "--prefix-cache-memory must be at least 1 (bytes), got 0",
        ),
        ("--stream-interval-tokens", ["--stream-interval-tokens", "0"], "must be at least 1, got 0"),
        ("--stream-interval-ms", ["--stream-interval-ms", "-1"], "--stream-interval-ms must be 0 to 60000, got -1"),
        ("--max-queue", ["--max-queue", "0"], "--max-queue must be at least 1, got 0"),
        ("--max-new-tokens-cap", ["--max-new-tokens-cap", "0"], "--max-new-tokens-cap must be at least 1, got 0"),
        ("--drain-timeout", ["--drain-timeout", "-1"], "--drain-timeout must be 0 or more, got -1"),
        ("--max-batch", ["--max-batch", "auto"], "auto is attnserve serve's"),
        ("--max-batch", ["--max-batch", "0"], "--max-batch"),
        ("--address", ["--address", "nowhere"], "--address must be auto or HOST:PORT, got 'nowhere'"),
        (
            "--node-ip-address",
            ["--node-ip-address", "no-ip"],
            "--node-ip-address must be an IP address (Ray takes no host name here), got 'no-ip'",
        ),
        (
            "--grpc-port",
            ["--grpc-port", "70000"],
            "--grpc-port must be 1 to 65535 (Ray's proxy does not report a port 0), got 70000",
        ),
        (
            "--http-port",
            ["--http-port", "0"],
            "--http-port must be 1 to 65535 (Ray's proxy does not report a port 0), got 0",
        ),
        ("--app-name", ["--app-name", ""], "--app-name must be 1 to 64 letters, digits, '.', '_' or '-', got ''"),
        ("--replicas", ["--replicas", "0"], "--replicas must be at least 1, got 0"),
        ("--min-replicas", ["--min-replicas", "-1", "--max-replicas", "2"], "--min-replicas must be 0 or more, got -1"),
        ("--max-replicas", ["--replicas", "3", "--max-replicas", "2"], "--replicas <= --max-replicas, got 3 <= 3 <= 2"),
        (
            "--target-ongoing-requests",
            ["--target-ongoing-requests", "0"],
            "--target-ongoing-requests must be positive, got 0",
        ),
        ("--replica-cpus", ["--replica-cpus", "-1"], "--replica-cpus must be 0 or more, got -1"),
        ("--health-check-period", ["--health-check-period", "0"], "--health-check-period must be positive, got 0"),
        ("--reflection", ["--reflection=yes"], "--reflection"),
        ("--otlp-traces-endpoint", ["--otlp-traces-endpoint", "ftp://c:21"], "must be an http:// or https:// URL"),
    ],
    "tokenize": [
        ("--model", ["--model", "/no/such/model"], "--model /no/such/model: model directory not found"),
        ("--model", ["--model", "{file}"], "--model {file}"),
        ("--ids", ["--ids", "1,x"], "--ids '1,x': comma-separated integers expected"),
        ("--ids", ["--ids", "1,99999"], "--ids: id 99999 is outside this model's [0, 259)"),
    ],
    "generate": [
        ("prompt", ["hi", "--prompt-token-ids", "1,2"], "give a prompt or --prompt-token-ids, not both"),
        ("--prompt-token-ids", ["--prompt-token-ids", "a,b"], "--prompt-token-ids takes comma-separated numbers"),
        ("--max-new-tokens", ["--max-new-tokens", "0"], "INVALID_ARGUMENT: --max-new-tokens: 0 is outside [1, 127]"),
        ("--max-new-tokens", ["--max-new-tokens", "500"], "--max-new-tokens: 500 is outside [1, 127]"),
        ("--temperature", ["--temperature", "-1"], "--temperature: -1 is outside [0, 100]"),
        ("--top-k", ["--top-k", "-1"], "--top-k: -1 is outside [0, 2147483647] (the model's vocab_size narrows it)"),
        ("--top-k", ["--top-k", "260"], "INVALID_ARGUMENT: --top-k: 260 is outside [0, 259]"),
        ("--top-p", ["--top-p", "1.5"], "--top-p: 1.5 is outside (0, 1]"),
        ("--min-p", ["--min-p", "1.5"], "--min-p: 1.5 is outside [0, 1]"),
        ("--repetition-penalty", ["--repetition-penalty", "0"], "--repetition-penalty: 0 is outside (0, 100]"),
        ("--presence-penalty", ["--presence-penalty", "-2.5"], "--presence-penalty: -2.5 is outside [-2, 2]"),
        ("--frequency-penalty", ["--frequency-penalty", "3"], "--frequency-penalty: 3 is outside [-2, 2]"),
        ("--seed", ["--seed", "-1"], "--seed: -1 is outside [0, 18446744073709551615]"),
        ("--stop", ["--stop", ""], "--stop[0]: 0 UTF-8 bytes, must be 1 to 128"),
        ("--min-new-tokens", ["--min-new-tokens", "-1"], "--min-new-tokens: -1 is outside [0, 4294967295]"),
        ("--min-new-tokens", ["--min-new-tokens", "5"], "--min-new-tokens: 5 is more than max_new_tokens 2"),
        ("--ignore-eos", ["--ignore-eos=yes"], "--ignore-eos"),
        ("--logprobs", ["--logprobs", "-1"], "--logprobs: -1 is outside [0, 20]"),
        ("--logprobs", ["--logprobs", "21"], "--logprobs: 21 is outside [0, 20]"),
        ("--prompt-logprobs", ["--prompt-logprobs", "-1"], "--prompt-logprobs: -1 is outside [0, 20]"),
        ("--prompt-logprobs", ["--prompt-logprobs", "21"], "--prompt-logprobs: 21 is outside [0, 20]"),
        ("--n", ["--n", "0"], "--n: 0 is outside [1, 16] (the server's --max-batch narrows it)"),
        ("--n", ["--n", "9"], "--n: 9 is outside [1, 8] (16, or the server's --max-batch if fewer)"),
        (
            "--num-beams",
            ["--num-beams", "0"],
            "--num-beams: 0 is outside [1, 16] (the server's --max-batch narrows it)",
        ),
        (
            "--num-beams",
            ["--num-beams", "9"],
            "--num-beams: 9 is outside [1, 8] (16, or the server's --max-batch if fewer)",
        ),
        (
            "--temperature",
            ["--num-beams", "2", "--temperature", "0.5"],
            "--temperature: beam search (num_beams 2) decodes",
        ),
        ("--length-penalty", ["--length-penalty", "11"], "--length-penalty: 11 is outside [-10, 10]"),
        ("--early-stopping", ["--early-stopping", "soon"], "argument --early-stopping: invalid choice: 'soon'"),
        (
            "--num-return-sequences",
            ["--num-return-sequences", "0"],
            "--num-return-sequences: 0 is outside [1, 16] (num_beams narrows it)",
        ),
        (
            "--num-return-sequences",
            ["--num-beams", "2", "--num-return-sequences", "3"],
            "--num-return-sequences: 3 is outside [1, 2] (num_beams)",
        ),
        ("--priority", ["--priority", str(2**31)], "--priority: 2147483648 is outside [-2147483648, 2147483647]"),
        ("--stop-token-ids", ["--stop-token-ids", "x"], "--stop-token-ids takes comma-separated numbers"),
        ("--stop-token-ids", ["--stop-token-ids", "1,999"], "--stop-token-ids[1]: 999 is outside [0, 259)"),
        ("--logit-bias", ["--logit-bias", "7"], "--logit-bias takes comma-separated ID=BIAS pairs (e.g. 50=-100)"),
        ("--logit-bias", ["--logit-bias", "7=101"], "--logit-bias[7]: 101 is outside [-100, 100]"),
        # braces doubled: the rows go through str.format
        ("--json-schema", ["--json-schema", '{{"type": "nope"}}'], "--json-schema: Invalid type: nope"),
        ("--json-schema", ["--json-schema", "@/no/such.json"], "--json-schema @/no/such.json: No such file"),
        ("--json-schema", ["--json-schema", "{{}}", "--regex", "a"], "give --json-schema or --regex, not both"),
        ("--regex", ["--regex", "[a-z"], "--regex: at 1(8): invalid regex"),
        ("--no-stream", ["--no-stream=yes"], "--no-stream"),
        ("--json", ["--json=yes"], "--json"),
        (
            "--stream-interval-tokens",
            ["--stream-interval-tokens", "0"],
            "--stream-interval-tokens: 0 is outside [1, 4294967295] (the server's max_new_tokens cap narrows it)",
        ),
        (
            "--stream-interval-tokens",
            ["--stream-interval-tokens", "500"],
            "INVALID_ARGUMENT: --stream-interval-tokens: 500 is outside [1, 127]",
        ),
        ("--stream-interval-ms", ["--stream-interval-ms", "-1"], "--stream-interval-ms: -1 is outside [0, 60000]"),
        ("--request-id", ["--request-id", "x" * 300], "--request-id: 300 characters, the limit is 128"),
        (
            "--target",
            ["--target", "127.0.0.1:99999"],
            "--target 127.0.0.1:99999: target '127.0.0.1:99999' has port 99999, outside 1 to 65535",
        ),
        ("--timeout", ["--timeout", "0"], "--timeout must be positive, got 0"),
        ("--tls-ca", ["--tls-ca", "/no/such/ca.pem"], "--tls-ca /no/such/ca.pem: No such file or directory"),
        ("--tls-cert", ["--tls-ca", "{pem}", "--tls-cert", "{pem}"], "--tls-cert and --tls-key go together"),
        ("--tls-key", ["--tls-ca", "{pem}", "--tls-cert", "{pem}", "--tls-key", "{file}"], "--tls-key {file}"),
        ("--tls-server-name", ["--tls-server-name", "example.org"], "--tls-server-name needs TLS"),
        ("--token-file", ["--token-file", "/no/such/token"], "--token-file /no/such/token"),
    ],
    "bench": [
        ("--concurrency", ["--concurrency", "0"], "--concurrency levels must be at least 1, got 0"),
        ("--concurrency", ["--concurrency", "x"], "--concurrency takes comma-separated numbers"),
        ("--rate", ["--rate", "-1"], "--rate levels must be positive, got -1"),
        ("--backend", ["--backend", "grpc"], "invalid choice: 'grpc'"),
        ("--backend", ["--backend", "openai"], "--target {target} (--backend openai): '{target}' is not an http://"),
        ("--endpoint", ["--endpoint", "embeddings"], "invalid choice: 'embeddings'"),
        ("--endpoint", ["--endpoint", "chat"], "--endpoint is for --backend openai"),
        ("--model", ["--model", "small"], "--model is for --backend openai"),
        ("--requests", ["--requests", "0"], "--requests must be at least 1, got 0"),
        ("--connections", ["--connections", "0"], "--connections must be at least 1, got 0"),
        ("--prompt-tokens", ["--prompt-tokens", "0"], "--prompt-tokens must be at least 1"),
        ("--prompt-tokens", ["--prompt-tokens", "100000"], "--prompt-tokens 100000 is over the server's limit"),
        ("--prompt-ids", ["--prompt-ids=yes"], "--prompt-ids"),
        ("--prompt-text", ["--prompt-text=yes"], "--prompt-text"),
        ("--max-new-tokens", ["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
        ("--max-new-tokens", ["--max-new-tokens", "100000"], "--max-new-tokens 100000 is over the server's cap of 127"),
        ("--ignore-eos", ["--ignore-eos=yes"], "--ignore-eos"),
        ("--trace", ["--trace=yes"], "--trace"),
        ("--warmup", ["--warmup", "-1"], "--warmup must not be negative, got -1"),
        ("--temperature", ["--temperature", "-1"], "--temperature: -1 is outside [0, 100]"),
        ("--top-k", ["--top-k", "-1"], "--top-k: -1 is outside [0, 2147483647] (the model's vocab_size narrows it)"),
        ("--top-k", ["--top-k", "260"], "--top-k 260 is over the model's vocab_size of 259"),
        ("--top-p", ["--top-p", "0"], "--top-p: 0 is outside (0, 1]"),
        ("--min-p", ["--min-p", "-0.1"], "--min-p: -0.1 is outside [0, 1]"),
        ("--repetition-penalty", ["--repetition-penalty", "0"], "--repetition-penalty: 0 is outside (0, 100]"),
        ("--presence-penalty", ["--presence-penalty", "2.5"], "--presence-penalty: 2.5 is outside [-2, 2]"),
        ("--frequency-penalty", ["--frequency-penalty", "-3"], "--frequency-penalty: -3 is outside [-2, 2]"),
        ("--logprobs", ["--logprobs", "21"], "--logprobs: 21 is outside [0, 20]"),
        ("--mix", ["--mix", "chatty"], "argument --mix: invalid choice: 'chatty' (choose from 'production')"),
        ("--mix", ["--mix", "production", "--top-k", "5"], "--mix production sets each request's sampling"),
        ("--stream-interval-tokens", ["--stream-interval-tokens", "0"], "--stream-interval-tokens: 0 is outside [1, "),
        ("--stream-interval-ms", ["--stream-interval-ms", "-1"], "--stream-interval-ms: -1 is outside [0, 60000]"),
        ("--out", ["--out", "/no/such/dir/x.json"], "directory /no/such/dir does not exist"),
        ("--plot", ["--plot", "{tmp}/x.txt"], "matplotlib writes"),
        (
            "--target",
            ["--target", "127.0.0.1:99999"],
            "--target 127.0.0.1:99999: target '127.0.0.1:99999' has port 99999, outside 1 to 65535",
        ),
        ("--timeout", ["--timeout", "0"], "--timeout must be positive, got 0"),
        ("--tls-ca", ["--tls-ca", "{file}"], "--tls-ca {file}: not a PEM file"),
        ("--tls-cert", ["--tls-ca", "{pem}", "--tls-cert", "{pem}"], "--tls-cert and --tls-key go together"),
        ("--tls-key", ["--tls-ca", "{pem}", "--tls-key", "{pem}"], "--tls-cert and --tls-key go together"),
        ("--tls-server-name", ["--tls-server-name", "example.org"], "--tls-server-name needs TLS"),
        ("--token-file", ["--token-file", "/no/such/token"], "--token-file /no/such/token"),
    ],
}

# What would start a subcommand's work where a missing check could not end it cheaply.
TRIPWIRES = {"ray-serve": ["attnserve.ray_serve.main:start_ray"]}


def flags_of(command: str) -> set[str]:
    """Every flag (its first spelling) and positional argument of the subcommand's parser."""
    names = set()
    for action in subcommand_parser(command)._actions:
        if not isinstance(action, argparse._HelpAction):
            names.add(action.option_strings[0] if action.option_strings else action.dest)
    return names


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_flag_has_a_row(command):
    """A flag added without a bad-value row (or a reason it has none) fails here."""
    rows = {flag for flag, _, _ in TABLE[command]}
    exempt = {flag for (c, flag) in NO_BAD_VALUE if c == command}
    assert rows & exempt == set()
    assert flags_of(command) - exempt - rows == set(), "flags without a bad-value row"
    assert (rows | exempt) - flags_of(command) == set(), "rows for flags the parser does not have"


@pytest.fixture(scope="module")
def places(
    tmp_path_factory,
    tiny_checkpoint,
    tiny_seq2seq_checkpoint,
    tiny_model_dir,
    tiny_bpe_model_dir,
    tiny_seq2seq_model_dir,
    server,
    gpt2_dir,
):
    """The placeholders' values; `busy` is a port held open for as long as the module runs."""
    tmp = tmp_path_factory.mktemp("refusals")
    (tmp / "file").write_text("a plain file\n")
    (tmp / "empty").write_text("")
    (tmp / "binary").write_bytes(bytes(range(256)) * 64)
    (tmp / "short").write_bytes(b"tiny corpus\n" * 10)
    (tmp / "no-text").mkdir()
    (tmp / "no-text" / "notes.md").write_text("not a .txt file")
    (tmp / "bad.tsv").write_text("12\ttwelve\nno tab on this line\n")
    (tmp / "long.tsv").write_text("12\ttwelve\n" + "9" * 80 + "\tnines\n")
    (tmp / "pem").write_text("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    yield {
        "tmp": str(tmp),
        "file": str(tmp / "file"),
        "empty": str(tmp / "empty"),
        "binary": str(tmp / "binary"),
        "pem": str(tmp / "pem"),
        "short": str(tmp / "short"),
        "notxt": str(tmp / "no-text"),
        "bad_tsv": str(tmp / "bad.tsv"),
        "long_tsv": str(tmp / "long.tsv"),
        "ckpt": str(tiny_checkpoint),
        "hf": str(gpt2_dir),
        "s2s": str(tiny_seq2seq_checkpoint),
        "model": str(tiny_model_dir),
        "bpe_model": str(tiny_bpe_model_dir),
        "s2s_model": str(tiny_seq2seq_model_dir),
        "target": server.target,
        "busy": str(held.getsockname()[1]),
    }
    held.close()


def command_line(command: str, flag: str, args: list[str]) -> list[str]:
    if flag.startswith("--") and flag not in INSTEAD_OF_POSITIONALS:
        return [command, *POSITIONALS.get(command, []), *BASE[command], *args]
    return [command, *args, *BASE[command]]


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_each_bad_value_is_one_line_and_exit_2(command, places, tmp_path):
    rows = TABLE[command]
    argvs = [[a.format(**places) for a in command_line(command, flag, args)] for flag, args, _ in rows]
    problems = []
    for (flag, _, fragment), argv, got in zip(
        rows, argvs, run_in_one_process(argvs, tmp_path, TRIPWIRES.get(command, []))
    ):
        lines = got["stderr"].splitlines()
        fragment = fragment.format(**places)
        prefix = f"attnserve {command}: error: "
        ok = (
            got["rc"] == 2
            and len(lines) == 1
            and lines[0].startswith(prefix)
            and fragment in lines[0]
            and (flag in lines[0] or not flag.startswith("--"))
            and got["stdout"] == ""
        )
        if not ok:
            problems.append(
                f"{' '.join(argv)}\n    rc={got['rc']} stdout={got['stdout'][:200]!r}\n    {got['stderr'][:600]}"
            )
    assert not problems, f"{len(problems)} of {len(rows)} refusals are not one line naming the flag:\n" + "\n".join(
        problems
    )
