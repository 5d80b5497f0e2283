# snapfeed developer entry points. Everything installs into ./.venv (never system-wide).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Airflow gets its own environment (see requirements-airflow.txt); the DAG runs the job with $(PY).
AIRFLOW_VENV := .venv-airflow
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed
DEMO_OUT ?= out/demo
# Quiet TensorFlow's C++ start-up logging in every command.
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install install-airflow demo test test-all lint format check bench protos clean

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

$(AIRFLOW_STAMP): setup.py pyproject.toml requirements-airflow.txt
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet -r requirements-airflow.txt
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(AIRFLOW_STAMP)

install: $(STAMP)

install-airflow: $(AIRFLOW_STAMP)

demo: install
	$(PY) -m examples.demo --output=$(DEMO_OUT)

TEST_ENV := SNAPFEED_AIRFLOW_PYTHON=$(abspath $(AIRFLOW_VENV))/bin/python

# The default suite runs on TEST_WORKERS processes, a test file to each (--dist loadfile keeps a file's
# module fixtures in one process): most tests wait on subprocesses, servers and Beam, so two workers
# overlap that waiting even on 2 cores. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

# A worker ended by a per-test timeout (pyproject.toml) is replaced once; xdist runs the test that hung again
# there (--dist loadfile puts its file back whole), and a second hang ends the run: a hang costs 10 minutes, never 90.
test: install install-airflow
	$(TEST_ENV) $(PY) -m pytest -m "not slow" -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=1

test-all: install install-airflow
	$(TEST_ENV) $(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

check: lint test

bench: install
	$(PY) -m bench.materialize_bench
	$(PY) -m bench.tft_bench
	$(PY) -m bench.reader_bench
	$(PY) -m bench.reader_bench --systems=snapfeed,gather --hog=1
	$(PY) -m bench.union_bench --repeats=5
	$(PY) -m bench.mixture_bench
	$(PY) -m bench.resume_bench
	$(PY) -m bench.cold_read_bench
	$(PY) -m bench.remote_read_bench
	$(PY) -m bench.service_bench
	$(PY) -m bench.jax_bench
	$(PY) -m bench.torch_bench
	$(PY) -m bench.torch_device_feed

protos: install
	$(PY) -m schemas.generate_protos

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) out *.egg-info
