"""Unit tests: they need neither PostgreSQL nor Dagster nor a Delta table on disk, and run from a
plain `pytest oml_dagster_tests/unit` (no server, about 15 seconds)."""
