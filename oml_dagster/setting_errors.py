"""The refusal of a setting's value, apart from the settings so that the core can raise and
classify it without importing them (ADR 0052). Imports nothing."""

from __future__ import annotations


class InvalidSetting(ValueError):
    """A setting holds a value it refuses (an environment variable `oml_dagster.settings`
    declares, a run config's field, a tenant's own storage options); the message names the
    variable or source, the value and what was expected."""
