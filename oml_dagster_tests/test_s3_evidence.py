"""The erasure SLO on S3, checked through the object store itself: after an erase is drained and
the bound has passed, one maintenance run leaves no object under the tenant's prefix holding the
erased ciphertext (live, superseded by MERGE and compaction, or orphaned by a lost commit), and
the erasure evidence agrees. The local version of this test walks the directory."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from deltalake import CommitProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from oml_dagster.lake.audit.erasure import erasure_evidence
from oml_dagster.lake.model.tables import SILVER_CLAIMS
from oml_dagster.lake.store import maintenance
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import conform, read_rows
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.helpers import claim, drain_all, holds, make_tree
from oml_testbed.s3_server import s3_client

pytestmark = pytest.mark.s3

# Long enough that compaction's superseded copies (and the table's first log entries) are still
# within bound + cadence when the erase has drained, on a loaded machine too (5 s was not: the
# setup took longer under the suite's two workers); the checks run at pinned instants.
BOUND = dt.timedelta(seconds=15)
CADENCE = dt.timedelta(seconds=1)


def objects_holding(lake: Lake, tenant_id: str, needle: bytes) -> list[str]:
    """Every object under the tenant's prefix that holds `needle` (raw, or in a decoded Parquet
    value), read with a client
    of its own (not delta-rs), relative to the prefix."""
    options = lake.storage_options
    s3 = s3_client(options["AWS_ENDPOINT_URL"])
    bucket, _, root = lake.tenant_uri(tenant_id).removeprefix("s3://").partition("/")
    hits = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/"):
        for obj in page.get("Contents", []):
            if holds(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read(), needle):
                hits.append(obj["Key"].removeprefix(f"{root}/"))
    return sorted(hits)


def test_erased_ciphertext_leaves_every_object_under_the_tenant_prefix(conn, s3_lake):
    lake = s3_lake
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    made, ciphertexts = [], {}
    for i in range(4):
        c = claim(tree.a)
        ciphertexts[c.artifact_id] = acts.promote(conn, keys, c, f"plain {i}".encode()).ciphertext
        made.append(c)
        drain_all(conn, lake)
    maintenance.compact(conn, lake, keys.tenant_id)  # superseded copies of every body
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)
    # An orphan: a commit that lost its race leaves its data file (with the body) behind.
    current = lake.open(silver_uri)
    stale = lake.open(silver_uri, version=current.version() - 1)
    with pytest.raises(CommitFailedError):
        write_deltalake(
            stale,
            conform(current.to_pyarrow_table(), SILVER_CLAIMS),
            mode="append",
            commit_properties=CommitProperties(max_commit_retries=0),
        )

    target = made[1]
    erased = ciphertexts[target.artifact_id]
    acts.erase(conn, keys, target)
    drain_all(conn, lake)
    drained_at = dt.datetime.now(dt.UTC)
    before = objects_holding(lake, keys.tenant_id, erased)
    assert len([k for k in before if k.startswith("silver/claims/")]) >= 3, before
    assert erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=drained_at).ok

    past_deadline = drained_at + BOUND + CADENCE + dt.timedelta(seconds=0.3)
    overdue = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=past_deadline)
    assert not overdue.ok and any("silver.claims" in f for f in overdue.findings())

    # VACUUM keeps what was removed within the bound: wait that out for real.
    time.sleep(max(0.0, drained_at.timestamp() + BOUND.total_seconds() + 0.3 - time.time()))
    maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")
    assert objects_holding(lake, keys.tenant_id, erased) == []
    assert erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE).ok
    rows = {r["artifact_id"]: r for r in read_rows(lake.open(silver_uri), SILVER_CLAIMS)}
    assert rows[target.artifact_id]["body_ciphertext"] is None
    for c in made:
        if c is not target:
            assert rows[c.artifact_id]["body_ciphertext"] == ciphertexts[c.artifact_id]
