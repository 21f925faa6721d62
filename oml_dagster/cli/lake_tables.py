"""`oml-lake lake upgrade [--tenant T ...]`: every existing table of each tenant brought to the
code's version of its columns (`oml_dagster.lake.model.evolution`, ADR 0071), printing each
table's version before and after. Idempotent: a table already there gets no commit. The writer
brings a table forward itself before it next writes to it; this command does it now for every
table (for readers that expect the new columns before the tenant's next batch). Safe beside a
running drain: a step's commit never rebases onto another commit, and one that meets a
concurrent commit is tried again on the reloaded table."""

from __future__ import annotations

import argparse

from deltalake.exceptions import CommitFailedError

from oml_dagster import from_settings
from oml_dagster.lake.errors import ConflictingCommit
from oml_dagster.lake.faults import EXIT_OK
from oml_dagster.lake.model import evolution
from oml_dagster.lake.model.tables import TableSpec
from oml_dagster.lake.policy import resolve_tenants
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables

from .output import out as _print

ATTEMPTS = 5  # tries per table against concurrent commits, each on the reloaded table


def upgrade_table(lake: Lake, uri: str, spec: TableSpec) -> tuple[int, int]:
    """(version before, version after) of the table at `uri`, brought forward."""
    for _ in range(ATTEMPTS):
        table = lake.open(uri)
        if table is None:
            raise ConflictingCommit(f"{uri} went away while being upgraded")
        before = evolution.table_version(table, spec)
        try:
            evolution.bring_forward(table, spec)
        except CommitFailedError:
            continue
        return before, evolution.table_version(table, spec)
    raise ConflictingCommit(
        f"{uri}: every one of {ATTEMPTS} tries met a concurrent commit; rerun `oml-lake lake upgrade`"
    )


def cmd_lake_upgrade(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    with from_settings.connect() as conn:
        tenants = resolve_tenants(conn, args.tenant)
    moved = 0
    for tenant_id in tenants:
        for name, spec, uri in tenant_tables(lake, tenant_id):
            before, after = upgrade_table(lake, uri, spec)
            moved += before != after
            state = f"version {before} -> {after}" if before != after else f"at version {after}"
            _print(f"tenant {tenant_id} {name}: {state}")
    _print(
        f"{moved} tables brought forward" if moved else "every lake table is at the code's version"
    )
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `lake upgrade` to the `oml-lake` command line."""
    lake = subparsers.add_parser("lake", help="the lake tables' column versions").add_subparsers(
        dest="lake_command", required=True
    )
    up = lake.add_parser(
        "upgrade",
        help="bring every lake table to the code's version of its columns",
        description=__doc__,
    )
    up.add_argument("--tenant", action="append", help="this tenant only (repeatable)")
    up.set_defaults(func=cmd_lake_upgrade)
