"""Lake table evolution (ADR 0071): the versions of each table's columns past the spec, and how a
table is brought to the code's version in place.

Version 1 of every table is the spec (`docs/spec/delta-tables.txt`, declared in `tables.py`).
Each later version is a `Step` that adds nullable columns, which delta-rs does in place with one
metadata commit (`DeltaTable.alter.add_columns`): no data file is rewritten, and the protocol
stays where it is (reader 1, writer 2 for these tables, measured with deltalake 1.6.6), so every
engine that read the table before still reads it. A change that is not the addition of a
nullable column (a rename, a drop, a type change, a non-nullable column) is not a step: a rename
or drop needs column mapping (protocol reader 2 / writer 5, which some readers refuse) or a
rewrite, and would be decided on its own.

A table's version is read from its columns (the spec's plus the leading steps whose columns it
holds all of), so bringing a table forward is idempotent and needs no record of its own beside
the Delta log. The writer brings a table forward before it writes to it (`ready_to_write`), and
creates new tables at the code's version; `oml-lake lake upgrade` brings every table of every
tenant forward at once. The writer also writes correctly to a table *ahead* of it (a newer
code's nullable column it does not know, during a rolling upgrade): an append fills the column
with NULL, a MERGE leaves it as the table holds it (delta-rs's update-all sets only the source's
columns). A column ahead that is not nullable cannot be filled, and is refused
(`TableSchemaAhead`).

No step ships: the shipped tables hold exactly the spec's columns. A test defines its own
version through `STEPS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.schema import Field

from oml_dagster.lake.errors import LakeError
from oml_dagster.lake.model.tables import TableSpec

SPEC_VERSION = 1


class TableSchemaAhead(LakeError):
    """A table holds a column this code does not know and cannot fill (not nullable)."""


@dataclass(frozen=True)
class Step:
    """Version `version` of the tables named `tables` (TableSpec names: "silver.claims",
    "gold.curated"): the nullable columns `add`, in place."""

    version: int
    tables: tuple[str, ...]
    add: tuple[pa.Field, ...]

    def __post_init__(self) -> None:
        if self.version <= SPEC_VERSION:
            raise ValueError(f"a step's version is above the spec's ({SPEC_VERSION}): {self}")
        if not self.add or any(not f.nullable for f in self.add):
            raise ValueError(f"a step adds nullable columns only: {self}")


# The code's versions past the spec, in order of version. None ship yet (see the module's
# docstring).
STEPS: tuple[Step, ...] = ()


def steps_for(spec: TableSpec, steps: Sequence[Step] | None = None) -> list[Step]:
    """The steps of `spec`'s table, in order, numbered 2, 3, ... without a gap."""
    found = sorted(
        (s for s in (STEPS if steps is None else steps) if spec.name in s.tables),
        key=lambda s: s.version,
    )
    versions = [s.version for s in found]
    if versions != list(range(SPEC_VERSION + 1, SPEC_VERSION + 1 + len(found))):
        raise ValueError(f"{spec.name}: step versions are not 2..n without a gap: {versions}")
    return found


def code_version(spec: TableSpec, steps: Sequence[Step] | None = None) -> int:
    return SPEC_VERSION + len(steps_for(spec, steps))


def code_schema(spec: TableSpec, steps: Sequence[Step] | None = None) -> pa.Schema:
    """The table's columns at the code's version: the spec's, then each step's."""
    fields = list(spec.schema)
    for step in steps_for(spec, steps):
        fields.extend(step.add)
    return pa.schema(fields)


def _columns(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def table_version(table: DeltaTable, spec: TableSpec, steps: Sequence[Step] | None = None) -> int:
    """The version `table` stands at: the spec's, plus each leading step whose columns it holds."""
    present = set(_columns(table).names)
    version = SPEC_VERSION
    for step in steps_for(spec, steps):
        if not {f.name for f in step.add} <= present:
            break
        version = step.version
    return version


def bring_forward(
    table: DeltaTable, spec: TableSpec, steps: Sequence[Step] | None = None
) -> list[Step]:
    """Apply the steps `table` lacks, one metadata commit each (custom metadata
    `oml.schemaVersion`) on the version the handle stands at, and return them; none when it is
    at the code's version (idempotent). A commit never rebases: a concurrent commit fails it
    with CommitFailedError, so a handle never moves past a version its holder has not seen (the
    writer's skip rule was read on it); the caller reloads and tries again, and finds the columns
    there if the other commit was the same step."""
    applied = []
    for step in steps_for(spec, steps):
        present = set(_columns(table).names)
        missing = [f for f in step.add if f.name not in present]
        if not missing:
            continue
        table.alter.add_columns(
            [Field.from_arrow(f) for f in missing],
            commit_properties=CommitProperties(
                max_commit_retries=0, custom_metadata={"oml.schemaVersion": str(step.version)}
            ),
        )
        applied.append(step)
    return applied


def ready_to_write(
    table: DeltaTable | None,
    spec: TableSpec,
    data: pa.Table,
    *,
    append: bool,
    steps: Sequence[Step] | None = None,
) -> pa.Table:
    """`data` (the spec's columns, as the fold makes them) made right for `table`: a table behind
    the code's version is brought forward first (`bring_forward`); a table being created (None)
    gets the code's version's columns (the steps' as NULL). For an append, every column the table
    holds that `data` lacks (a step's, or a newer code's) is added as NULL, in the table's order.
    A MERGE's source is left as it is: update-all keeps what the table holds in the columns the
    source lacks, insert-all writes NULL there. A column the table holds that is not nullable
    and that `data` lacks is refused."""
    if table is None:
        target = code_schema(spec, steps)
    else:
        bring_forward(table, spec, steps)
        target = _columns(table)
    lacking = [f for f in target if f.name not in data.schema.names]
    refused = [f.name for f in lacking if not f.nullable]
    if refused:
        raise TableSchemaAhead(
            f"{spec.name} holds column(s) {', '.join(refused)} that this code does not know and "
            "cannot fill (not nullable): a newer release's table (run that release) or not this "
            "table at all"
        )
    if not lacking or (table is not None and not append):
        return data
    for f in lacking:
        data = data.append_column(f, pa.nulls(data.num_rows, f.type))
    return data.select(target.names)
