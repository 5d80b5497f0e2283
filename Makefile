# snapfeed developer entry points. Everything installs into ./.venv (never system-wide).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= out/demo
# Quiet TensorFlow's C++ start-up logging in every command.
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install demo test test-all lint format check bench protos clean

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m examples.demo --output=$(DEMO_OUT)

test: install
	$(PY) -m pytest -m "not slow" -q

test-all: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

check: lint test

bench: install
	$(PY) -m bench.materialize_bench
	$(PY) -m bench.reader_bench

protos: install
	$(PY) -m schemas.generate_protos

clean:
	rm -rf $(VENV) out *.egg-info
