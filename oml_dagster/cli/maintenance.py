"""`oml-lake maintain {compact,zorder,checkpoint,vacuum,all} [--tenant T ...]`: the maintenance of
`oml_dagster.lake.store.maintenance` from the command line, printing what each table had rewritten,
removed and kept. Without --tenant it runs for every tenant the sequencer or the policy table
knows. Run it only where no drain of the same tenant runs at the same time (the Dagster jobs
get that from the per-tenant run limit)."""

from __future__ import annotations

import argparse

from oml_dagster import from_settings
from oml_dagster.lake.audit.doctor import lost_tables
from oml_dagster.lake.faults import EXIT_FINDINGS, EXIT_OK
from oml_dagster.lake.policy import resolve_tenants
from oml_dagster.lake.store import maintenance

from .output import out as _print


def cmd_maintain(args: argparse.Namespace) -> int:
    """Exit 1 when a tenant's lake (or a table of it) that the frontier says exists is missing:
    nothing to maintain there is a finding, not a success."""
    lake = from_settings.lake()
    found = False
    with from_settings.connect() as conn:
        tenants = resolve_tenants(conn, args.tenant)
        if not tenants:
            _print("no tenants")
        for tenant_id in tenants:
            results = maintenance.maintain(
                conn, lake, tenant_id, task=args.task, target_size=args.target_size
            )
            lost = lost_tables(conn, lake, tenant_id)
            if lost:
                found = True
                _print(
                    f"tenant {tenant_id}: FINDING {len(lost)} tables the frontier records are "
                    f"missing under {lake.root} ({', '.join(lost)}): a lost lake, backfill the "
                    "tenant"
                )
            if not results:
                if not lost:
                    _print(f"tenant {tenant_id}: no lake tables (nothing drained yet)")
                continue
            for result in results:
                _print(f"tenant {tenant_id} {result.describe()}")
            sums = maintenance.totals(results)
            _print(
                f"tenant {tenant_id} {args.task}: {sums['changed']} changes over "
                f"{sums['tables']} tables, {sums['files_removed']} files removed "
                f"({sums['bytes_removed']} bytes), {sums['commits']} commits, "
                f"{sums['duration_seconds']:.2f}s"
            )
    return EXIT_FINDINGS if found else EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `maintain` to the `oml-lake` command line."""
    parser = subparsers.add_parser(
        "maintain",
        help="OPTIMIZE, Z-order, checkpoint, VACUUM and log cleanup of tenants' tables",
        description=__doc__,
    )
    parser.add_argument(
        "task",
        choices=list(maintenance.TASKS),
        help="vacuum = checkpoint + VACUUM + log cleanup; all = every step",
    )
    parser.add_argument("--tenant", action="append", help="this tenant only (repeatable)")
    parser.add_argument(
        "--target-size",
        type=int,
        default=None,
        help="OPTIMIZE target file size in bytes (default: the table's, else delta-rs's)",
    )
    parser.set_defaults(func=cmd_maintain)
