"""Fixtures for the delta-rs conformance suite: a fresh local table path and a real moto S3
server on loopback (a subprocess, not an in-process mock)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from oml_testbed.s3_server import new_bucket, s3_client, store_options


@pytest.fixture
def table_uri(tmp_path) -> str:
    """Path of a not-yet-existing Delta table in a per-test temporary directory."""
    return str(tmp_path / "table")


@dataclass(frozen=True)
class S3Table:
    uri: str
    bucket: str
    prefix: str
    storage_options: dict[str, str]
    client: Any

    def log_keys(self) -> list[str]:
        resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/_delta_log/")
        return sorted(o["Key"] for o in resp.get("Contents", []))

    def read_key(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()


@pytest.fixture
def s3_table(moto_endpoint) -> S3Table:
    """A fresh bucket on the moto server and the storage options delta-rs needs to reach it."""
    bucket = new_bucket(moto_endpoint, "lake")
    return S3Table(
        uri=f"s3://{bucket}/tenant-a/events",
        bucket=bucket,
        prefix="tenant-a/events",
        storage_options=store_options(moto_endpoint),
        client=s3_client(moto_endpoint),
    )
