# The two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv itself
# (idempotent: it reinstalls only when pyproject.toml changes) and pins torch==2.13.0.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-text test test-fast lint docs bench faults s3-server clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,s3,gcs,azure,dali,demo,bench,ray,docs,text]"
	# Azurite (Azure Blob's emulator) for the storage tests, into .tools/azurite; where npm cannot
	# reach its registry, set-up goes on and the Azure tests skip saying so.
	npm install --prefix .tools/azurite --no-audit --no-fund --silent azurite@3 \
		|| echo "note: npm could not install Azurite: the Azure storage tests will be skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tools.demo

demo-text: $(STAMP)
	$(PY) -m tools.demo --text

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: $(STAMP) lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The documentation site, built and served on http://127.0.0.1:8000 (rebuilt on every edit).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

# The tier to run while working (under 2 minutes): no test marked slow, so no SeaweedFS, torchrun,
# Ray or other program started (tests/conftest.py marks and checks that).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

# The fault-injection suite against a local SeaweedFS; writes benchmarks/results_faults.md.
faults: $(STAMP)
	$(PY) -m tools.faults

s3-server: $(STAMP)
	$(PY) -m tools.s3_server

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info
