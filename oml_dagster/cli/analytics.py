"""`oml-lake sql` and `oml-lake areas-at`: the lake analytics of `oml_dagster.lake.analytics`
from the command line.

`sql --tenant T ["QUERY"]` runs read-only SQL over the tenant's tables as views (`bronze_events`,
`silver_claims`, `gold_lineage`, `gold_areas`, `curated_<workarea_id with '-' as '_'>`): one-shot
with a query, else the queries read from stdin, interactively on a terminal (end a query with
';'). Writes, settings and reads outside the tenant are refused (exit 2). Output is an aligned
table, or `--json` (binary columns as base64: ciphertext stays ciphertext).

`areas-at --tenant T [--date D]` replays the tenant's journalled area events from bronze up to
the instant D (a date means the end of that UTC day; default: now) and prints the tree. At the
present it is checked against gold.areas (exit 1 on any difference). With Postgres reachable
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
from oml_dagster.lake.policy import resolve_tenants
from oml_dagster.settings import PG_DSN

from .output import out as _print

if TYPE_CHECKING:
    from oml_dagster.lake import analytics


def _tenant(text: str) -> str:
    """Tenant ids are UUIDs; anything else (a path, say) never reaches the lake's layout."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"tenant {text!r} is not a UUID") from None


def _instant_arg(text: str) -> dt.datetime:
    from oml_dagster.lake import analytics  # DuckDB: paid for by these commands alone

    try:
        return analytics.parse_instant(text)
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


def _run_one(tc: analytics.TenantConnection, sql: str, as_json: bool) -> int:
    import duckdb

    from oml_dagster.lake import analytics  # DuckDB: paid for by these commands alone

    try:
        columns, rows = analytics.run_query(tc, sql)
    except analytics.RefusedQuery as refused:
        print(f"oml-lake sql: refused: {refused.reason}", file=sys.stderr)
        return 2
    except duckdb.Error as error:
        print(f"oml-lake sql: {error}", file=sys.stderr)
        return 1
    _emit(columns, rows, as_json)
    return 0


def _interactive(tc: analytics.TenantConnection, as_json: bool) -> int:
    _print(f"tenant {tc.tenant_id}: views {', '.join(sorted(tc.views))}")
    _print("read-only SQL; end a query with ';', quit with Ctrl-D")
    buffer: list[str] = []
    worst = 0
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
    from oml_dagster.lake import analytics  # DuckDB: paid for by these commands alone

    lake = from_settings.lake()
    _known(args.tenant)
    with analytics.tenant_connection(lake, args.tenant, lockdown=True) as tc:
        if not any(v.uri for v in tc.views.values()):
            print(
                f"oml-lake sql: tenant {args.tenant} has no lake tables under {lake.root}",
                file=sys.stderr,
            )
            return 1
        if args.query:
            return _run_one(tc, args.query, args.json)
        if sys.stdin.isatty():
            return _interactive(tc, args.json)
        return _run_one(tc, sys.stdin.read(), args.json)


def _tree_rows(areas: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(areas.values(), key=lambda a: (a["path"] or "", a["workarea_id"]))


def cmd_areas_at(args: argparse.Namespace) -> int:
    from oml_dagster.lake import analytics  # DuckDB: paid for by these commands alone

    lake = from_settings.lake()
    refused: frozenset[int] = frozenset()
    if PG_DSN.is_set():
        try:
            with from_settings.connect() as conn:
                resolve_tenants(conn, [args.tenant])
                refused = analytics.refused_area_acts(conn, args.tenant)
        except psycopg.Error as error:
            print(
                f"oml-lake areas-at: Postgres unreachable ({error}); bronze alone", file=sys.stderr
            )
    with analytics.tenant_connection(lake, args.tenant) as tc:
        if not tc.views["bronze_events"].uri:
            # No journal to replay: a lost lake (or one never drained), never an empty tree that
            # "matches" an empty gold.areas.
            print(
                f"oml-lake areas-at: tenant {args.tenant} has no bronze.events under {lake.root} "
                "(a lost lake, or one not drained yet: backfill or drain the tenant)",
                file=sys.stderr,
            )
            return 1
        events = analytics.area_events(tc)
        replay = analytics.replay_areas(events, args.date, refused)
        latest = max((analytics.event_instant(e) for e in events), default=None)
        present = args.date is None or latest is None or args.date >= latest
        differences = (
            analytics.area_differences(replay.areas, analytics.gold_areas(tc)) if present else []
        )
    rows = _tree_rows(replay.areas)
    as_of = args.date.isoformat() if args.date else "now"
    if args.json:
        _print(
            json.dumps(
                {
                    "tenant_id": args.tenant,
                    "as_of": as_of,
                    "events_applied": replay.events_applied,
                    "last_journal_seq": replay.last_journal_seq,
                    "skipped": [{"journal_seq": s, "reason": r} for s, r in replay.skipped],
                    "checked_against_gold_areas": present,
                    "differences": differences,
                    "areas": [_json_value(r) for r in rows],
                }
            )
        )
    else:
        _print(
            f"tenant {args.tenant} workarea tree as of {as_of}: {len(rows)} nodes from "
            f"{replay.events_applied} area events"
            + (
                f" (through journal_seq {replay.last_journal_seq})"
                if replay.last_journal_seq is not None
                else ""
            )
        )
        columns = ["path", "workarea_id", "status", "parent_id", "crew_name", "updated_at"]
        _print(format_table(columns, [tuple(r[c] for c in columns) for r in rows]))
        for seq, reason in replay.skipped:
            _print(f"skipped journal_seq {seq}: {reason}")
        if present:
            if differences:
                _print(f"differs from gold.areas in {len(differences)} places:")
                for line in differences:
                    _print(f"  {line}")
            else:
                _print(f"matches gold.areas ({len(rows)} nodes)")
    return 1 if differences else 0


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
