"""Fixtures for the delta-rs conformance suite: a fresh local table path and a real moto S3
server on loopback (a subprocess, not an in-process mock)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import pytest


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
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", **creds)
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    storage_options = {
        "AWS_ACCESS_KEY_ID": creds["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": creds["aws_secret_access_key"],
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    return S3Table(
        uri=f"s3://{bucket}/tenant-a/events",
        bucket=bucket,
        prefix="tenant-a/events",
        storage_options=storage_options,
        client=client,
    )
