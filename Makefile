# Two commands: `make demo` sets everything up and runs the main job; `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
# Spark's JVM packages (see $(JARS)/.fetched below).
JARS := $(VENV)/jars
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.8
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=
# `make test` runs the suite in two passes: first the tests marked `alone` (the cluster modules:
# each starts a whole distributed shape, which beside another test's load once lost a Spark
# executor with rank's local checkpoint), one process; then the rest on TEST_WORKERS pytest-xdist
# workers (tests/conftest.py keeps what shares a started component on one worker). TEST_WORKERS=0
# runs the second pass in one process too. A pass that PYTEST_ARGS leaves empty (exit code 5) is
# not a failure; a `-m` in PYTEST_ARGS replaces the passes' own.
TEST_WORKERS ?= 2

.PHONY: jars demo cluster-demo soak docs lint test test-faults test-unit bench bench-overhead bench-ledger bench-delta-log bench-regimes bench-read bench-spark-packages bench-recovery bench-replay bench-pairs bench-senderlog bench-steps bench-travellers install java test-tools cluster-tools all-tools lock clean

## demo: install everything (Java too, if missing), then run the reference application through real
## Airflow and Spark: 8 epochs, a lost scratch tier, the frontier recovery, checks and a report
demo: install
	$(VENV)/bin/python -m devstack.figure1_demo $(DEMO_ARGS)

## cluster-demo: the reference application on the distributed shape (Postgres, Redis, Celery
## workers, a Spark cluster, S3), one of two workers lost and recovered (devstack/cluster_demo.py)
cluster-demo: install cluster-tools
	$(VENV)/bin/python -m devstack.cluster_demo $(DEMO_ARGS)

## test: the whole suite (unit, property, integration against real components): the tests that
## must run alone first, then the rest on TEST_WORKERS workers (see above)
test: all-tools install test-tools cluster-tools
	$(PY) -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not alone" $(PYTEST_ARGS) \
	  || [ $$? -eq 5 ]

## soak: continuous epochs on the distributed shape while a seeded schedule of faults lands, each
## recovered as a user would, then every table against a failure-free run (devstack/soak/run.py):
## make soak DURATION=60m SEED=7 MIX=kill-worker=2,freeze-s3=1 (the report prints the seed);
## BROKEN=gc-watermark gets a step recovery relies on wrong on purpose, to show the soak catches it;
## DAGS=figure1,shards runs only those DAGs side by side (default: figure1, shards, loops, regions)
DURATION ?= 20m
SEED ?=
MIX ?=
MEAN_GAP ?= 90
BROKEN ?=
DAGS ?=
soak: install cluster-tools
	$(PY) -m devstack.soak.run --duration $(DURATION) --mean-gap $(MEAN_GAP) $(if $(SEED),--seed $(SEED)) \
	  $(if $(MIX),--mix $(MIX)) $(if $(BROKEN),--broken $(BROKEN)) $(if $(DAGS),--dags $(DAGS))

## docs: the docs site (Sphinx, Markdown pages) with warnings as errors, then its links checked;
## opens at docs/_build/html/index.html (the suite builds it too: tests/unit/test_docs.py)
docs: install
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	$(PY) -m sphinx -W --keep-going -q -b linkcheck docs docs/_build/linkcheck
	@echo "docs: docs/_build/html/index.html"

## lint: ruff (pyflakes, import order, pyupgrade) and mypy on the package and devstack/; CI runs it
## before the tests. mypy reads the packages as they are installed (falkirk.policies, ...): a tree of
## links under build/typecheck lays them out so.
LINTED := policies plugins spark_jobs devstack
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	@mkdir -p build/typecheck/falkirk
	@for d in policies plugins spark_jobs; do ln -sfn ../../../$$d build/typecheck/falkirk/$$d; done
	@ln -sfn ../../devstack build/typecheck/devstack
	cd build/typecheck && $(abspath $(VENV))/bin/mypy --config-file ../../pyproject.toml \
	  --python-executable $(abspath $(PY)) -p falkirk.policies -p falkirk.plugins -p falkirk.spark_jobs -p devstack

