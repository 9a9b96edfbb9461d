# The two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv itself
# (idempotent: it reinstalls only when pyproject.toml changes) and pins torch==2.13.0.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup region demo test test-fast lint docs bench faults s3-server clean

setup: $(STAMP) region

# The JPEG region decoder (dataio/decode/_region.c, a C extension over libjpeg-turbo) is optional:
# its headers are installed with apt-get where missing and possible, and a failed build only means
# the decoders use simplejpeg (they say so once per process).
region: $(STAMP)
	test -f /usr/include/jpeglib.h || (command -v apt-get >/dev/null && (apt-get install -y -q libjpeg62-turbo-dev \
		|| sudo -n apt-get install -y -q libjpeg62-turbo-dev)) || echo "libjpeg-turbo headers missing: JPEG region decode not built"
	$(PY) setup.py -q build_ext --inplace || echo "JPEG region decode not built: crops decode whole (simplejpeg)"
	rm -rf build

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,s3,dali,demo,bench,ray,docs,text]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tools.demo

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: $(STAMP) lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site
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
	rm -rf $(VENV) .pytest_cache build site *.egg-info dataio/decode/_region.*.so
