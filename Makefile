# atmostonce: two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST  := $(BIN)/pytest
WORKERS ?= 2
SLICE   ?= 0/12
# the CI slice of mutmut: mutant-name globs (docs/mutmut.md) and the test files it runs, which must hold every
# test that kills one of its mutants (mutation/mutmut_run.py, --tests); a few minutes on 2 cores
MUTMUT_SLICE ?= 'atmostonce.identity.*'
MUTMUT_SLICE_TESTS ?= tests/test_identity.py tests/test_identity_format.py tests/test_sources.py \
  tests/test_function_transport.py
# `make mutmut MUTMUT="'atmostonce.model.*'"` runs (and records) one module; empty: every mutant
MUTMUT  ?=


.PHONY: ha ha-ci console-screenshots differential-repeat demo test quick lint typecheck spec-check docs docs-check soak soak-worker bench bench-ab bench-vs matrix demo-matrix demo-json-server demo-email email model-check formal-tests mutation ablation mutation-slice mutmut mutmut-stale mutmut-slice wheel-check clean

# the test stack (every extra): make test, quick and the rest
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# what the demo needs: the core install alone (no extras: no Synapse, mutmut, Hypothesis, pytest)
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then \
	  echo "make demo: $(VENV) already has the test install, which includes the core"; \
	else \
	  echo "make demo: installing atmostonce (the core, without the test stack) into $(VENV) ..."; \
	  start=$$(date +%s); \
	  { test -x $(BIN)/python || $(PY) -m venv $(VENV); } && \
	  $(BIN)/python -m pip install -q --disable-pip-version-check -e . && \
	  echo "make demo: installed in $$(( $$(date +%s) - start )) s"; \
	fi
	@touch $(DEMO_STAMP)

## the main job on the embedded default (SQLite + the local platform sink); installs the core only
demo: $(DEMO_STAMP)
	$(BIN)/atmostonce demo

## the whole test suite: unit, stateful (model, SQLite, PostgreSQL), transports, real servers, end to end
## (installs PostgreSQL and Spin with apt-get first when they are missing)
## (the HA cluster tests, tests/ha, run in `make ha` and `make ha-ci`: they start etcd and two Patroni nodes;
## the tests that run Spin, marker `spin`, run in `make model-check`; the slowest durations are printed)
test: $(STAMP)
	bash .ci/install-tools.sh
	$(PYTEST) -n $(WORKERS) -q -p no:randomly --ignore=tests/ha -m "not spin" --durations=15

## spec check + lint + type check + docs lint + fast tests, under a minute: the model, the core, and the SQL store's
## contract on SQLite (tests/test_sql_store.py; every other test's SQLite case, selected by its id, runs in
## `make test`: on this 2-core machine they were two thirds of quick's test time); the suites
## that start real servers or drive the CLI or the runtime end to end (tests/http, tests/test_cli*.py,
## test_runtime, test_service, test_extras, test_readme, the web console (tests/console), the conformance
## cases, Synapse, Postfix/Dovecot, PostgreSQL, and the heavier SQLite files: races, async, the claim and approval
## machines, signing, policy gate, late evidence, retraction, lease intake, import scans; the users' and operators'
## trials, worker processes, migrations raced across processes, the outbox's fairness and retry spacing) run in
## `make test`
quick: $(STAMP) spec-check lint typecheck docs-check
	$(PYTEST) -q -x -m "not postgres and not slow" -k "not sqlite or test_sql_store" -n $(WORKERS) \
	  --ignore=tests/test_store_differential.py --ignore=tests/test_pgserver.py --ignore=tests/matrix --ignore=tests/email \
	  --ignore=tests/http --ignore=tests/conformance --ignore=tests/ha --ignore-glob='tests/test_cli*.py' \
	  --ignore=tests/test_runtime.py --ignore=tests/test_service.py --ignore=tests/test_extras.py --ignore=tests/test_readme.py \
	  --ignore=tests/console --ignore=tests/test_sweeper_batch_races.py --ignore=tests/test_async_sql_store.py \
	  --ignore=tests/test_claims_runtime.py --ignore=tests/test_signed_approvals.py --ignore=tests/test_review_claims.py \
	  --ignore=tests/test_front_door.py --ignore=tests/test_claims.py --ignore=tests/test_claims_stateful.py \
	  --ignore=tests/test_claim_and_approval_records.py --ignore=tests/test_choosing_an_approval.py \
	  --ignore=tests/test_policy_gate.py --ignore=tests/test_late_evidence.py --ignore=tests/test_retraction.py \
	  --ignore=tests/test_lease_intake.py --ignore=tests/test_operator_trial.py --ignore=tests/test_function_async_trial.py \
	  --ignore=tests/test_sqlite_worker_crash_trial.py --ignore=tests/test_pg_worker_trial.py \
	  --ignore=tests/test_send_answers_and_migrations_review.py --ignore=tests/test_concurrent_migration.py \
	  --ignore=tests/test_schema_newer.py --ignore=tests/test_sqlite_lossable_review.py --ignore=tests/test_fair_queues.py \
	  --ignore=tests/test_retry_spacing.py --ignore=tests/test_retry_spacing_review.py --ignore=tests/test_restore_parked.py \
	  --ignore=tests/test_review_restore_parked_and_sqlite_create.py --ignore=tests/test_review_lost_race_retry.py \
	  --ignore=tests/test_diagnosis_clock_edge.py --ignore=tests/test_review_lookup_key_and_resend.py \
	  --ignore=tests/test_cli_look_before_sending_again.py --ignore=tests/test_settle_looks_first.py \
	  --ignore=tests/test_review_settle_session.py --ignore=tests/test_object_on_record.py --ignore=tests/test_person_plan.py --ignore=tests/test_review_look_and_despite.py

