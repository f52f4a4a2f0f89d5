#!/usr/bin/env bash
# Entrypoint of the Airflow containers in docker-compose.yaml: install a JDK (its javac compiles the formats jar)
# and the project's pinned requirements once per container, then run the given Airflow command through
# spark-entrypoint.sh, which gives the stage's spark-submit the cluster's secret (never on its command line).
set -euo pipefail
if [ ! -f /tmp/.microbatch-installed ]; then
  command -v javac >/dev/null || (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null)
  pip install -q -r /opt/microbatch/requirements.txt
  pip install -q --no-deps -e /opt/microbatch
  touch /tmp/.microbatch-installed
fi
exec /opt/microbatch/include/docker/spark-entrypoint.sh "$@"