## test-faults: the fault drills of the recovery itself (a replay killed and resumed, a collection
## between plan and replay) through real Airflow, Spark and Delta
test-faults: install
	$(PY) -m pytest -m faults tests/integration/recovery $(PYTEST_ARGS)

## test-unit: the fast part only (no Airflow, Spark or S3 processes)
test-unit: install
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

## bench: the rollback solver benchmark (full solves vs incremental updates, 10 to 10,000 processors)
bench: install
	$(PY) -m benchmarks.solver_bench $(BENCH_ARGS)

## bench-overhead: a task instance's start-to-end time through Airflow, the same small Spark job as a plain
## task with its own Spark Connect session and as a Falkirk task under each regime (job host and fresh interpreter)
bench-overhead: install
	$(PY) -m benchmarks.overhead_bench $(BENCH_ARGS)

## bench-ledger: reading the ledger of 20 tasks x 4 partitions x 1,000 epochs, local and on moto_server
bench-ledger: install
	$(PY) -m benchmarks.ledger_bench

## bench-delta-log: a table's opens and appends on moto_server per Delta checkpoint interval, as ratios to the default of 100
bench-delta-log: install
	$(PY) -m benchmarks.delta_log_bench

## bench-recovery: the distributed shape, one of two workers lost late in the reference application:
## the Falkirk plan against clear-downstream and a restart; each regime's overhead, scratch tier on and off
bench-recovery: install cluster-tools
	$(PY) -m benchmarks.recovery_bench $(BENCH_ARGS)

## bench-replay: a replay's wall time against the critical path of its re-runs, make demo's plan and a lost
## worker on the distributed shape, this checkout against BEFORE (a worktree with its own environment)
BEFORE ?= ea3a66b
bench-replay: install cluster-tools
	$(PY) -m benchmarks.replay_bench --before $(BEFORE) $(BENCH_ARGS)

## bench-pairs: process pairs on the distributed shape, one of four workers lost at epoch 10 of 20: output and
## latency of the recovering and other partitions, state copied, input dropped; unreplicated vs cluster pairs vs process pairs
bench-pairs: install cluster-tools
	$(PY) -m benchmarks.pairs_bench $(BENCH_ARGS)

## bench-regimes: one Spark job over 8.5M rows per epoch, durable store on moto_server: each regime's per-epoch time as a ratio to no fault tolerance
bench-regimes: install
	$(PY) -m benchmarks.regime_bench $(BENCH_ARGS)

## bench-read: reading one epoch of a Falkirk input, the runtime's path against Spark's own Delta reader, on
## moto_server and the local disk, at make bench-regimes's output size and ten times it (ratios)
bench-read: install
	$(PY) -m benchmarks.read_bench $(BENCH_ARGS)

## bench-spark-packages: one epoch of the reference application's rank on a Spark Connect server with Delta's
## JVM packages and extension (as devstack starts it), with the packages only, and with neither, rounds alternating (ratios)
bench-spark-packages: install
	$(PY) -m benchmarks.spark_packages_bench $(BENCH_ARGS)

## bench-steps: an iterative job killed at 80% of an epoch, resumed from its checkpoint inside the epoch vs
## redoing the epoch; and the steady-state cost of those checkpoints, as ratios
bench-steps: install
	$(PY) -m benchmarks.steps_bench $(BENCH_ARGS)

## bench-senderlog: the regions pipeline through Airflow under no fault tolerance, LazyCheckpoint and SenderLog at
## several block sizes (per-epoch time as ratios), then a lost state recovered under each
bench-senderlog: install
	$(PY) -m benchmarks.senderlog_bench $(BENCH_ARGS)

## bench-travellers: commit latency at a transactional sink, marker pairs vs committing once per epoch
bench-travellers: install
	$(PY) -m benchmarks.travellers_bench $(BENCH_ARGS)

