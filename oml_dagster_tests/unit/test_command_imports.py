"""A command pays only for the libraries it uses (issue 35): the drain, the cut and the
operator's commands start without DuckDB (the analytics commands), botocore (the S3 probe) or
the simulator's producer, each a tenth of a second or more of every start."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("duckdb", "botocore", "oml_dagster.simulate.runner", "oml_dagster.lake.analytics")


def _loaded_after(argv: list[str], then: str = "") -> set[str]:
    """The modules of HEAVY loaded in a fresh interpreter once `oml-lake <argv>`'s parser ran
    (`--help` exits) and the statement `then` after it."""
    probe = (
        "import json, sys\n"
        "from oml_dagster import cli\n"
        f"sys.argv = ['oml-lake', *{argv!r}]\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"{then}\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_drain_starts_without_duckdb_botocore_or_the_simulator():
    assert _loaded_after(["drain", "--help"]) == set()


def test_the_analytics_command_still_loads_duckdb_when_it_runs():
    # The lazy import is taken by the command that needs it: parsing an instant argument of
    # `areas-at` goes through the analytics module.
    assert "duckdb" not in _loaded_after(["areas-at", "--help"])
    then = "from oml_dagster.cli import analytics; analytics._instant_arg('2026-12-01T00:00:00Z')"
    assert {"duckdb", "oml_dagster.lake.analytics"} <= _loaded_after(["areas-at", "--help"], then)