## the PostgreSQL HA cluster (etcd + two Patroni nodes on loopback, docs/deployment.md): the failover tests, then
## 4 worker processes publish HA_INTENTS intents while the primary is SIGKILLed HA_FAILOVERS times, with the rule
## (synchronous replication, HA mode sync: no duplicate) and without it (the ablation: must catch a duplicate);
## both runs write their results to docs/deployment.md
HA_INTENTS   ?= 2000
HA_FAILOVERS ?= 3
ha: $(STAMP)
	bash .ci/install-tools.sh
	$(PYTEST) -q -p no:randomly tests/ha
	$(BIN)/python -m tests.ha.load --intents $(HA_INTENTS) --failovers $(HA_FAILOVERS) --workers 4 --write docs/deployment.md
	$(BIN)/python -m tests.ha.load --intents $(HA_INTENTS) --failovers $(HA_FAILOVERS) --workers 4 --ablation --write docs/deployment.md

## the bounded HA slice for CI: the failover tests and one failover under a few hundred intents (nothing written)
ha-ci: $(STAMP)
	$(PYTEST) -q -p no:randomly tests/ha
	$(BIN)/python -m tests.ha.load --intents 300 --failovers 1 --workers 4

spec-check: $(STAMP)
	$(BIN)/atmostonce spec check

lint: $(STAMP)
	$(BIN)/ruff check reference adapters tests mutation spec tools
	$(BIN)/ruff format --check reference adapters tests mutation spec tools

## mypy: --strict on the atmostonce package, a lighter pass on the adapters ([tool.mypy] in pyproject.toml), and
## tests/typing_protocols.py: the shipped stores and transports satisfy their protocols; tools/ (the docs generator) strict;
## incremental, cached in build/mypy-cache
TYPED := atmostonce atmostonce_sql atmostonce_http atmostonce_cli atmostonce_matrix atmostonce_email atmostonce_function atmostonce_console
typecheck: $(STAMP)
	$(BIN)/mypy $(addprefix -p ,$(TYPED)) -p tools -m tests.typing_protocols

## regenerate docs/ tables and diagrams from spec/table.toml (docs/state-machine.md, docs/guards.md, docs/sql.md)
docs: $(STAMP)
	$(BIN)/python -m tools.docgen --write
	$(BIN)/python -m mutation.report --write
	$(BIN)/python -m tools.sqldoc --write

docs-check: $(STAMP)
	$(BIN)/python -m tools.docgen --check
	$(BIN)/python -m mutation.report --check || { echo "docs/guards.md is stale: run make docs"; exit 1; }
	$(BIN)/python -m tools.sqldoc --check

