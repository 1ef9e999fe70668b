# Two commands do all the set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: up test unit integration proto proto-check contract install install-dev bench-smoke clean

# Base install: everything `up` needs, torch kept out.
$(VENV)/.base-installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e .
	touch $@

# Tests also need the dev tools and the detector extra (torch 2.13.0 CPU, gliner).
$(VENV)/.dev-installed: $(VENV)/.base-installed
	$(PIP) install -e '.[dev,detector]'
	touch $@

install: $(VENV)/.base-installed
install-dev: $(VENV)/.dev-installed

up: install
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

proto: install-dev
	$(PY) proto/generate.py

contract: install-dev
	$(PY) ../shared/tools/check_contract.py .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
