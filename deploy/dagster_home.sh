#!/usr/bin/env bash
# Render a DAGSTER_HOME from the repository's dagster.yaml.
#
#   deploy/dagster_home.sh DIR
#
# DAGSTER_MAX_CONCURRENT_RUNS, when set, replaces the global cap on runs in progress
# (`concurrency: runs: max_concurrent_runs`, which Dagster reads as a plain number). Storage
# settings stay environment references (DAGSTER_PG_*), resolved by each Dagster process.
set -euo pipefail
home="${1:?usage: deploy/dagster_home.sh DIR}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$home"
max="${DAGSTER_MAX_CONCURRENT_RUNS:-}"
if [ -n "$max" ]; then
  case "$max" in
    -1|[0-9]|[0-9][0-9]|[0-9][0-9][0-9]) ;;
    *) echo "DAGSTER_MAX_CONCURRENT_RUNS must be a number (-1: no limit)" >&2; exit 2 ;;
  esac
  sed -E "s/^(    max_concurrent_runs:) [0-9-]+/\1 $max/" "$repo/dagster.yaml" >"$home/dagster.yaml"
else
  cp "$repo/dagster.yaml" "$home/dagster.yaml"
fi
echo "$home/dagster.yaml"