# Python compiles each module it imports unless a .pyc is on disk. uv installs none, and where
# PYTHONDONTWRITEBYTECODE is set nothing writes them later: every Airflow, Spark and job process
# would compile Airflow's modules again (about a quarter of an API server's start-up CPU). Compiled
# once here, for the packages and for the project's own modules (up to date in about a second).
SOURCES := plugins policies spark_jobs devstack dags benchmarks tests

install: $(VENV)/.compiled $(JARS)/.fetched
	@$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null

# Spark's JVM packages (jvm/pom.xml: Delta for Spark 4.2, Hadoop's S3A and the AWS SDK modules it
# calls), from Maven Central into .venv/jars, once per change of the pom; the Spark servers
# devstack starts load them (devstack/spark_packages.py). Fetched into a new directory and moved
# into place, so an interrupted fetch leaves no partial set behind.
$(JARS)/.fetched: jvm/pom.xml
	@$(MAKE) --no-print-directory java
	rm -rf $(JARS).partial
	mvn -B -q -f jvm/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(abspath $(JARS)).partial
	rm -rf $(JARS) && mv $(JARS).partial $(JARS)
	@touch $@

## jars: fetch Spark's JVM packages only (make install does it too)
jars: $(JARS)/.fetched

$(VENV)/.compiled: $(VENV)/.installed
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null
	@touch $@

$(VENV)/.installed: requirements.txt requirements.lock pyproject.toml
	@$(MAKE) --no-print-directory java
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip >/dev/null
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	@$(MAKE) --no-print-directory $(WHEELHOUSE)/.built
	$(UV) pip install --compile-bytecode --python $(PY) --find-links $(WHEELHOUSE) -r requirements.txt \
	  -c requirements.lock -e .
	@touch $@

# PyPI has pyspark and pyspark-client as source archives only. uv builds such an archive again at
# every install into a new environment (a new cache entry of 1.4 GB each time: the packaging test's
# fresh environment filled the disk); built once into the wheelhouse, every install takes the wheel.
WHEELHOUSE := $(VENV)/wheelhouse
$(WHEELHOUSE)/.built: requirements.lock
	@mkdir -p $(WHEELHOUSE)
	$(PY) -m pip wheel -q --disable-pip-version-check --no-cache-dir --no-deps -w $(WHEELHOUSE) \
	  $$(grep -E '^pyspark(-client)?==' requirements.lock)
	@touch $@

# Debian's packages, each installed when its tool is missing (devstack/debian_tools.sh: one
# apt-get update and one install for all that are missing; `make test` asks for every one at once).
# Java runs Spark, Maven fetches its JVM packages.
JAVA_TOOLS := java=openjdk-17-jre-headless mvn=maven
# Debian's docker-compose validates docker-compose.yml in the tests (no Docker engine needed);
# Debian's chromium runs the browser test of the Falkirk view (Playwright drives it).
TEST_TOOLS := docker-compose=docker-compose chromium=chromium
# The distributed shape (devstack.cluster): Debian's PostgreSQL (Airflow's metadata, the query
# statistics) and Redis (the CeleryExecutor's broker), started by the project's own code.
CLUSTER_TOOLS := '/usr/lib/postgresql/*/bin/postgres=postgresql' redis-server=redis-server
DEBIAN_TOOLS = @SUDO="$(SUDO)" bash devstack/debian_tools.sh

java:
	$(DEBIAN_TOOLS) $(JAVA_TOOLS)

test-tools:
	$(DEBIAN_TOOLS) $(TEST_TOOLS)

cluster-tools:
	$(DEBIAN_TOOLS) $(CLUSTER_TOOLS)

# Every tool `make test` needs, in one apt-get install
all-tools:
	$(DEBIAN_TOOLS) $(JAVA_TOOLS) $(TEST_TOOLS) $(CLUSTER_TOOLS)

## lock: regenerate requirements.lock from requirements.txt
lock:
	$(UV) pip compile --python $(PY) requirements.txt -o requirements.lock --no-header

clean:
	rm -rf .airflow .falkirk spark-warehouse metastore_db derby.log
