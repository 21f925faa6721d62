"""The conditional-put probe (decision 0017): an object store that ignores `If-None-Match` is
refused by name before anything is written, one that honours it is accepted, the verdict is kept
per store, and a local lake is never probed.

The store that ignores the header is real: moto's server behind a forwarding proxy on loopback
that drops `If-None-Match` from every request (moto does not check signatures)."""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from botocore.exceptions import ClientError

from oml_dagster import from_settings
from oml_dagster.lake.errors import UnsupportedObjectStore
from oml_dagster.lake.model.tables import CORE_TABLES, SILVER_CLAIMS
from oml_dagster.lake.store.conditional_put import PROBE_PREFIX
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster_tests.helpers import LakeView, make_tree, promoted
from oml_testbed.s3_server import new_bucket, s3_client, store_options

pytestmark = pytest.mark.s3

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}


class ForwardingProxy:
    """An HTTP proxy on a free loopback port in front of `upstream`. With `strip_if_none_match`
    it removes that header, which turns moto into a store without conditional put. Every
    request's method and path is recorded."""

    def __init__(self, upstream: str, *, strip_if_none_match: bool):
        self.requests: list[tuple[str, str]] = []
        self.stripped = 0
        target = urlparse(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {}
                for name, value in self.headers.items():
                    if name.lower() == "if-none-match" and strip_if_none_match:
                        proxy.stripped += 1
                        continue
                    if name.lower() not in _HOP_BY_HOP:
                        headers[name] = value
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                proxy.requests.append((self.command, self.path))
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    upstream_conn.request(self.command, self.path, body=body, headers=headers)
                    response = upstream_conn.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for name, value in response.getheaders():
                        if name.lower() not in _HOP_BY_HOP:
                            self.send_header(name, value)
                    self.send_header("Connection", "close")
                    self.close_connection = True
                    if self.command == "HEAD":
                        declared = response.getheader("Content-Length")
                        self.send_header("Content-Length", declared or "0")
                        self.end_headers()
                    else:
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                finally:
                    upstream_conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ForwardingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def probes(self) -> set[str]:
        """The scratch tables the probe wrote through this proxy (one per probe run)."""
        found = set()
        for method, path in self.requests:
            parts = urlparse(path).path.split("/")
            if method == "PUT" and PROBE_PREFIX in parts:
                found.add(parts[parts.index(PROBE_PREFIX) + 1])
        return found


def _new_bucket(endpoint: str) -> str:
    return new_bucket(endpoint, "oml-probe")


def _keys(endpoint: str, bucket: str) -> list[str]:
    listed = s3_client(endpoint).list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _lake(endpoint: str, bucket: str) -> Lake:
    return Lake(f"s3://{bucket}/oml-lake", store_options(endpoint))


@pytest.fixture
def ignoring_store(moto_endpoint) -> Iterator[ForwardingProxy]:
    with ForwardingProxy(moto_endpoint, strip_if_none_match=True) as proxy:
        yield proxy


@pytest.fixture
def honouring_store(moto_endpoint) -> Iterator[ForwardingProxy]:
    with ForwardingProxy(moto_endpoint, strip_if_none_match=False) as proxy:
        yield proxy


def test_moto_honours_if_none_match_and_the_stripping_proxy_does_not(moto_endpoint, ignoring_store):
    """The two stores the probe is tested against really differ."""
    bucket = _new_bucket(moto_endpoint)
    direct = s3_client(moto_endpoint)
    direct.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        direct.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")

    proxied = s3_client(ignoring_store.endpoint)
    proxied.put_object(Bucket=bucket, Key="p", Body=b"first", IfNoneMatch="*")
    proxied.put_object(Bucket=bucket, Key="p", Body=b"second", IfNoneMatch="*")
    assert direct.get_object(Bucket=bucket, Key="p")["Body"].read() == b"second"
    assert ignoring_store.stripped == 2


def test_a_store_that_ignores_if_none_match_is_refused_by_name(
    conn, moto_endpoint, ignoring_store, tenant
):
    bucket = _new_bucket(moto_endpoint)
    lake = _lake(ignoring_store.endpoint, bucket)
    with pytest.raises(UnsupportedObjectStore) as refused:
        lake.checked()
    message = str(refused.value)
    assert f"object store {ignoring_store.endpoint} bucket {bucket}" in message
    assert "ignores If-None-Match" in message
    assert len(ignoring_store.probes()) == 1

    # Every path that opens a table is refused too, from the cached verdict: no second probe,
    # and the writer writes nothing.
    with pytest.raises(UnsupportedObjectStore, match=bucket):
        lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    promoted(conn, tenant, make_tree(conn, tenant).a)
    with pytest.raises(UnsupportedObjectStore, match=bucket):
        drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert len(ignoring_store.probes()) == 1
    assert _keys(moto_endpoint, bucket) == [], "the probe's scratch table is removed"


def test_the_environment_configured_lake_is_refused_at_startup(
    moto_endpoint, ignoring_store, monkeypatch
):
    bucket = _new_bucket(moto_endpoint)
    monkeypatch.setenv("OML_LAKE_URI", f"s3://{bucket}/oml-lake")
    for key, value in _lake(ignoring_store.endpoint, bucket).storage_options.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UnsupportedObjectStore, match=f"{ignoring_store.endpoint} bucket {bucket}"):
        from_settings.lake()


def test_a_store_that_honours_it_is_accepted_and_probed_once_per_store(
    conn, moto_endpoint, honouring_store, tenant
):
    bucket = _new_bucket(moto_endpoint)
    lake = _lake(honouring_store.endpoint, bucket)
    assert lake.checked() is lake
    assert len(honouring_store.probes()) == 1
    _lake(honouring_store.endpoint, bucket).checked()  # another handle on the same store
    for spec in CORE_TABLES:
        assert lake.open(lake.table_uri(tenant.tenant_id, spec)) is None
    assert len(honouring_store.probes()) == 1
    assert _keys(moto_endpoint, bucket) == [], "the probe's scratch key is removed"

    # Another bucket is another store: probed on its own.
    _lake(honouring_store.endpoint, _new_bucket(moto_endpoint)).checked()
    assert len(honouring_store.probes()) == 2


def test_the_writer_commits_to_an_accepted_store(conn, s3_lake, tenant):
    """moto's server itself (which honours If-None-Match) passes the probe and takes a drain."""
    promoted(conn, tenant, make_tree(conn, tenant).a)
    drain(conn, s3_lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert len(LakeView(s3_lake, tenant.tenant_id).silver) == 1


def test_a_store_that_cannot_be_reached_is_not_a_verdict(moto_endpoint):
    """A missing bucket fails the probe with the store's own error, not a refusal, and nothing
    is cached: once the bucket exists the same lake is accepted."""
    bucket = f"oml-probe-{uuid.uuid4().hex[:12]}"
    lake = _lake(moto_endpoint, bucket)
    with pytest.raises(OSError, match=f"cannot probe object store {moto_endpoint} bucket {bucket}"):
        lake.checked()
    s3_client(moto_endpoint).create_bucket(Bucket=bucket)
    assert lake.checked() is lake


def test_a_local_lake_is_never_probed(tmp_path):
    lake = Lake(str(tmp_path / "oml-lake")).checked()
    assert lake.open(f"{lake.root}/t/silver/claims") is None
    assert not (tmp_path / "oml-lake" / PROBE_PREFIX).exists()
    assert not (tmp_path / "oml-lake").exists()
