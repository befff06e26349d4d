# The two commands of the README: `make demo` (set everything up, run the demo) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean

$(BIN)/diag: pyproject.toml diag/read/kineto/event_scan.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first: pip then finds torch satisfied and downloads no CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/diag

setup: $(BIN)/diag

demo: setup
	$(BIN)/diag demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The unit tests on two workers (whole files apart: a module's shared fixtures stay in one);
# the gloo jobs and the browser one at a time, as their verdicts are judged on a loaded host
# but not on one loaded by the suite itself.
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests/unit
	$(BIN)/python -m pytest -q tests/distributed tests/browser

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