## longer stateful runs against the real databases
soak: $(STAMP)
	HYPOTHESIS_PROFILE=soak $(PYTEST) -q tests/test_store_differential.py tests/test_async_store_differential.py

## worker processes on a throwaway PostgreSQL for SOAK_SECONDS (default an hour): the database restarted under
## them, workers SIGKILLed, platform faults; zero duplicates, audit intact; writes docs/soak.md
SOAK_SECONDS ?= 3600
soak-worker: $(STAMP)
	bash .ci/install-tools.sh
	SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/python -m tests.soak_worker --write docs/soak.md

## the differential suite (SQLite and PostgreSQL against the model) RUNS times in a row, fresh seeds each run;
## stops at the first red run. Load the machine from another shell to run it under load.
RUNS ?= 20
differential-repeat: $(STAMP)
	for i in $$(seq 1 $(RUNS)); do \
	  echo "run $$i of $(RUNS), load $$(cut -d' ' -f1 /proc/loadavg)"; \
	  $(PYTEST) -q -p no:randomly -p no:cacheprovider tests/test_store_differential.py tests/test_stateful_clock.py || exit 1; \
	done

## retake the screenshots docs/console.md shows (the browser test, writing into docs/console)
console-screenshots: $(STAMP)
	ATMOSTONCE_SCREENSHOTS=docs/console $(PYTEST) -q -p no:randomly tests/console/test_browser.py

## benchmark a protected call (submit, authorize, no-op send, outcome) through atmostonce, raw psycopg and the
## two PyPI peers (installed into their own venv), interleaved, fsync on; and the store against its own SQL
## replayed raw; writes docs/performance.md. A measurement, not a test.
BENCH_VENV ?= build/bench-venv
$(BENCH_VENV)/.installed: pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q -e ".[postgres]" agent-once==0.1.0 exactly-once==0.2.1
	touch $@
bench: $(STAMP) $(BENCH_VENV)/.installed
	$(BIN)/python tests/bench/bench_store.py --write
	$(BENCH_VENV)/bin/python tests/bench/bench_dispatch.py --write

## one hot-path change with and without it, taking turns in one process (tests/bench/ab_publish.py)
bench-ab: $(STAMP)
	$(BIN)/python tests/bench/ab_publish.py query
	$(BIN)/python tests/bench/ab_publish.py chain

## this working tree against a git revision (BASE=rev), each in its own process, taking turns (tests/bench/ab_versions.py);
## SQLITE=1: on one SQLite file instead of PostgreSQL
bench-vs: $(STAMP)
	$(BIN)/python tests/bench/ab_versions.py $(BASE) $(if $(SQLITE),--sqlite)

## the Matrix transport against a real local Synapse, and the demo on it
matrix: $(STAMP)
	$(PYTEST) -q tests/matrix
demo-matrix: $(STAMP)
	$(BIN)/atmostonce demo --platform matrix
## the main job against json-server (npm, installed into build/npm) behind the fault proxy (docs/platforms.md)
demo-json-server: $(STAMP)
	$(BIN)/atmostonce demo --platform json-server

## the main job against a throwaway Postfix and Dovecot behind the SMTP fault relay (needs root and the Debian
## packages postfix and dovecot-imapd, which `bash .ci/install-tools.sh` installs; says so and exits 3 without them)
demo-email: $(STAMP)
	$(BIN)/atmostonce demo --platform email

## the email transport against a real local Postfix and Dovecot (docs/platforms.md)
email: $(STAMP)
	bash .ci/install-tools.sh
	$(PYTEST) -q tests/email

## formal check: Spin model generated from spec/table.toml, one ablation per guard, the broken config (docs/formal.md)
## then the Spin tests (vacuity probes, coverage, the broken trail), leaving out those that repeat its jobs
## (generator: spec/promela_gen/; the exit status is the results': a slow run only prints a warning)
model-check: $(STAMP)
	$(BIN)/python spec/promela.py --check
	$(BIN)/python spec/modelcheck.py
	$(PYTEST) -n $(WORKERS) -q -p no:randomly -m "spin and not exhaustive" tests/test_formal.py

