"""`oml-lake sql` and `oml-lake areas-at`: the lake analytics of `oml_dagster.lake.analytics`
from the command line. DuckDB is imported by these commands alone (lazily, below).

`sql --tenant T ["QUERY"]` runs read-only SQL over the tenant's tables as views (`bronze_events`,
`silver_claims`, `gold_lineage`, `gold_areas`, `curated_<workarea_id with '-' as '_'>`): one-shot
with a query, else the queries read from stdin, interactively on a terminal (end a query with
';'). Writes, settings and reads outside the tenant are refused (exit 2). Output is an aligned
table, or `--json` (binary columns as base64: ciphertext stays ciphertext).

`areas-at --tenant T [--date D]` replays the tenant's journalled area events from bronze up to
the instant D (a date means the end of that UTC day; default: now) through the op catalog's own
rules and prints the tree. At the present (D at or past the latest area act) it is checked
against gold.areas (exit 1 on any difference). With Postgres reachable
(`OML_PG_DSN`), acts whose area ops the writer dead-lettered are left out of the replay, as they
are out of gold.areas.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import sys
import uuid
from typing import TYPE_CHECKING, Any

import psycopg

from oml_dagster import from_settings
from oml_dagster.lake.faults import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from oml_dagster.lake.policy import resolve_tenants
from oml_dagster.settings import PG_DSN

from .output import out as _print

if TYPE_CHECKING:
    from oml_dagster.lake.analytics.areas import AreaReplay
    from oml_dagster.lake.analytics.sandbox import TenantConnection


def _tenant(text: str) -> str:
    """Tenant ids are UUIDs; anything else (a path, say) never reaches the lake's layout."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"tenant {text!r} is not a UUID") from None


def _instant_arg(text: str) -> dt.datetime:
    from oml_dagster.lake.analytics.areas import parse_instant

    try:
        return parse_instant(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    return str(value)


def format_table(columns: list[str], rows: list[tuple]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, rule, *body, f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])


def _emit(columns: list[str], rows: list[tuple], as_json: bool) -> None:
    if as_json:
        _print(
            json.dumps(
                [{c: _json_value(v) for c, v in zip(columns, r, strict=True)} for r in rows],
                indent=None,
            )
        )
    else:
        _print(format_table(columns, rows))


def _run_one(tc: TenantConnection, sql: str, as_json: bool) -> int:
    import duckdb

    from oml_dagster.lake.analytics.guard import RefusedQuery, run_query

    try:
        columns, rows = run_query(tc, sql)
    except RefusedQuery as refused:
        print(f"oml-lake sql: refused: {refused.reason}", file=sys.stderr)
        return EXIT_USAGE
    except duckdb.Error as error:
        print(f"oml-lake sql: {error}", file=sys.stderr)
        return EXIT_FINDINGS
    _emit(columns, rows, as_json)
    return EXIT_OK


def _interactive(tc: TenantConnection, as_json: bool) -> int:
    _print(f"tenant {tc.tenant_id}: views {', '.join(sorted(tc.views))}")
    _print("read-only SQL; end a query with ';', quit with Ctrl-D")
    buffer: list[str] = []
    worst = EXIT_OK
    while True:
        try:
            line = input("oml-lake> " if not buffer else "      ..> ")
        except EOFError:
            _print()
            return worst
        buffer.append(line)
        if line.rstrip().endswith(";"):
            worst = max(worst, _run_one(tc, "\n".join(buffer), as_json))
            buffer = []


def _known(tenant_id: str) -> None:
    """With PostgreSQL configured, refuse a tenant it does not know (exit 2) before reading."""
    if PG_DSN.is_set():
        with from_settings.connect() as conn:
            resolve_tenants(conn, [tenant_id])


def cmd_sql(args: argparse.Namespace) -> int:
    from oml_dagster.lake.analytics.sandbox import tenant_connection

    lake = from_settings.lake()
    _known(args.tenant)
    with tenant_connection(lake, args.tenant, lockdown=True) as tc:
        if not any(v.uri for v in tc.views.values()):
            print(
                f"oml-lake sql: tenant {args.tenant} has no lake tables under {lake.root}",
                file=sys.stderr,
            )
            return EXIT_FINDINGS
        if args.query:
            return _run_one(tc, args.query, args.json)
        if sys.stdin.isatty():
            return _interactive(tc, args.json)
        return _run_one(tc, sys.stdin.read(), args.json)


