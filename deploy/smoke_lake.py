"""The smoke run's probes of the lake and its authority, run inside the code location image
(deploy/smoke.py mounts this file and runs it with the image's Python and the lake's
environment). Each prints one JSON document on stdout.

    python smoke_lake.py status              every tenant: outbox, frontier and bronze counts
    python smoke_lake.py fingerprint TENANT  every table of the tenant: rows and a digest of them
    python smoke_lake.py delete-prefix TENANT  delete every object under the tenant's prefix
    python smoke_lake.py lag-watch SECONDS INTERVAL  every tenant's lag, one JSON line per interval
    python smoke_lake.py exact               every tenant against a fault-free drain (the soak)
    python smoke_lake.py dead-letters        the open dead letters and the bad ops in the outbox
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from urllib.parse import urlparse

import botocore.session

from oml_dagster import from_settings
from oml_dagster.lake.audit.doctor import drained_through
from oml_dagster.lake.model.tables import BRONZE_EVENTS
from oml_dagster.lake.policy import known_tenants, lag
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.simulate.faults import FAULT_KEY


def status(lake: Lake) -> list[dict]:
    """Per tenant: what the outbox holds, what is sequenced, what the lake drained through, and
    whether bronze holds each journal event exactly once."""
    found = []
    with from_settings.connect() as conn:
        for tenant_id in known_tenants(conn):
            ops, unsequenced, events, last_seq = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE seq IS NULL),"
                " count(DISTINCT journal_seq) FILTER (WHERE op = 'journal.event'),"
                " coalesce(max(seq), 0) FROM oml.outbox WHERE tenant_id = %s",
                (tenant_id,),
            ).fetchone()
            through = drained_through(lake, tenant_id)
            bronze = lake.open(lake.table_uri(tenant_id, BRONZE_EVENTS))
            seqs = [r["journal_seq"] for r in read_rows(bronze, BRONZE_EVENTS)] if bronze else []
            found.append(
                {
                    "tenant": tenant_id,
                    "ops": ops,
                    "unsequenced": unsequenced,
                    "last_seq": last_seq,
                    "drained_through": through,
                    "journal_events": events,
                    "bronze_rows": len(seqs),
                    "bronze_distinct": len(set(seqs)),
                }
            )
    return found


def fingerprint(lake: Lake, tenant_id: str) -> dict:
    """Every table of the tenant as (row count, sha256 of its rows in a stable order). No column
    depends on when a drain ran, so a rebuilt lake has the same fingerprint."""
    tables = {}
    for table, spec, uri in tenant_tables(lake, tenant_id):
        rows = sorted(repr(sorted(r.items())) for r in read_rows(lake.open(uri), spec))
        digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()
        tables[str(table)] = {"rows": len(rows), "sha256": digest}
    return tables


def delete_prefix(lake: Lake, tenant_id: str) -> dict:
    """Delete every object under the tenant's prefix (a lost lake, as an operator may meet one)."""
    uri = urlparse(lake.tenant_uri(tenant_id))
    bucket, prefix = uri.netloc, uri.path.lstrip("/") + "/"
    s3 = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )
    deleted = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
            deleted += len(keys)
    left = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0)
    return {"bucket": bucket, "prefix": prefix, "deleted": deleted, "left": left}


