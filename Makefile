# The two commands a newcomer runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

GENAI_VENV  := .venv-genai
GENAI_STAMP := $(GENAI_VENV)/.installed-stamp

PB7_VENV  := .venv-pb7
PB7_STAMP := $(PB7_VENV)/.installed-stamp

.PHONY: test test-fast import-sizes sizes lint format demo docs docs-reference protos bench kv-bench perf gpu-check gpu-ladder speculative tokenizer-table genai-check soak overload clean

$(STAMP): pyproject.toml attnserve/engine/whole_draw.c  # the C file: its library is built at install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,train,dev]'
	touch $(STAMP)

# onnxruntime-genai brings the CPU onnxruntime, so it gets a virtual environment of its own.
$(GENAI_STAMP): pyproject.toml
	test -x $(GENAI_VENV)/bin/python || $(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/python -m pip install -q --upgrade pip
	$(GENAI_VENV)/bin/python -m pip install -q onnxruntime-genai==0.18.0 numpy
	$(GENAI_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(GENAI_STAMP)

# .venv holds protobuf 6 (tritonclient, in [dev], needs < 7); this is a serving and client host on
# the newest protobuf 7, no torch, for tests/test_protobuf_compat.py: a server and a client on each.
$(PB7_STAMP): pyproject.toml
	test -x $(PB7_VENV)/bin/python || $(PYTHON) -m venv $(PB7_VENV)
	$(PB7_VENV)/bin/python -m pip install -q --upgrade pip
	$(PB7_VENV)/bin/python -m pip install -q --upgrade -e '.[cpu]' 'protobuf>=7'
	touch $(PB7_STAMP)

# The suite in two workers (pytest-xdist), each test file whole on one of them; the models the fixtures
# train, import and export are built once and shared (tests/built_once.py). Alone it kept one core of
# two busy (docs/reports/test-suite.md). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP) $(GENAI_STAMP) $(PB7_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The edit loop's lane (about 20 s): the tests that train, import or serve no model (the engine over
# its fake runner, tokenizers, clients, the docs, the layering), stopping at the first failure.
test-fast: $(STAMP)
	$(PY) -m pytest -m fast -x -q -n $(TEST_WORKERS)

# The habits as tools (configured in pyproject.toml): ruff's lint and format check, then mypy.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Rewrites the tree the way `make lint` wants it (imports sorted, formatted).
format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Full benchmarks: JSON and PNG reports under reports/. The serving benchmark needs a trained
# model directory (make demo writes models/small; BENCH_MODEL=models/NAME picks another). The KV
# benchmark trains (once, 150 s) a small model with a 1024-token context and exports it twice:
# the arena (the default) and the concat cache it replaced, then adds onnxruntime-genai.
BENCH_MODEL ?= models/small
KV_RUN      := runs/small-1k
KV_MODEL    := models/small-1k
$(KV_RUN)/checkpoint.pt: | $(STAMP)
	$(VENV)/bin/attnserve train --preset small --tokenizer bytes --context-length 1024 --batch-size 8 --time-budget 150 --out $(KV_RUN)
$(KV_MODEL)/attnserve.json: $(KV_RUN)/checkpoint.pt
	$(VENV)/bin/attnserve export $(KV_RUN)/checkpoint.pt --out $(KV_MODEL)
	$(VENV)/bin/attnserve export $(KV_RUN)/checkpoint.pt --out $(KV_MODEL)-concat --kv-cache concat
kv-bench: $(STAMP) $(GENAI_STAMP) $(KV_MODEL)/attnserve.json
	mkdir -p reports
	$(PY) -m benchmarks.kv --model $(KV_MODEL) --concat-model $(KV_MODEL)-concat \
		--new-tokens 256,512 --concurrency 1,4,16,64 --repeats 3 --out reports/kv.json --plot reports/kv.png

# Where the engine's time goes (issue 22): the engine in this process and the engine core in its own
# against a plain loop over the same arena driver, then `attnserve serve --engine-core process` against
# `thread` through gRPC and onnxruntime-genai's static batches, at 1, 16 and 64 streams, and a mixed
# workload (exponential output lengths) served against genai's static batches. A small BPE model with
# a 1024-token context, trained once for 60 s.
PERF_RUN   := runs/small-1k-bpe
PERF_MODEL := models/small-1k-bpe
$(PERF_RUN)/checkpoint.pt: | $(STAMP)
	$(VENV)/bin/attnserve train --preset small --context-length 1024 --batch-size 8 --time-budget 60 --out $(PERF_RUN)
$(PERF_MODEL)/attnserve.json: $(PERF_RUN)/checkpoint.pt
	$(VENV)/bin/attnserve export $(PERF_RUN)/checkpoint.pt --out $(PERF_MODEL)
perf: $(STAMP) $(GENAI_STAMP) $(PERF_MODEL)/attnserve.json
	mkdir -p reports
	$(PY) -m benchmarks.engine_cost --model $(PERF_MODEL) --new-tokens 256 --repeats 5 --intervals 1,8,unary \
		--out reports/engine-cost.json
	$(PY) -m benchmarks.engine_core --model $(PERF_MODEL) --repeats 3 \
		--out reports/engine-core.json --plot reports/engine-core.png
	$(PY) -m benchmarks.mixed --model $(PERF_MODEL) --repeats 3 --out reports/mixed.json --plot reports/mixed.png
	$(PY) -m benchmarks.mixed --model $(PERF_MODEL) --repeats 3 --call unary \
		--out reports/mixed-unary.json --plot reports/mixed-unary.png
	$(PY) -m benchmarks.prefix_cache --model $(PERF_MODEL) --repeats 5 \
		--out reports/prefix-cache.json --plot reports/prefix-cache.png

# Hugging Face checkpoints at real sizes (GPT-2 small's config, SmolLM-135M's), random weights made from
# configs: attnserve import, export, serve and bench, each step timed (about 15 minutes on 2 cores).
import-sizes: $(STAMP)
	mkdir -p reports
	$(PY) -m benchmarks.import_sizes --work runs/sizes --out reports/import-sizes.json

# The size ladder: the lectures' small preset (trained for 60 s), GPT-2-shaped 34M and 124M and SmolLM-135M's
# shape (random weights from configs), each exported float32, int8 and int4, decoded at 1, 16 and 64 streams
# by attnserve served through gRPC, the plain loop over its arena driver, onnxruntime-genai on the same
# directory, PyTorch eager and CTranslate2 (the [dev] extra installs it) on the same weights, sides
# alternating; with each export's bandwidth limit. Checkpoints and exports are kept in runs/ladder.
sizes: $(STAMP) $(GENAI_STAMP)
	mkdir -p reports
	$(PY) -m benchmarks.size_ladder --work runs/ladder --out reports/size-ladder.json --plot reports/size-ladder.png

# Speculative decoding (issue 64): served with and without --speculative-config (prompt lookup) at 1, 4
# and 16 streams, on a copy-heavy and a plain workload cut from the corpus's held-out tail. The target: the
# small preset with rotary positions over 384 positions, taught to copy on runs of random ids listed twice
# first (benchmarks/copy_corpus.py --random-ids, 1,500 steps), then on the copy corpus (the default
# corpus's passages repeated, to 4,000 steps): about 50 minutes on 2 cores (docs/reports/speculative.md),
# exported int8.
SPEC_CORPUS := runs/copy-dense.txt
SPEC_IDS    := runs/copy-ids.txt
SPEC_RUN    := runs/copy
SPEC_MODEL  := models/copy-int8
SPEC_TRAIN  := $(VENV)/bin/attnserve train --preset small --positional rotary --context-length 384 \
	--batch-size 16 --lr 0.001 --eval-interval 500 --out $(SPEC_RUN)
$(SPEC_CORPUS): | $(STAMP)
	mkdir -p runs
	$(PY) -m benchmarks.copy_corpus $(SPEC_CORPUS) --shortest 80 --longest 300 --plain-every 4
$(SPEC_RUN)/ids.done: $(SPEC_CORPUS)
	rm -rf $(SPEC_RUN)
	$(SPEC_TRAIN) --corpus $(SPEC_CORPUS) --max-steps 1
	$(PY) -m benchmarks.copy_corpus $(SPEC_IDS) --random-ids $(SPEC_RUN)/checkpoint.pt
	$(SPEC_TRAIN) --resume --corpus $(SPEC_IDS) --max-steps 1500
	touch $@
$(SPEC_RUN)/text.done: $(SPEC_RUN)/ids.done
	$(SPEC_TRAIN) --resume --corpus $(SPEC_CORPUS) --max-steps 4000
	touch $@
$(SPEC_MODEL)/attnserve.json: $(SPEC_RUN)/text.done
	$(VENV)/bin/attnserve export $(SPEC_RUN)/checkpoint.pt --quantize int8 --out $(SPEC_MODEL)
speculative: $(STAMP) $(SPEC_MODEL)/attnserve.json
	mkdir -p reports
	$(PY) -m benchmarks.speculative --model $(SPEC_MODEL) --streams 1,4,16 --repeats 3 \
		--out reports/speculative.json --plot reports/speculative.png

# The CUDA path on a CUDA host (issue 23): train on the GPU, export float16 and bfloat16 (gated on
# CUDA), pytest -m gpu, then ONNX Runtime CUDA vs PyTorch CUDA per token and gRPC at 1, 16, 64 streams;
# one table, JSON in reports/gpu-check.json. Runs with the Python it finds (GPU_PYTHON), not .venv: a
# CUDA host brings its own torch and onnxruntime-gpu. Without CUDA it says what it would run and exits 0.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m benchmarks.gpu_check --out reports/gpu-check.json

# The size ladder on a CUDA host (issues 44, 62): GPT-2 small's shape (random weights) in float16 and int4
# on CUDA, served tokens/s at 1, 16, 64 and 256 streams against the decode step's ceiling at that batch,
# the defaults beside --max-waiting-steps 16 and --run-ahead on, time to first token and inter-token
# latency percentiles, and the sampler issue's request kinds at 64 streams; one table, JSON and PNG in
# reports/. An offline host: scripts/gpu_ladder_offline.sh.
gpu-ladder:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m benchmarks.gpu_ladder --out reports/gpu-ladder.json

bench: $(STAMP) kv-bench
	mkdir -p reports
	$(PY) -m benchmarks.decode --tokens 64,128,256,512 --repeats 3 \
		--out reports/decode.json --plot reports/decode.png
	@if [ -f $(BENCH_MODEL)/attnserve.json ]; then \
		$(PY) -m benchmarks.serving --model $(BENCH_MODEL) --concurrency 1,2,4,8,16 \
			--new-tokens 96 --repeats 3 --out reports/serving.json --plot reports/serving.png; \
	else echo "make bench: no $(BENCH_MODEL); run make demo first for the serving benchmark"; fi

# Which tokenizer trains the better model in attnserve train's default budget: the small preset,
# 180 s each, bytes vs BPE at three vocabulary sizes (about 13 minutes); then the bytes and the
# 2048-id BPE models served side by side through attnserve bench (bytes/s). The README's tables.
tokenizer-table: $(STAMP)
	mkdir -p reports
	$(PY) benchmarks/tokenizer_table.py --runs runs/tokenizers --out reports/tokenizers.json --plot reports/tokenizers.png
	$(VENV)/bin/attnserve export runs/tokenizers/bytes/checkpoint.pt --out models/tok-bytes
	$(VENV)/bin/attnserve export runs/tokenizers/bpe-2048/checkpoint.pt --out models/tok-bpe
	$(PY) benchmarks/tokenizer_serving.py --bytes models/tok-bytes --bpe models/tok-bpe \
		--out reports/tokenizer-serving.json --plot reports/tokenizer-serving.png

# make genai-check MODEL=models/small: the same model directory, decoded by onnxruntime-genai
genai-check: $(GENAI_STAMP)
	$(GENAI_VENV)/bin/python scripts/check_genai.py $(MODEL)

demo: $(STAMP)
	bash scripts/demo.sh

# The manual as a site (MkDocs, Material theme) in site/; --strict fails on a broken link or anchor.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

# The reference pages generated from the code (docs/reference/: the command line, the metrics, the gRPC
# API); tests/test_docs_reference.py fails when a committed page is stale.
docs-reference: $(STAMP)
	$(PY) scripts/docs_reference.py

protos: $(STAMP)
	$(PY) protos/generate.py

# Many streams for a long time with misbehaving clients (cancels, expiring deadlines, SIGKILLed
# clients, malformed requests): statuses, RSS over time, latencies; exit 1 if a check fails.
# `make test` runs a 12-second version. SOAK_ARGS="--duration 60" for a shorter one.
SOAK_ARGS ?=
soak: $(STAMP)
	mkdir -p reports
	$(PY) -m benchmarks.loadtest.soak --model $(BENCH_MODEL) --duration 600 --streams 64 $(SOAK_ARGS) \
		--out reports/soak.json --plot reports/soak.png

# Open-loop arrivals at 4x the server's capacity: queue bound, refusal latency, accepted TTFT against
# its bound, health latency; exit 1 if a check fails. `make test` runs a 6-second version.
overload: $(STAMP)
	mkdir -p reports
	$(PY) -m benchmarks.loadtest.overload --model $(BENCH_MODEL) --factor 4 --duration 30 --max-new-tokens 120 \
		--out reports/overload.json --plot reports/overload.png

clean:
	rm -rf $(VENV) $(GENAI_VENV) $(PB7_VENV) build *.egg-info
