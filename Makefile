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

.PHONY: demo test unit integration e2e lint jars venv airflow connect registry down bench chaos chaos-cluster cluster soak clean browser prometheus docs docs-generate

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

test: jars browser prometheus docs
	$(PY) -m ruff check .
	rm -rf .cache/test-report && mkdir -p .cache/test-report
	MICROBATCH_FIXTURE_REPORT=.cache/test-report/fixtures.json $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal --timeout=900 --durations=0 --junitxml=.cache/test-report/junit.xml tests $(PYTEST_ARGS) | tee .cache/test-report/pytest.log; status=$${PIPESTATUS[0]}; \
		$(PY) tests/durations.py .cache/test-report --top 15 || true; exit $$status

# Debian's chromium, for the browser test of the ledger page (Playwright drives it; no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# Debian's Prometheus server, which the metrics test starts on loopback to scrape `microbatch metrics`.
prometheus:
	command -v prometheus >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus)

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
