# atmostonce: two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST  := $(BIN)/pytest
WORKERS ?= 2
SLICE   ?= 0/12
# the CI slice of mutmut: mutant-name globs (docs/mutmut.md)
MUTMUT_SLICE ?= 'atmostonce.errors.*' 'atmostonce.identity.*'
# `make mutmut MUTMUT="'atmostonce.model.*'"` runs (and records) one module; empty: every mutant
MUTMUT  ?=

.PHONY: demo test quick lint spec-check docs docs-check soak bench matrix demo-matrix model-check mutation ablation mutation-slice mutmut mutmut-slice wheel-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

## the main job on the embedded default (SQLite + the local platform sink)
demo: $(STAMP)
	$(BIN)/atmostonce demo

## the whole test suite: unit, stateful (model, SQLite, PostgreSQL), transports, end to end, formal
## (installs PostgreSQL and Spin with apt-get first when they are missing)
test: $(STAMP)
	bash .ci/install-tools.sh
	$(PYTEST) -n $(WORKERS) -q -p no:randomly

## spec check + lint + docs lint + fast tests, under a minute
quick: $(STAMP) spec-check lint docs-check
	$(PYTEST) -q -x -m "not postgres and not slow" -n $(WORKERS) \
	  --ignore=tests/test_store_differential.py --ignore=tests/test_pgserver.py --ignore=tests/matrix \
	  --ignore=tests/conformance/test_conformance.py

spec-check: $(STAMP)
	$(BIN)/atmostonce spec check

lint: $(STAMP)
	$(BIN)/ruff check reference adapters tests mutation spec
	$(BIN)/ruff format --check reference adapters tests mutation spec

## regenerate docs/ tables and diagrams from spec/table.toml
docs: $(STAMP)
	$(BIN)/python -m atmostonce.docgen --write
	$(BIN)/python -m mutation.report --write

docs-check: $(STAMP)
	$(BIN)/python -m atmostonce.docgen --check
	$(BIN)/python -m mutation.report --check || { echo "docs/guards.md is stale: run make docs"; exit 1; }

## longer stateful runs against the real databases
soak: $(STAMP)
	HYPOTHESIS_PROFILE=soak $(PYTEST) -q tests/test_store_differential.py

## benchmark the PostgreSQL store against raw psycopg (fsync on); writes docs/performance.md
bench: $(STAMP)
	$(BIN)/python tests/bench/bench_store.py --write

## the Matrix transport against a real local Synapse, and the demo on it
matrix: $(STAMP)
	$(PYTEST) -q tests/matrix
demo-matrix: $(STAMP)
	$(BIN)/atmostonce demo --platform matrix

## formal check: Spin model generated from spec/table.toml, one ablation per guard, the broken config (docs/formal.md)
model-check: $(STAMP)
	$(BIN)/python spec/promela.py --check
	$(BIN)/python spec/modelcheck.py

## the full mutation proof (hours on 2 cores): guard ablation, then mutmut; each writes its report to docs/
mutation: ablation mutmut

## guard ablation (every guard, source state and outcome mapping, at each layer) -> docs/guards.md
ablation: $(STAMP)
	$(BIN)/python -m mutation.ablate --jobs $(WORKERS)
	$(BIN)/python -m mutation.report --write

## a bounded slice of the ablation run (CI)
mutation-slice: $(STAMP)
	$(BIN)/python -m mutation.ablate --jobs $(WORKERS) --slice $(SLICE)

## mutmut over reference/ and adapters/atmostonce_sql/guards.py (hours on 2 cores), then docs/mutmut.md;
## fails on a survivor mutation/mutmut_explained.json does not explain
mutmut: $(STAMP)
	$(BIN)/python -m mutation.mutmut_run --max-children $(WORKERS) --record $(MUTMUT)
	$(BIN)/python -m mutation.mutmut_report --write
	$(BIN)/python -m mutation.mutmut_check $(MUTMUT)

## a bounded mutmut slice (CI, a few minutes): the same gate on the mutants named by MUTMUT_SLICE
mutmut-slice: $(STAMP)
	$(BIN)/python -m mutation.mutmut_run --max-children $(WORKERS) $(MUTMUT_SLICE)
	$(BIN)/python -m mutation.mutmut_check $(MUTMUT_SLICE)

## build the wheel, install it into a fresh virtual environment, load the table from there
wheel-check: $(STAMP)
	rm -rf build/wheel-check && mkdir -p build/wheel-check
	$(BIN)/python -m pip wheel -q --no-deps -w build/wheel-check .
	$(PY) -m venv build/wheel-check/venv
	build/wheel-check/venv/bin/python -m pip install -q build/wheel-check/*.whl
	cd build && wheel-check/venv/bin/python -c "import atmostonce; from atmostonce.table import spec_dir; \
	  p = spec_dir(); assert 'site-packages' in str(p), p; \
	  from atmostonce.checks import check_table; assert check_table(atmostonce.table()) == {}; \
	  print('wheel ships the table:', p)"
	cd build && wheel-check/venv/bin/atmostonce spec check

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache mutants
