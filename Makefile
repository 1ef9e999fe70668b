# Two commands do all the set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: up up-with-detector install-detector test unit integration test-external proto proto-check contract install install-dev clean

# Base install: everything `up` needs, torch kept out; and the Python client (clients/python,
# a distribution of its own) with its development tokens and MCP server.
$(VENV)/.base-installed: pyproject.toml clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e . -e 'clients/python[dev-token,mcp]'
	touch $@

# Tests also need the dev tools and the detector extra (torch 2.13.0 CPU, gliner).
$(VENV)/.dev-installed: $(VENV)/.base-installed
	$(PIP) install -e '.[dev,detector]'
	touch $@

install: $(VENV)/.base-installed
install-dev: $(VENV)/.dev-installed

# The detector extra (torch 2.13.0 CPU, transformers, gliner): what `models fetch` / `models import`
# need to install the PII and Prompt-Guard models (docs/detector.md).
install-detector: $(VENV)/.base-installed
	$(PIP) install -e '.[detector]'

up: install
	$(VENV)/bin/context-engine up $(ARGS)

up-with-detector: install-detector
	$(VENV)/bin/context-engine up $(ARGS)

test: install-dev
	$(PY) proto/generate.py --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest

unit: install-dev
	$(PY) -m pytest tests/unit

integration: install-dev
	$(PY) -m pytest tests/integration

# The contracts' external half (tests/contracts), against servers you run: a PostgreSQL superuser
# URL (a database of the suite's own is created and dropped on it) and a broker's bootstrap address.
#   make test-external DATABASE_URL=postgresql://postgres:pw@db:5432/postgres KAFKA_BOOTSTRAP=kafka:9092
test-external: install-dev
	@test -n "$(DATABASE_URL)" -a -n "$(KAFKA_BOOTSTRAP)" || { \
	  echo "make test-external needs DATABASE_URL=<PostgreSQL superuser URL> KAFKA_BOOTSTRAP=<host:port>" >&2; exit 2; }
	CONTEXT_ENGINE_TEST_DATABASE_URL='$(DATABASE_URL)' CONTEXT_ENGINE_TEST_KAFKA_BOOTSTRAP='$(KAFKA_BOOTSTRAP)' \
	  $(PY) -m pytest tests/contracts -k External -rs

proto: install-dev
	$(PY) proto/generate.py

contract: install-dev
	$(PY) ../shared/tools/check_contract.py .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
