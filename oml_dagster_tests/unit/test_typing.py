"""The package ships its types (`py.typed`, PEP 561) and the type checker's configuration holds
the core to mypy's strict flags."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STRICT = {
    "warn_unused_ignores",
    "warn_return_any",
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_package_ships_py_typed():
    assert (REPO / "oml_dagster" / "py.typed").is_file()
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["oml_dagster"]


def test_the_core_is_checked_with_every_strict_flag():
    mypy = _pyproject()["tool"]["mypy"]
    (core,) = [o for o in mypy["overrides"] if o["module"] == ["oml_dagster.lake.*"]]
    assert {flag for flag, on in core.items() if on is True} == STRICT
    assert "oml_dagster" in mypy["files"]
