# Two commands set up everything on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The suite runs on this many pytest-xdist workers (each starts its own Kafka, Postgres and Spark Connect server).
TEST_WORKERS ?= 2
export PYTHONPATH := $(CURDIR)/include:$(CURDIR)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo up airflow-down test unit integration e2e lint jars venv airflow connect registry cdc down bench chaos chaos-cluster cluster soak clean browser prometheus docs docs-generate

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

jars: $(STAMP)
	$(PY) -m microbatch.dev.stack jars

demo: jars
	$(PY) -m microbatch.cli demo

# The services only (Kafka, PostgreSQL and the Spark Connect server; no sample data, no DAG run), for your own
# pipeline (docs/your-own-pipeline.md); reused while they live, `make down` stops them.
up: jars
	$(PY) -m microbatch.dev.stack services

test: jars browser prometheus docs
	$(PY) -m ruff check .
	rm -rf .cache/test-report && mkdir -p .cache/test-report
	MICROBATCH_FIXTURE_REPORT=.cache/test-report/fixtures.json $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal --timeout=900 --durations=0 --junitxml=.cache/test-report/junit.xml tests $(PYTEST_ARGS) | tee .cache/test-report/pytest.log; status=$${PIPESTATUS[0]}; \
		$(PY) tests/durations.py .cache/test-report --top 15 || true; exit $$status

# `apt-get install` of package $(1), which `make test` needs for $(2); as root with apt-get only, else one sentence.
apt_install = { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null || { echo "make test needs $(2) but cannot \
	install it: it runs apt-get install $(1) only as root on a system with apt-get; install $(1) (its command on \
	PATH) yourself, e.g. sudo apt-get install $(1), then run make test again." >&2; exit 1; }; \
	apt-get update -qq && apt-get install -y -qq $(1); }

# Debian's chromium, for the browser test of the ledger page (Playwright drives it; no browser download).
# Without root or apt-get it stops with what is missing and how to get it (the test does not skip silently).
browser:
	@command -v chromium >/dev/null || $(call apt_install,chromium,Chromium (the browser test of the ledger page))

# Debian's Prometheus server, which the metrics test starts on loopback to scrape `microbatch metrics`.
prometheus:
	@command -v prometheus >/dev/null || $(call apt_install,prometheus,Prometheus (the metrics test))

# The docs site (mkdocs-material) into site/; --strict: a broken link, anchor or included file fails the build.
# The spec and CLI references and the included files are refreshed on the way too (docs/hooks.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Rewrite the generated parts of docs/*.md (the references, the included files) from the code, to commit them:
# the pages then read on GitHub as on the site. tests/unit/test_docs.py fails while one is stale.
docs-generate: $(STAMP)
	$(PY) docs/hooks.py

unit: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(PY) -m ruff check .

airflow: jars
	$(PY) -m microbatch.cli airflow

# A detached Spark Connect server for pipelines in `spark.mode: connect` (reused while it lives; `make down`
# stops it); the server requires a token, which `.cache/devstack/env.sh` exports in MICROBATCH_SPARK_REMOTE.
connect: jars
	$(PY) -m microbatch.dev.stack connect

# A detached schema registry (Apicurio Registry 2.6 from Maven Central, in memory, on 127.0.0.1; reused while it
# lives; `make down` stops it and its schemas are gone); `.cache/devstack/env.sh` exports MICROBATCH_SCHEMA_REGISTRY_URL.
registry: jars
	$(PY) -m microbatch.dev.stack registry

# Change data capture on the local stack: a source PostgreSQL with logical decoding (its sample table public.orders)
# and a Kafka Connect worker (Apache Kafka 4.1 jars) running Debezium's PostgreSQL connector into the topic
# cdc.public.orders of the stack's Kafka; reused while they live, `make down` stops them, `make clean` removes them.
cdc: jars
	$(PY) -m microbatch.dev.stack cdc

# `make airflow`'s standalone and every process it started, nothing else: the services keep running.
airflow-down: $(STAMP)
	$(PY) -m microbatch.dev.stack airflow-down

down: $(STAMP)
	$(PY) -m microbatch.dev.stack down

bench: jars
	$(PY) bench/throughput.py
bench-delta: jars
	$(PY) bench/delta_sink.py

# The full chaos harness (100,000 lines, every fault 3 times by SIGKILL and by SIGTERM) and the
# randomized soak (SEED=... replays one); both print a table and take tens of minutes.
chaos: jars
	$(PY) -m tests.chaos.harness --records 100000 --rounds 3

# The same on a three-broker KRaft cluster (RF 3, min.insync.replicas 2), with the cluster's fault kinds
# (partition leaders, the transaction coordinator, a broker during plan, two brokers at once), 6 partitions.
chaos-cluster: jars
	$(PY) -m tests.chaos.harness --cluster --partitions 6 --records 100000 --rounds 3

# A three-broker cluster in the foreground (Ctrl-C stops it), to point a pipeline at by hand.
cluster: jars
	$(PY) -m microbatch.dev.stack cluster

SEED ?=
soak: jars
	$(PY) -m tests.chaos.soak --iterations 50 $(if $(SEED),--seed $(SEED),)

clean: down
	$(PY) -m microbatch.dev.stack clean
