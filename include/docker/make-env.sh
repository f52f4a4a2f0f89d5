#!/usr/bin/env bash
# Writes the secrets docker-compose.yaml requires into .env (next to it, git-ignored, mode 600), each a fresh
# random value; a value already in .env is kept, so running it again never changes a password a volume holds.
# Usage: include/docker/make-env.sh [ENV_FILE]     (docs/running-for-real.md)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
env_file="${1:-$root/.env}"

random() {  # 40 characters of [A-Za-z0-9]: safe inside URLs, SQL literals and JAAS strings
  local value=""
  while [ "${#value}" -lt 40 ]; do
    value+="$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')"
  done
  printf '%s' "${value:0:40}"
}

fernet_key() {  # what Airflow's fernet_key must be: 32 random bytes, URL-safe base64
  head -c 32 /dev/urandom | base64 | tr '+/' '-_'
}

umask 077
touch "$env_file"
chmod 600 "$env_file"
added=0
for name in POSTGRES_PASSWORD AIRFLOW_DB_PASSWORD MICROBATCH_DB_PASSWORD AIRFLOW_JWT_SECRET AIRFLOW_API_SECRET_KEY \
            AIRFLOW_FERNET_KEY SPARK_AUTH_SECRET SPARK_CONNECT_TOKEN KAFKA_SASL_PASSWORD; do
  if grep -q "^${name}=" "$env_file"; then
    continue
  fi
  if [ "$name" = AIRFLOW_FERNET_KEY ]; then value="$(fernet_key)"; else value="$(random)"; fi
  printf '%s=%s\n' "$name" "$value" >> "$env_file"
  added=$((added + 1))
done
echo "$env_file: $added secret(s) added, the others kept (mode 600; never commit it)"
