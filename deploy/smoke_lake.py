"""The smoke run's probes of the lake and its authority, run inside the code location image
(deploy/smoke.py mounts this file and runs it with the image's Python and the lake's
environment). Each prints one JSON document on stdout.

    python smoke_lake.py status              every tenant: outbox, frontier and bronze counts
    python smoke_lake.py fingerprint TENANT  every table of the tenant: rows and a digest of them
    python smoke_lake.py delete-prefix TENANT  delete every object under the tenant's prefix
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from urllib.parse import urlparse

import botocore.session

from oml_dagster import from_settings
from oml_dagster.lake.audit.doctor import drained_through
from oml_dagster.lake.model.tables import BRONZE_EVENTS
from oml_dagster.lake.policy import known_tenants
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows, tenant_tables


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
    for name, spec, uri in tenant_tables(lake, tenant_id):
        rows = sorted(repr(sorted(r.items())) for r in read_rows(lake.open(uri), spec))
        digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()
        tables[name] = {"rows": len(rows), "sha256": digest}
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


def main(argv: list[str]) -> int:
    lake = from_settings.lake()
    match argv:
        case ["status"]:
            result = status(lake)
        case ["fingerprint", tenant_id]:
            result = fingerprint(lake, tenant_id)
        case ["delete-prefix", tenant_id]:
            result = delete_prefix(lake, tenant_id)
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
