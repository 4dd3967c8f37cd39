# Two commands on a fresh machine: `make run` starts the proxy, `make test` runs the tests.
# Both create .venv and install the project into it first (once, and again when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/context-guard serve $(ARGS)

test: $(BIN)/.installed
	$(BIN)/pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check proxy tests bench examples
	$(BIN)/mypy proxy

bench: $(BIN)/.installed
	$(BIN)/python bench/counting.py
	$(BIN)/python bench/trimming.py
	$(BIN)/python bench/proxy_overhead.py
	$(BIN)/python bench/adapters.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
