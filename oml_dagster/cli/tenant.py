"""`oml-lake tenant {export,verify-export,purge,receipt}`: a tenant's departure from the command
line (DESIGN "A tenant's departure"; ADR 0075, 0076). The core does the work
(`oml_dagster.lake.audit.export`, `.purge`); this prints what it did, as one JSON object where
the command's result is a record (a manifest's summary, a check, a receipt)."""

from __future__ import annotations

import argparse
import getpass
import json

from oml_dagster import from_settings
from oml_dagster.lake.audit import export, purge
from oml_dagster.lake.errors import UnknownTenant
from oml_dagster.lake.faults import EXIT_FINDINGS, EXIT_OK
from oml_dagster.lake.policy import resolve_tenants
from oml_dagster.lake.queries import tenant_text

from .output import out as _print


def _tenant_id(text: str) -> str:
    try:
        return tenant_text(text)
    except ValueError as error:
        raise UnknownTenant(str(error)) from None


def cmd_export(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    target = from_settings.export_target(args.to)
    with from_settings.connect() as conn:
        (tenant_id,) = resolve_tenants(conn, [args.tenant])
        result = export.export_tenant(conn, lake, tenant_id, target)
    manifest = result.manifest
    _print(
        json.dumps(
            {
                "tenant_id": tenant_id,
                "to": target.root,
                "resumed": result.resumed,
                "written": result.written,
                "exported_at": manifest["exported_at"],
                "journal_head": manifest["journal_head"],
                "tables": {t["name"]: t["rows"] for t in manifest["tables"]},
                "files": sum(len(t["files"]) for t in manifest["tables"]),
            }
        )
    )
    return EXIT_OK


def cmd_verify_export(args: argparse.Namespace) -> int:
    check = export.verify_export(from_settings.export_target(args.uri))
    if args.json:
        _print(json.dumps(check.as_dict()))
    else:
        _print(
            f"export {check.target} of tenant {check.tenant_id}: "
            f"{'verifies' if check.ok else 'FINDINGS'} ({check.tables} tables, {check.files} "
            f"files, {check.rows} rows, journal head {check.journal_head})"
        )
        for line in check.findings:
            _print(f"  {line}")
    return EXIT_OK if check.ok else EXIT_FINDINGS


def cmd_purge(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    tenant_id = _tenant_id(args.tenant)
    with from_settings.connect() as conn:
        made = purge.purge_tenant(conn, lake, tenant_id, by=args.by)
    _print(json.dumps(made))
    return EXIT_OK


def cmd_receipt(args: argparse.Namespace) -> int:
    tenant_id = _tenant_id(args.tenant)
    with from_settings.connect() as conn:
        made = purge.receipt(conn, tenant_id)
    if made is None:
        raise UnknownTenant(f"tenant {tenant_id} has no purge receipt (not purged, or not yet)")
    _print(json.dumps(made))
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tenant` to the `oml-lake` command line."""
    tenant = subparsers.add_parser(
        "tenant", help="a tenant's departure: export, verify-export, purge, receipt"
    ).add_subparsers(dest="tenant_command", required=True)
    ex = tenant.add_parser(
        "export", help="the tenant's live tables as fresh Delta tables with a manifest"
    )
    ex.add_argument("--tenant", required=True)
    ex.add_argument("--to", required=True, help="an empty local path or s3:// prefix")
    ex.set_defaults(func=cmd_export)
    ve = tenant.add_parser("verify-export", help="an export against its manifest and its chain")
    ve.add_argument("uri")
    ve.add_argument("--json", action="store_true", help="one JSON object")
    ve.set_defaults(func=cmd_verify_export)
    pu = tenant.add_parser("purge", help="remove a departed tenant's prefix and records")
    pu.add_argument("--tenant", required=True)
    pu.add_argument("--by", default=getpass.getuser(), help="who purges (recorded)")
    pu.set_defaults(func=cmd_purge)
    rc = tenant.add_parser("receipt", help="a purged tenant's receipt, as JSON")
    rc.add_argument("--tenant", required=True)
    rc.set_defaults(func=cmd_receipt)
