"""`oml-lake maintain {compact,zorder,checkpoint,vacuum,all} [--tenant T ...]`: the maintenance of
`oml_dagster.lake.maintenance` from the command line, printing what each table had rewritten,
removed and kept. Without --tenant it runs for every tenant the sequencer or the policy table
knows. Run it only where no drain of the same tenant runs at the same time (the Dagster jobs
get that from the per-tenant run limit)."""

from __future__ import annotations

import argparse

from .lake import db, maintenance
from .lake.policy import known_tenants
from .lake.storage import Lake


def _print(*parts: object) -> None:
    print(*parts, flush=True)


def cmd_maintain(args: argparse.Namespace) -> int:
    lake = Lake.from_env()
    with db.connect(autocommit=True) as conn:
        tenants = args.tenant or known_tenants(conn)
        if not tenants:
            _print("no tenants")
        for tenant_id in tenants:
            results = maintenance.maintain(
                conn, lake, tenant_id, args.task, target_size=args.target_size
            )
            if not results:
                _print(f"tenant {tenant_id}: no lake tables")
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
    return 0


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