## every Spin test, the exhaustive ones too (each configuration but restore, two ablations)
formal-tests: $(STAMP)
	$(PYTEST) -n $(WORKERS) -q -p no:randomly -m spin tests/test_formal.py

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

## re-run and record only the functions whose recorded mutmut evidence is stale (they changed since), then the
## same report and check over them
mutmut-stale: $(STAMP)
	$(BIN)/python -m mutation.mutmut_run --max-children $(WORKERS) --record --stale
	$(BIN)/python -m mutation.mutmut_report --write

## a bounded mutmut slice (CI, a few minutes): the same gate on the mutants named by MUTMUT_SLICE, running only
## the tests in MUTMUT_SLICE_TESTS (staged in build/mutmut-slice/, apart from the full run's build/mutmut/)
mutmut-slice: $(STAMP)
	$(BIN)/python -m mutation.mutmut_run --max-children $(WORKERS) $(addprefix --tests ,$(MUTMUT_SLICE_TESTS)) \
	  $(MUTMUT_SLICE)
	$(BIN)/python -m mutation.mutmut_check --mutants build/mutmut-slice/mutants $(MUTMUT_SLICE)

## build the wheel, install it without extras into a fresh virtual environment, load the table from there,
## and run the README's "Using it" snippet from there on SQLite, twice on the same file
wheel-check: $(STAMP)
	rm -rf build/wheel-check && mkdir -p build/wheel-check
	$(BIN)/python -m pip wheel -q --no-deps -w build/wheel-check .
	$(PY) -m venv build/wheel-check/venv
	build/wheel-check/venv/bin/python -m pip install -q build/wheel-check/*.whl
	cd build && wheel-check/venv/bin/python -c "import atmostonce; from atmostonce.table import spec_dir; \
	  p = spec_dir(); assert 'site-packages' in str(p), p; \
	  from atmostonce.checks import check_table; assert check_table(atmostonce.table()) == {}; \
	  from atmostonce_email.classify import email_outcomes_path, email_outcome_table; email_outcome_table(); \
	  assert 'site-packages' in str(email_outcomes_path()); \
	  from atmostonce_http.profile import profiles_dir, shipped_profiles; assert 'site-packages' in str(profiles_dir()); \
	  assert {'local-sink', 'json-server', 'matrix'} <= set(shipped_profiles()), shipped_profiles(); \
	  print('wheel ships the table:', p)"
	@# the docs generator is a repository tool (tools/docgen.py), not part of the wheel; the core imports no TOML
	cd build && wheel-check/venv/bin/python -c "import importlib.util, sys; import atmostonce; \
	  assert importlib.util.find_spec('atmostonce.docgen') is None, 'the wheel ships atmostonce.docgen'; \
	  assert importlib.util.find_spec('tools') is None, 'the wheel ships tools/'; \
	  assert sys.modules['atmostonce.table'].table.cache_info().currsize == 0, 'import atmostonce read the table'; \
	  assert 'atmostonce.conformance' not in sys.modules, 'import atmostonce loaded the conformance suite'"
	cd build && wheel-check/venv/bin/atmostonce spec check
	cd build && wheel-check/venv/bin/python -c "import pathlib, atmostonce, atmostonce_sql, atmostonce_http; \
	  missing = [m.__name__ for m in (atmostonce, atmostonce_sql, atmostonce_http) \
	             if not (pathlib.Path(m.__file__).parent / 'py.typed').is_file()]; \
	  assert not missing, f'no py.typed in {missing}'"
	@# the README's "Using it" block, taken from README.md (tests/test_readme.py), run twice from the wheel on SQLite
	$(BIN)/python -c "from tests.test_readme import python_blocks; print(python_blocks()[0])" > build/wheel-check/using_it.py
	mkdir -p build/wheel-check/run
	cd build/wheel-check/run && for run in 1 2; do \
	  ../venv/bin/python ../using_it.py > out.txt || exit 1; cat out.txt; \
	  test "$$(tail -n 1 out.txt)" = published || { echo "wheel-check: run $$run of the README snippet did not end published"; exit 1; }; \
	done

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache mutants
