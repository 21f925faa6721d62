"""`python -m oml_dagster.cli`: the `oml-lake` command."""

from oml_dagster.cli import entry

entry()
