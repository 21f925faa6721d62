"""The decision index (docs/decisions/README.md) names every note in docs/decisions/, and nothing else.

Plain file reads: no PostgreSQL, no Dagster, no conftest fixtures (runs under `--noconftest`).
"""

from __future__ import annotations

import re
from pathlib import Path

DECISIONS = Path(__file__).resolve().parents[2] / "docs" / "decisions"
ROW = re.compile(r"^\|\s*(\d{4})\s*\|.*\]\(([^)]+)\)")


def _notes() -> set[str]:
    return {p.name for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")}


def _rows() -> dict[str, str]:
    """File named by each row of the index, by the row's number."""
    rows: dict[str, str] = {}
    for line in (DECISIONS / "README.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(2)] = match.group(1)
    return rows


def test_every_note_has_a_row() -> None:
    missing = sorted(_notes() - set(_rows()))
    assert not missing, f"docs/decisions/README.md has no row for {missing}: add one"


def test_every_row_names_a_note_that_exists() -> None:
    dangling = sorted(set(_rows()) - _notes())
    assert not dangling, f"docs/decisions/README.md names notes that do not exist: {dangling}"


def test_each_row_number_is_its_file_s_number() -> None:
    wrong = sorted(name for name, number in _rows().items() if not name.startswith(number + "-"))
    assert not wrong, f"rows whose number differs from their file's: {wrong}"
