#!/usr/bin/env bash
# The lake-writer in the Dagster UI, from a fresh machine, in one command:
#
#   deploy/demo.sh
#
# 1. creates .venv and installs the project (pip install -e .);
# 2. finds PostgreSQL ($OML_PG_DSN, else 127.0.0.1:5432, else a throwaway local cluster);
# 3. creates the lake's and Dagster's databases and applies the oml migrations;
# 4. seeds a demo workload and keeps producers streaming (new tenants arrive every few minutes);
# 5. renders DAGSTER_HOME (.oml/demo/dagster_home) from dagster.yaml and starts
#    `dagster dev` on http://127.0.0.1:3000 with the outbox sensor and the schedules running.
#
# Ctrl-C (or SIGTERM) stops Dagster, the producers and a cluster this script started.
# Settings: OML_PG_DSN, OML_LAKE_URI (default .oml/demo/oml-lake), OML_DEMO_PORT (3000),
# OML_SENSOR_INTERVAL_SECONDS (5 here), DAGSTER_MAX_CONCURRENT_RUNS, OML_DEMO_STREAM_SECONDS
# (900), OML_DEMO_SECONDS (stop by itself after that many seconds; unset: run until stopped),
# OML_DEMO_FRESH=1 (drop the demo databases and lake first; never a database OML_PG_DSN names),
# OML_DEMO_THROWAWAY_PG=1 (always use a throwaway cluster, even with a server on 5432).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
STATE="${OML_DEMO_DIR:-$ROOT/.oml/demo}"
VENV="${OML_VENV:-$ROOT/.venv}"
PORT="${OML_DEMO_PORT:-3000}"
mkdir -p "$STATE"

say() { printf 'demo: %s\n' "$*"; }

# --- 1. install ---------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
say "installing the project into $VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e "$ROOT"
export PATH="$VENV/bin:$PATH"
PY="$VENV/bin/python"

# --- 2. PostgreSQL ------------------------------------------------------------------------------
# shellcheck source=deploy/postgres.sh
source "$ROOT/deploy/postgres.sh"
ensure_postgres

PIDS=()
DAGSTER_PID=""
descendants() {  # every process below $1, children first
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$DAGSTER_PID" ] && kill -0 "$DAGSTER_PID" 2>/dev/null; then
    say "stopping Dagster and the runs in flight (they show as interrupted)"
    # Runs in flight (a standing shard run lasts up to OML_SHARD_RUN_SECONDS) are processes of
    # the code server, which outlive `dagster dev`: they are stopped with it.
    below=$(descendants "$DAGSTER_PID")
    kill -INT "$DAGSTER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$DAGSTER_PID" 2>/dev/null || break; sleep 1; done
    kill -TERM "$DAGSTER_PID" 2>/dev/null || true
    wait "$DAGSTER_PID" 2>/dev/null || true
    below="$below $(for pid in $below; do descendants "$pid"; done)"
    for pid in $below; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 15); do
      alive=""
      for pid in $below; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
      [ -z "$alive" ] && break
      sleep 1
    done
    for pid in $alive; do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  # The background helpers and what they started (OML_DEMO_SECONDS' timer is a subshell whose
  # `sleep` would otherwise outlive the demo).
  for pid in "${PIDS[@]}"; do
    for child in $(descendants "$pid"); do kill -TERM "$child" 2>/dev/null || true; done
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  stop_postgres
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 3. databases and migrations ----------------------------------------------------------------
db_args=()
[ -n "${OML_PG_DSN:-}" ] && db_args+=(--use-admin-db)
if [ "${OML_DEMO_FRESH:-}" = 1 ]; then
  db_args+=(--fresh)
  rm -rf "$STATE/oml-lake" "$STATE/dagster_home"
fi
exports=$("$PY" "$ROOT/deploy/databases.py" "$OML_ADMIN_DSN" "${db_args[@]}")
eval "$exports"
export OML_LAKE_URI="${OML_LAKE_URI:-$STATE/oml-lake}"
say "lake database: $OML_PG_DSN; Dagster storage: database $DAGSTER_PG_DB; lake: $OML_LAKE_URI"
# The migrations as the tables' owner, then the writer's own login role (row-level security, ADR
# 0049): Dagster drains as that role, the simulated producers write as the owner. Its password
# is OML_WRITER_PASSWORD's when set (a server that asks for one), none otherwise.
WRITER_ROLE="${OML_DEMO_WRITER_ROLE:-oml_demo_writer}"
oml-lake db upgrade --writer-role "$WRITER_ROLE"
OWNER_DSN="$OML_PG_DSN"
WRITER_DSN=$("$PY" -c 'import os, sys
from oml_dagster.lake.db import dsn_as
print(dsn_as(sys.argv[1], sys.argv[2], os.environ.get("OML_WRITER_PASSWORD")))' "$OWNER_DSN" "$WRITER_ROLE")

# --- 4. a workload ------------------------------------------------------------------------------
STREAM_SECONDS="${OML_DEMO_STREAM_SECONDS:-900}"
say "seeding: 3 tenants"
OML_PG_DSN="$OWNER_DSN" oml-lake simulate --tenants 3 --claims 40 --seed "$RANDOM" \
  --bad-ratio 0.02 --no-progress >"$STATE/seed.log"
head -1 "$STATE/seed.log"
(
  # New tenants keep arriving, each a paced stream; stopping this loop stops them all.
  trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
  end=$((SECONDS + STREAM_SECONDS))
  while [ "$SECONDS" -lt "$end" ]; do
    OML_PG_DSN="$OWNER_DSN" oml-lake simulate --tenants 1 --claims 300 --seed "$RANDOM" \
      --bad-ratio 0.02 --rate 8 --duration "$((end - SECONDS))" --no-progress >>"$STATE/producer.log" 2>&1 &
    sleep 120 &
    wait $!
  done
  wait
) &
PIDS+=($!)

# --- 5. Dagster ---------------------------------------------------------------------------------
export OML_PG_DSN="$WRITER_DSN"
export DAGSTER_HOME="$STATE/dagster_home"
"$ROOT/deploy/dagster_home.sh" "$DAGSTER_HOME" >/dev/null
export OML_DAGSTER_AUTOSTART=1
export OML_SENSOR_INTERVAL_SECONDS="${OML_SENSOR_INTERVAL_SECONDS:-5}"
export OML_RECONCILE_CRON="${OML_RECONCILE_CRON:-*/5 * * * *}"

say "starting Dagster on http://127.0.0.1:$PORT (Ctrl-C stops everything)"
say "  Lineage: postgres/outbox -> bronze/silver -> gold, one partition per tenant"
say "  Automation: outbox_sensor (every ${OML_SENSOR_INTERVAL_SECONDS}s), reconcile_schedule"
# A shell started in the background ignores SIGINT, and `dagster dev` then ignores SIGTERM too:
# reset SIGINT to its default before exec so both stop it.
# It runs from $STATE so the repository's own dagster.yaml is not mistaken for DAGSTER_HOME's.
(cd "$STATE" && exec "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
  dagster dev -h 127.0.0.1 -p "$PORT" -w "$ROOT/workspace.yaml") &
DAGSTER_PID=$!

if [ -n "${OML_DEMO_SECONDS:-}" ]; then
  (sleep "$OML_DEMO_SECONDS" && kill -TERM $$ 2>/dev/null) &
  PIDS+=($!)
fi
wait "$DAGSTER_PID"
