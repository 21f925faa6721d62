"""Fixtures for the delta-rs conformance suite: a fresh local table path and a real moto S3
server on loopback (a subprocess, not an in-process mock)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

MOTO_START_TIMEOUT_S = 30.0


@pytest.fixture
def table_uri(tmp_path) -> str:
    """Path of a not-yet-existing Delta table in a per-test temporary directory."""
    return str(tmp_path / "table")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(proc: subprocess.Popen, endpoint: str) -> None:
    deadline = time.monotonic() + MOTO_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited early with rc={proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answered: serving
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not answer on {endpoint} in {MOTO_START_TIMEOUT_S}s")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory) -> Iterator[str]:
    """A real S3 API server (``python -m moto.server``) on a free loopback port, for the session.

    The process is terminated (then killed if it lingers) at teardown, which frees the port.
    """
    port = _free_loopback_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            _wait_until_serving(proc, endpoint)
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


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
