# The two commands a newcomer runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

GENAI_VENV  := .venv-genai
GENAI_STAMP := $(GENAI_VENV)/.installed-stamp

.PHONY: test demo protos bench genai-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

# onnxruntime-genai brings the CPU onnxruntime, so it gets a virtual environment of its own.
$(GENAI_STAMP): pyproject.toml
	test -x $(GENAI_VENV)/bin/python || $(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/python -m pip install -q --upgrade pip
	$(GENAI_VENV)/bin/python -m pip install -q onnxruntime-genai==0.18.0 numpy
	$(GENAI_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(GENAI_STAMP)

test: $(STAMP) $(GENAI_STAMP)
	$(PY) -m pytest

# Full benchmarks: JSON and PNG reports under reports/.
bench: $(STAMP)
	mkdir -p reports
	$(PY) -m attnserve.export.benchmark --tokens 64,128,256,512 --repeats 3 \
		--out reports/decode.json --plot reports/decode.png

# make genai-check MODEL=models/small: the same model directory, decoded by onnxruntime-genai
genai-check: $(GENAI_STAMP)
	$(GENAI_VENV)/bin/python scripts/check_genai.py $(MODEL)

demo: $(STAMP)
	bash scripts/demo.sh

protos: $(STAMP)
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) $(GENAI_VENV) build *.egg-info
