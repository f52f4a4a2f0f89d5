#!/usr/bin/env bash
# Entrypoint of every container that runs Spark in docker-compose.yaml (master, worker, Connect server, and the
# Airflow containers, whose stage task runs spark-submit): write spark.authenticate, RPC encryption and the
# cluster's shared secret into an owner-only spark-defaults.conf, then run the given command. The secret comes
# from SPARK_AUTH_SECRET and never reaches a command line (printf is a shell builtin); every Spark process of
# the container reads it through SPARK_CONF_DIR, and executors get it from their worker, not from arguments.
set -euo pipefail
: "${SPARK_AUTH_SECRET:?is not set: run include/docker/make-env.sh (see docs/running-for-real.md)}"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-/tmp/spark-conf}"
umask 077
mkdir -p "$SPARK_CONF_DIR"
printf 'spark.authenticate true\nspark.network.crypto.enabled true\nspark.authenticate.secret %s\n' \
  "$SPARK_AUTH_SECRET" > "$SPARK_CONF_DIR/spark-defaults.conf"
unset SPARK_AUTH_SECRET
umask 022
exec "$@"
