"""OML lake-writer: the single writer of the per-tenant Delta Lake, as a Dagster code location.

`oml_dagster.lake` is the core (plain Python, no Dagster); `oml_dagster.defs` is the thin
Dagster layer over it; `oml_dagster.cli` is the `oml-lake` command.
"""
