"""A command pays only for the libraries it uses: the drain, the cut and the
operator's commands start without DuckDB (the analytics commands), botocore (the S3 probe) or
the simulator's producer, each a tenth of a second or more of every start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("duckdb", "botocore", "oml_dagster.simulate.runner", "oml_dagster.lake.analytics")


def _loaded_after(argv: list[str], **env: str) -> set[str]:
    """The modules of HEAVY loaded in a fresh interpreter once `oml-lake <argv>` ran (or its
    parser exited), with `env` over a copy of this environment without OML_PG_DSN."""
    probe = (
        "import json, sys\n"
        "from oml_dagster import cli\n"
        f"sys.argv = ['oml-lake', *{argv!r}]\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "OML_PG_DSN"} | env
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=environment,
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_drain_starts_without_duckdb_botocore_or_the_simulator():
    assert _loaded_after(["drain", "--help"]) == set()


def test_the_analytics_command_still_loads_duckdb_when_it_runs(tmp_path):
    # The lazy import is taken by the command that needs it: `sql` opens a DuckDB connection
    # (over an empty lake here: it then says the tenant has no tables).
    assert "duckdb" not in _loaded_after(["sql", "--help"])
    tenant = "00000000-0000-4000-8000-000000000001"
    ran = _loaded_after(["sql", "--tenant", tenant, "SELECT 1"], OML_LAKE_URI=str(tmp_path))
    assert {"duckdb", "oml_dagster.lake.analytics"} <= ran