def lag_watch(lake: Lake, seconds: float, interval: float) -> None:
    """Every `interval` s for `seconds`: each tenant's lag (ops sequenced and not drained, and
    the age of the oldest of them) and its unsequenced rows, one JSON line each; a reading that
    meets a fault (the soak restarts the database) prints the fault instead and goes on."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        reading: dict = {"t": time.time()}
        try:
            with from_settings.connect() as conn:
                tenants = {}
                for tenant_id in known_tenants(conn):
                    pending, age = lag(conn, tenant_id, drained_through(lake, tenant_id))
                    waiting = conn.execute(
                        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND seq IS NULL",
                        (tenant_id,),
                    ).fetchone()[0]
                    tenants[tenant_id] = [pending, round(age, 1), waiting]
                reading["tenants"] = tenants
        except Exception as error:  # a fault being injected: say it, read again
            reading["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        print(json.dumps(reading), flush=True)
        time.sleep(interval)


def exact(lake: Lake) -> dict:
    """Every tenant's lake against a fault-free drain of the same outbox into a lake of its own
    (`<root>-reference`), as the fault tests compare them (oml_dagster_tests/helpers.py
    assert_exactly_once): each journal event once in bronze, every table's rows equal."""
    from oml_dagster.lake.write.drain import DrainPolicy, drain

    reference = dataclasses.replace(lake, root=lake.root.rstrip("/") + "-reference")
    found: dict = {"tenants": 0, "differ": {}, "bronze_not_once": []}
    with from_settings.connect() as conn:
        tenants = known_tenants(conn)
        drain(conn, reference, tenants, policy=DrainPolicy(until_idle=True))
        for tenant_id in tenants:
            found["tenants"] += 1
            # The sequenced events: rows behind a journal gap (a producer cut off mid-act by a
            # database fault) stay unsequenced, waited for, and are in neither lake. A forged
            # event the simulator injects (marked, under another tenant's key) shares its act's
            # journal_seq and is refused: it is not one of the journal's events.
            events = [
                j
                for (j,) in conn.execute(
                    "SELECT journal_seq FROM oml.outbox WHERE tenant_id = %s"
                    " AND op = 'journal.event' AND seq IS NOT NULL"
                    " AND payload::text NOT LIKE %s ORDER BY journal_seq",
                    (tenant_id, f'%"{FAULT_KEY}"%'),
                )
            ]
            bronze = lake.open(lake.table_uri(tenant_id, BRONZE_EVENTS))
            seqs = (
                sorted(r["journal_seq"] for r in read_rows(bronze, BRONZE_EVENTS)) if bronze else []
            )
            if seqs != events or events != list(range(1, len(events) + 1)):
                found["bronze_not_once"].append(tenant_id)
            mine, theirs = fingerprint(lake, tenant_id), fingerprint(reference, tenant_id)
            if mine != theirs:
                found["differ"][tenant_id] = sorted(
                    k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)
                )
    found["exact"] = not found["differ"] and not found["bronze_not_once"]
    return found


def dead_letters() -> dict:
    """The open dead letters (neither re-enqueued nor resolved): those of bad ops the simulator
    injected (their payload carries its `sim_fault` mark) and any other, by reason; and how many
    injected bad ops the outbox holds (each must be dead-lettered once)."""
    mark = f'%"{FAULT_KEY}"%'
    with from_settings.connect() as conn:
        rows = conn.execute(
            "SELECT payload::text LIKE %s, reason, count(*) FROM oml.lake_dead_letter"
            " WHERE requeued_at IS NULL AND resolved_at IS NULL GROUP BY 1, 2 ORDER BY 3 DESC",
            (mark,),
        ).fetchall()
        injected = conn.execute(
            "SELECT count(*) FROM oml.outbox WHERE payload::text LIKE %s", (mark,)
        ).fetchone()[0]
    return {
        "open_injected": sum(n for marked, _, n in rows if marked),
        "open_other": sum(n for marked, _, n in rows if not marked),
        "other_reasons": {r[:160]: n for marked, r, n in rows if not marked},
        "injected_in_outbox": injected,
    }


def main(argv: list[str]) -> int:
    lake = from_settings.lake()
    match argv:
        case ["status"]:
            result = status(lake)
        case ["fingerprint", tenant_id]:
            result = fingerprint(lake, tenant_id)
        case ["delete-prefix", tenant_id]:
            result = delete_prefix(lake, tenant_id)
        case ["lag-watch", seconds, interval]:
            lag_watch(lake, float(seconds), float(interval))
            return 0
        case ["exact"]:
            result = exact(lake)
        case ["dead-letters"]:
            result = dead_letters()
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
