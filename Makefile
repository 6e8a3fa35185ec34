# Trainyard: `make up` starts the whole system locally, `make test` runs the whole suite.
# Both create a virtualenv in .venv unless one is already active.  `make up` installs
# only what the stack runs on; `make install` (and test, lint, bench) adds the dev tools.
# .ci/install does the installing, with uv when it can (see README.md, "Install").

SHELL := /bin/bash
VENV ?= .venv
ifdef VIRTUAL_ENV
PYTHON := python
STAMPS := $(VIRTUAL_ENV)
else
PYTHON := $(VENV)/bin/python
STAMPS := $(VENV)
endif
# What is installed, and from which pyproject.toml: the dev install includes the runtime one.
STAMP := $(STAMPS)/.trainyard-installed
RUNTIME_STAMP := $(STAMPS)/.trainyard-runtime-installed
PYTEST_ARGS ?=

.PHONY: install chromium up test test-fast bench proto lint clean

$(VENV)/bin/python:
	@echo "==> Creating a virtualenv in $(VENV)..."
	@python3 -m venv --without-pip $(VENV)  # .ci/install adds pip (ensurepip alone takes seconds)

$(STAMP): pyproject.toml $(if $(VIRTUAL_ENV),,$(VENV)/bin/python)
	@./.ci/install $(PYTHON) dev
	@touch $(STAMP) $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml $(if $(VIRTUAL_ENV),,$(VENV)/bin/python)
	@if [ $(STAMP) -nt pyproject.toml ]; then :; else ./.ci/install $(PYTHON) runtime; fi
	@touch $(RUNTIME_STAMP)

install: $(STAMP) chromium

# The console's browser tests drive Debian's chromium (Playwright never downloads a browser).
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then echo "Installing chromium for the console's browser tests..."; \
	    apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; \
	  else echo "chromium is missing: the console's browser tests will fail until you run 'sudo apt-get install -y chromium'"; fi; }

up: $(RUNTIME_STAMP)
	@echo "==> Starting the stack: NATS, Redis, the services, node agents and the gateway..."
	@$(PYTHON) -m trainyard.cli.main up $(UP_ARGS)

test: install
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PYTHON) -m pytest -m "not e2e" $(PYTEST_ARGS)

bench: install
	$(PYTHON) bench/pipeline.py
	$(PYTHON) bench/admission.py
	$(PYTHON) bench/placement.py
	$(PYTHON) bench/accounting.py

PB_OUT := libs/trainyard/_pb

proto: install
	rm -rf $(PB_OUT)/trainyard
	mkdir -p $(PB_OUT)/trainyard/v1
	$(PYTHON) -m grpc_tools.protoc -Iproto --python_out=$(PB_OUT) --pyi_out=$(PB_OUT) --grpc_python_out=$(PB_OUT) proto/trainyard/v1/*.proto
	sed -i.orig 's/^from trainyard\.v1 import/from trainyard._pb.trainyard.v1 import/' $(PB_OUT)/trainyard/v1/*_pb2*.py
	rm -f $(PB_OUT)/trainyard/v1/*.orig
	touch $(PB_OUT)/trainyard/__init__.py $(PB_OUT)/trainyard/v1/__init__.py

# ruff also reports syntax errors, so every Python file is at least parsed.  mypy checks
# the packages its [tool.mypy] section in pyproject.toml names, in strict mode.
lint: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

clean:
	rm -rf .trainyard .pytest_cache build dist