def _tree_rows(areas: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(areas.values(), key=lambda a: (a["path"] or "", a["workarea_id"]))


def _refused_acts(tenant_id: str) -> frozenset[int]:
    """With PostgreSQL configured: the acts whose area ops the writer dead-lettered (an unknown
    tenant is refused, exit 2); unreachable, the replay goes by bronze alone."""
    from oml_dagster.lake.analytics.areas import refused_area_acts

    if not PG_DSN.is_set():
        return frozenset()
    try:
        with from_settings.connect() as conn:
            resolve_tenants(conn, [tenant_id])
            return refused_area_acts(conn, tenant_id)
    except psycopg.Error as error:
        print(f"oml-lake areas-at: Postgres unreachable ({error}); bronze alone", file=sys.stderr)
        return frozenset()


def cmd_areas_at(args: argparse.Namespace) -> int:
    from oml_dagster.lake.analytics import areas
    from oml_dagster.lake.analytics.sandbox import tenant_connection

    lake = from_settings.lake()
    refused = _refused_acts(args.tenant)
    with tenant_connection(lake, args.tenant) as tc:
        if not tc.views["bronze_events"].uri:
            # No journal to replay: a lost lake (or one never drained), never an empty tree that
            # "matches" an empty gold.areas.
            print(
                f"oml-lake areas-at: tenant {args.tenant} has no bronze.events under {lake.root} "
                "(a lost lake, or one not drained yet: backfill or drain the tenant)",
                file=sys.stderr,
            )
            return EXIT_FINDINGS
        replay = areas.replay_areas(
            args.tenant, areas.area_events(tc), as_of=args.date, refused_journal_seqs=refused
        )
        differences = (
            areas.area_differences(replay.areas, areas.gold_areas(tc)) if replay.at_present else []
        )
    if args.json:
        _print(json.dumps(_areas_document(args.tenant, replay, differences)))
    else:
        _print_areas(args.tenant, replay, differences)
    return EXIT_FINDINGS if differences else EXIT_OK


def _areas_document(tenant_id: str, replay: AreaReplay, differences: list[str]) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "as_of": replay.as_of.isoformat() if replay.as_of else "now",
        "events_applied": replay.events_applied,
        "last_journal_seq": replay.last_journal_seq,
        "skipped": [{"journal_seq": s, "reason": r} for s, r in replay.skipped],
        "checked_against_gold_areas": replay.at_present,
        "differences": differences,
        "areas": [_json_value(r) for r in _tree_rows(replay.areas)],
    }


def _print_areas(tenant_id: str, replay: AreaReplay, differences: list[str]) -> None:
    rows = _tree_rows(replay.areas)
    through = (
        f" (through journal_seq {replay.last_journal_seq})"
        if replay.last_journal_seq is not None
        else ""
    )
    _print(
        f"tenant {tenant_id} workarea tree as of "
        f"{replay.as_of.isoformat() if replay.as_of else 'now'}: {len(rows)} nodes from "
        f"{replay.events_applied} area events{through}"
    )
    columns = ["path", "workarea_id", "status", "parent_id", "crew_name", "updated_at"]
    _print(format_table(columns, [tuple(r[c] for c in columns) for r in rows]))
    for seq, reason in replay.skipped:
        _print(f"skipped journal_seq {seq}: {reason}")
    if not replay.at_present:
        return
    if differences:
        _print(f"differs from gold.areas in {len(differences)} places:")
        for line in differences:
            _print(f"  {line}")
    else:
        _print(f"matches gold.areas ({len(rows)} nodes)")


def register(sub: argparse._SubParsersAction) -> None:
    sq = sub.add_parser("sql", help="read-only SQL over one tenant's lake tables (DuckDB)")
    sq.add_argument("--tenant", required=True, type=_tenant)
    sq.add_argument("query", nargs="?", help="one query; default: read queries from stdin")
    sq.add_argument("--json", action="store_true", help="rows as a JSON array of objects")
    sq.set_defaults(func=cmd_sql)

    at = sub.add_parser("areas-at", help="the workarea tree at a past instant, from bronze")
    at.add_argument("--tenant", required=True, type=_tenant)
    at.add_argument(
        "--date",
        type=_instant_arg,
        help="ISO date (end of that UTC day) or instant; default: now, checked against gold.areas",
    )
    at.add_argument("--json", action="store_true")
    at.set_defaults(func=cmd_areas_at)
