#!/usr/bin/env bash
# Set up a virtualenv from scratch (if needed) and run the whole test suite.
# Needs PostgreSQL reachable at $OML_TEST_PG_DSN (default: postgres@127.0.0.1:5432, trust auth).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${OML_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -m pip check
"$VENV/bin/ruff" check oml_dagster oml_dagster_tests bench
export PATH="$PWD/$VENV/bin:$PATH"
exec "$VENV/bin/python" -m pytest "$@"
