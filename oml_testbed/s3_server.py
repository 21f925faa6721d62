"""A real S3 API server (`python -m moto.server`) on a free loopback port, for the tests that
need an object store and for the benchmarks that measure one."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30.0


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(proc: subprocess.Popen, endpoint: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
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
    raise RuntimeError(f"moto server did not answer on {endpoint} in {START_TIMEOUT_S}s")


@contextlib.contextmanager
def moto_server(
    log_path: str | Path | None = None, *, recording: str | Path | None = None
) -> Iterator[str]:
    """The server's endpoint while it runs; its output (one line per request) goes to
    `log_path` when given. With `recording`, the server's request recorder writes there while
    it is switched on (`/moto-api/recorder/start-recording`): one JSON line per request, its
    headers (the signer's access key among them) included. Terminated (then killed if it
    lingers) on exit, which frees the port."""
    port = _free_loopback_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    if recording is not None:
        env["MOTO_RECORDER_FILEPATH"] = str(recording)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log_path, "wb")) if log_path else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
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


# The server takes any credentials; these are the ones every test and benchmark uses.
ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"


def store_options(endpoint: str) -> dict[str, str]:
    """The storage options delta-rs needs to reach the server at `endpoint`."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }


def lake_env(endpoint: str, bucket: str) -> dict[str, str]:
    """The settings a deployment would set for a lake in `bucket` on the server at `endpoint`."""
    return {"OML_LAKE_URI": f"s3://{bucket}/oml-lake", **store_options(endpoint)}


def s3_client(endpoint: str, **config: Any):
    """A boto3 client of the server at `endpoint` (a client of its own, not delta-rs's);
    `config` goes to botocore's Config (e.g. `retries={"max_attempts": 1}`)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(**config) if config else None,
    )


def new_bucket(endpoint: str, prefix: str = "oml") -> str:
    """A fresh bucket on the server at `endpoint`, by name."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name
