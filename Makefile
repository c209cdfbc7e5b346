# The two commands a newcomer runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: test demo protos bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(VENV)/bin/bash scripts/demo.sh 2>/dev/null || bash scripts/demo.sh

protos: $(STAMP)
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
