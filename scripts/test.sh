#!/usr/bin/env bash
# Set up a virtualenv from scratch (if needed) and run the whole test suite.
# Needs PostgreSQL reachable at $OML_TEST_PG_DSN (default: postgres@127.0.0.1:5432, trust auth).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${OML_VENV:-.venv}"
# The UI test drives headless Chromium (Debian's package). Install it when missing and we can;
# OML_SKIP_BROWSER_INSTALL=1 skips this (the UI test then skips, saying why).
if [ -z "${OML_SKIP_BROWSER_INSTALL:-}" ] && ! command -v chromium >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# The alert rules' unit tests run Debian's promtool (package `prometheus`), installed the same way
# (OML_SKIP_PROMTOOL_INSTALL=1 skips this; the rule tests then skip, saying why).
if [ -z "${OML_SKIP_PROMTOOL_INSTALL:-}" ] && ! command -v promtool >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The image's exact pins constrain the suite's install, so the tests run the versions that ship
# (a new release on the index cannot change what is tested without a change here).
"$VENV/bin/python" -m pip install -q -c deploy/docker/requirements.txt -e ".[test]"
"$VENV/bin/python" -m pip check
"$VENV/bin/ruff" check oml_dagster oml_dagster_tests oml_testbed bench deploy
"$VENV/bin/ruff" format --check --quiet oml_dagster oml_dagster_tests oml_testbed bench deploy
# Types (pyproject.toml [tool.mypy]): strict on the core, the standard rules elsewhere.
"$VENV/bin/mypy"
export PATH="$PWD/$VENV/bin:$PATH"
# Two workers by default (the suite waits on subprocesses, daemons and sleeps as much as it
# computes); OML_TEST_WORKERS=0 runs it in one process.
exec "$VENV/bin/python" -m pytest -n "${OML_TEST_WORKERS:-2}" "$@"
