# The two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv itself
# (idempotent: it reinstalls only when pyproject.toml changes) and pins torch==2.13.0.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REGION_STAMP := $(VENV)/.region-built
# Debian's package for libjpeg-turbo's headers (libjpeg-dev elsewhere, e.g. Ubuntu's libjpeg-turbo8-dev)
APT := (apt-get update -qq && (apt-get install -y -qq libjpeg62-turbo-dev || apt-get install -y -qq libjpeg-dev)) >/dev/null 2>&1

.PHONY: setup region demo demo-text demo-pairs test test-fast lint docs bench faults s3-server clean

setup: $(STAMP) region

# The JPEG region decoder (dataio/decode/_region.c, a C extension over libjpeg-turbo) is optional:
# its headers are installed with apt-get where missing and possible, and a failed build only means
# the decoders use simplejpeg (they say so once per process). The same build makes the token batches'
# one-pass doc_ids/position_ids (dataio/stream/_token_runs.c, no library; without it, numpy).
region: $(REGION_STAMP)

$(REGION_STAMP): $(STAMP) setup.py dataio/decode/_region.c dataio/decode/_fasthuff.h dataio/stream/_token_runs.c
	test -f /usr/include/jpeglib.h || $(APT) || sudo -n sh -c '$(APT)' \
		|| echo "libjpeg-turbo headers missing (apt-get install libjpeg62-turbo-dev): JPEG region decode not built"
	$(PY) -c "import setuptools" 2>/dev/null || $(PY) -m pip install -q setuptools
	$(PY) setup.py -q build_ext --inplace || echo "JPEG region decode not built: crops decode whole (simplejpeg)"
	rm -rf build
	touch $(REGION_STAMP)

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

demo: $(STAMP) region
	$(PY) -m tools.demo

demo-text: $(STAMP) region
	$(PY) -m tools.demo --text

demo-pairs: $(STAMP) region
	$(PY) -m tools.demo_pairs

lint: $(STAMP)
	$(VENV)/bin/lint-imports

# The suite runs on cores + 1 processes (pytest-xdist; tests/conftest.py), the docs site builds as one of
# its tests (tests/tools/test_docs_site.py). compileall first: where PYTHONDONTWRITEBYTECODE is set, every
# torchrun rank and CLI process would compile the project's modules again. pytest runs without it: each
# test process rewrites the asserts of every test module it collects (~10 CPU-s) unless pytest may cache
# the rewritten modules in __pycache__, as it then does for the next run.
test: $(STAMP) region lint
	$(PY) -m compileall -q dataio sharding trainer tools benchmarks tests
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n auto --dist worksteal --durations=25 $(PYTEST_ARGS)

# The documentation site, built and served on http://127.0.0.1:8000 (rebuilt on every edit).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

# The tier to run while working (under 2 minutes): no test marked slow, so no SeaweedFS, torchrun,
# Ray or other program started (tests/conftest.py marks and checks that).
test-fast: $(STAMP) region
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP) region
	$(PY) -m benchmarks.run_all

# The fault-injection suite against a local SeaweedFS; writes benchmarks/results_faults.md.
faults: $(STAMP)
	$(PY) -m tools.faults

s3-server: $(STAMP)
	$(PY) -m tools.s3_server

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info dataio/decode/_region.*.so dataio/stream/_token_runs.*.so
