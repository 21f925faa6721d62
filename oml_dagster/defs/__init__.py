"""The Dagster layer: thin definitions over the `oml_dagster.lake` core, one module per concern."""
