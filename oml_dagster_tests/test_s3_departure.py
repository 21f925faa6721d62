"""A tenant's departure on S3 (ADR 0075, 0076): export and purge against the moto S3 server on
loopback, a neighbour's objects (one under a key that extends the tenant's id as a string among
them) untouched, and a tenant with its own credentials purged with them alone."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from oml_dagster import from_settings
from oml_dagster.lake.audit import export, purge
from oml_dagster.simulate import acts
from oml_dagster_tests.test_departure import populated
from oml_dagster_tests.test_tenant_credentials import (  # noqa: F401  (fixtures)
    deploy,
    iam_endpoint,
    own_file,
    scoped,
)
from oml_dagster_tests.test_tenant_credentials import iam_store as iam_store  # noqa: F401
from oml_testbed.s3_server import s3_client

pytestmark = pytest.mark.s3


def objects(endpoint: str, bucket: str, prefix: str = "") -> dict[str, tuple[int, str]]:
    """key -> (size, ETag) of every object under `prefix`."""
    client = s3_client(endpoint)
    found: dict[str, tuple[int, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            found[o["Key"]] = (o["Size"], o["ETag"])
    return found


def test_a_tenant_is_exported_and_purged_on_s3(conn, s3_env_lake, moto_endpoint):
    lake = from_settings.lake()
    keys, erased, kept = populated(conn, lake)
    other, _, _ = populated(conn, lake)
    bucket = lake.root.split("/")[2]
    client = s3_client(moto_endpoint)
    stray = f"oml-lake/{keys.tenant_id}0/stray.bin"
    client.put_object(Bucket=bucket, Key=stray, Body=b"not the tenant's")

    uri = f"s3://{bucket}/exports/{keys.tenant_id}"
    result = export.export_tenant(conn, lake, keys.tenant_id, from_settings.export_target(uri))
    exported = objects(moto_endpoint, bucket, "exports/")
    assert exported and all(
        erased not in client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in exported
    )
    check = export.verify_export(from_settings.export_target(uri))
    assert check.ok, check.findings
    assert check.rows == sum(t["rows"] for t in result.manifest["tables"])

    before = {
        k: v
        for k, v in objects(moto_endpoint, bucket).items()
        if not k.startswith(f"oml-lake/{keys.tenant_id}/")
    }
    acts.depart(conn, keys, at=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    made = purge.purge_tenant(conn, lake, keys.tenant_id, by="s3 test")
    assert made["objects"] > 0 and made["listing_after"] == []
    assert objects(moto_endpoint, bucket, f"oml-lake/{keys.tenant_id}/") == {}
    assert objects(moto_endpoint, bucket) == before
    assert stray in before and any(k.startswith(f"oml-lake/{other.tenant_id}/") for k in before)


def test_a_tenant_with_its_own_credentials_is_purged_with_them(
    conn, iam_store, monkeypatch, tmp_path
):
    store = iam_store
    mine_id = str(uuid.uuid4())
    # The shared set reaches the root's probe key only: the tenant's prefix is drained, exported
    # and purged with the tenant's own credentials or not at all.
    shared = store.user("shared", scoped(store.bucket, "oml-lake/_oml_probe/"))
    policy = scoped(store.bucket, f"oml-lake/{mine_id}/")
    # A bulk delete (POST ?delete, what the object store sends) is judged by moto as an action
    # on the bucket; AWS judges each key it names by s3:DeleteObject, which the prefix grants.
    policy["Statement"].append(
        {
            "Effect": "Allow",
            "Action": ["s3:DeleteObjects"],
            "Resource": f"arn:aws:s3:::{store.bucket}",
        }
    )
    mine = store.user("tenant", policy)
    own_file(tmp_path / "own", mine_id, mine)
    lake = deploy(monkeypatch, store, shared, tmp_path / "own")
    keys, _, _ = populated(conn, lake, mine_id)
    assert store.keys(f"oml-lake/{mine_id}/")
    acts.depart(conn, keys)
    made = purge.purge_tenant(conn, lake, mine_id, by="s3 test")
    assert store.keys(f"oml-lake/{mine_id}/") == []
    assert made["credentials"]["own"] and made["credentials"]["revocable"]
    assert made["credentials"]["source"] and "revoke" in made["credentials"]["why"]
