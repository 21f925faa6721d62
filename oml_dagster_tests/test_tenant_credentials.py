"""Per-tenant storage credentials (ADR 0048): how a tenant's own storage options are found and
layered over the shared set, what a bad reference says, and, against an S3 server that enforces
prefix-scoped IAM policies, that each tenant's tables are written and read with its own
credentials only and that a tenant pointed at another's credentials stops with one line."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from oml_dagster import from_settings
from oml_dagster.lake.analytics import reports, sandbox
from oml_dagster.lake.audit.doctor import examine
from oml_dagster.lake.audit.erasure import erasure_evidence
from oml_dagster.lake.audit.reconcile import reconcile
from oml_dagster.lake.errors import CrossTenantAccess, InvalidSetting, TenantCredentialsRefused
from oml_dagster.lake.faults import EXIT_PERMANENT, describe
from oml_dagster.lake.model.tables import BRONZE_EVENTS
from oml_dagster.lake.store import conditional_put
from oml_dagster.lake.store.credentials import layered
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.maintenance import maintain
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.settings import TenantStorageReferences
from oml_dagster.simulate import producer
from oml_dagster_tests.test_commit_fence import mixed_workload
from oml_testbed.s3_server import moto_server

A, B = str(uuid.uuid4()), str(uuid.uuid4())
SHARED = {
    "AWS_ACCESS_KEY_ID": "shared-key",
    "AWS_SECRET_ACCESS_KEY": "shared-secret",
    "AWS_SESSION_TOKEN": "shared-token",
    "AWS_REGION": "eu-west-1",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "timeout": "30s",
}
OWN = {"aws_access_key_id": "a-key", "aws_secret_access_key": "a-secret"}


def write_options(directory: Path, tenant_id: str, options: dict | str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{tenant_id}.json"
    path.write_text(options if isinstance(options, str) else json.dumps(options))
    return path


def s3_lake(references: TenantStorageReferences) -> Lake:
    """A lake on an S3 root nothing listens for: only resolution that stops before the probe."""
    return Lake("s3://bucket/oml-lake", dict(SHARED), references)


# --- resolution ----------------------------------------------------------------------------------


def test_a_tenant_without_a_reference_uses_the_shared_set(tmp_path):
    write_options(tmp_path / "own", A, OWN)
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "own")))
    found = lake.for_tenant(B)
    assert found.storage_options == SHARED and found.own_source is None
    assert found.tenant_id == B and lake.for_tenant(B) is found  # kept per tenant
    assert lake.options_for(lake.table_uri(B, BRONZE_EVENTS)) == SHARED


def test_own_credentials_replace_the_shared_ones_and_keep_the_rest():
    merged = layered(SHARED, OWN)
    assert merged == {
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "timeout": "30s",
        **OWN,
    }  # the shared session token does not ride along with the tenant's key
    assert layered(SHARED, {**OWN, "aws_region": "us-east-2"})["aws_region"] == "us-east-2"
    assert "AWS_REGION" not in layered(SHARED, {**OWN, "aws_region": "us-east-2"})


def test_a_variable_is_a_reference_too(monkeypatch):
    env = {f"OML_LAKE_STORAGE_OPTIONS__{uuid.UUID(A).hex}": json.dumps(OWN)}
    found = TenantStorageReferences.from_env(env).resolve(A)
    assert found is not None and found.options == OWN
    assert found.source == f"variable OML_LAKE_STORAGE_OPTIONS__{uuid.UUID(A).hex}"
    assert TenantStorageReferences.from_env(env).resolve(B) is None


def test_malformed_json_names_the_tenant_and_the_file_not_the_secret(tmp_path):
    path = write_options(tmp_path / "own", A, '{"aws_secret_access_key": "s3cr3t",')
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "own")))
    with pytest.raises(InvalidSetting) as refused:
        lake.open(lake.table_uri(A, BRONZE_EVENTS))
    line = str(refused.value)
    assert f"tenant {A}" in line and str(path) in line and "not a JSON object" in line
    assert "s3cr3t" not in line and "\n" not in line


def test_a_directory_that_is_not_there_is_refused_not_passed_over(tmp_path):
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "never-mounted")))
    with pytest.raises(InvalidSetting, match=f"tenant {A}: OML_TENANT_STORAGE_OPTIONS_DIR="):
        lake.for_tenant(A)


def test_an_unreadable_file_names_the_tenant_and_the_file(tmp_path):
    (tmp_path / "own" / f"{A}.json").mkdir(parents=True)  # a directory: read fails
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "own")))
    with pytest.raises(InvalidSetting, match=rf"tenant {A}: cannot read .*{A}\.json"):
        lake.for_tenant(A)


def test_a_file_not_named_after_a_tenant_is_refused(tmp_path):
    write_options(tmp_path / "own", "acme", OWN)
    (tmp_path / "own" / "..data").mkdir()  # a Kubernetes secret volume's own entries: passed
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "own")))
    with pytest.raises(InvalidSetting, match=r"'acme\.json' is not named <tenant_id>\.json"):
        lake.for_tenant(A)


def test_a_tenant_named_twice_or_a_bad_variable_name_is_refused(tmp_path):
    write_options(tmp_path / "own", A, OWN)
    variable = f"OML_LAKE_STORAGE_OPTIONS__{uuid.UUID(A).hex}"
    both = TenantStorageReferences(str(tmp_path / "own"), {uuid.UUID(A).hex: json.dumps(OWN)})
    with pytest.raises(InvalidSetting, match=f"both in .* and in {variable}"):
        both.resolve(A)
    with pytest.raises(InvalidSetting, match="OML_LAKE_STORAGE_OPTIONS__acme: expected"):
        TenantStorageReferences.from_env({"OML_LAKE_STORAGE_OPTIONS__acme": "{}"})


def test_own_options_without_credentials_are_refused(tmp_path):
    path = write_options(tmp_path / "own", A, {"aws_region": "us-east-2"})
    lake = s3_lake(TenantStorageReferences(str(tmp_path / "own")))
    with pytest.raises(InvalidSetting, match=f"tenant {A}: file {path} names no"):
        lake.for_tenant(A)


def test_a_tenants_lake_opens_that_tenants_objects_only(lake):
    mine = lake.for_tenant(A)
    assert mine.tenant_of(mine.table_uri(A, BRONZE_EVENTS)) == A
    assert mine.open(mine.table_uri(A, BRONZE_EVENTS)) is None
    with pytest.raises(CrossTenantAccess, match=f"opened for tenant {A} refuses .*{B}"):
        mine.open(mine.table_uri(B, BRONZE_EVENTS))
    with pytest.raises(CrossTenantAccess):
        mine.for_tenant(B)


def test_a_drain_of_one_tenant_through_anothers_lake_writes_nothing(conn, lake):
    keys = producer.create_tenant(conn, B)
    mixed_workload(conn, keys)
    with pytest.raises(CrossTenantAccess) as refused:
        drain(conn, lake.for_tenant(A), [B], policy=DrainPolicy(until_idle=True))
    line, code = describe(refused.value)
    assert code == EXIT_PERMANENT and f"tenant {A}" in line and "\n" not in line
    assert not Path(lake.tenant_uri(B)).exists()


# --- an S3 server that enforces prefix-scoped policies ---------------------------------------------

ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def scoped(bucket: str, *prefixes: str) -> dict:
    """s3:* on the objects under `prefixes`, and listing the bucket. moto judges a request by its
    API operation's name (`s3:ListObjectsV2`, `s3:HeadObject`), not by the IAM action AWS maps
    it to (`s3:ListBucket`, `s3:GetObject`), and does not evaluate an `s3:prefix` condition (one
    it does not know denies): the listing is not scoped here. On AWS: `s3:ListBucket` with
    `"Condition": {"StringLike": {"s3:prefix": ["oml-lake/<tenant_id>/*"]}}`."""
    objects = [f"arn:aws:s3:::{bucket}/{p}*" for p in prefixes]
    listing = ["s3:ListBucket", "s3:ListObjectsV2", "s3:ListObjects"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": objects},
            {"Effect": "Allow", "Action": listing, "Resource": f"arn:aws:s3:::{bucket}"},
        ],
    }


def moto_recorder(endpoint: str, action: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST")
    urllib.request.urlopen(request, timeout=10).close()


def moto_auth(endpoint: str, unauthenticated: str) -> None:
    """moto's server judges every request by IAM after `unauthenticated` more ("inf": never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        unauthenticated.encode(),
        {"Content-Type": "text/plain"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()


class IamStore:
    """A moto server of its own (the session's takes any key) with IAM enforced, one bucket,
    and users whose inline policies scope them to prefixes."""

    def __init__(self, endpoint: str, recording: Path):
        self.endpoint = endpoint
        self.recording = recording
        self.bucket = f"oml-iam-{uuid.uuid4().hex[:8]}"
        anyone = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        self.client(anyone).create_bucket(Bucket=self.bucket)  # auth is still off
        self.admin = self.user("admin", ALL)
        moto_auth(endpoint, "0")  # from here on every request is judged by its user's policy

    def user(self, name: str, policy: dict) -> dict[str, str]:
        import boto3

        signer = getattr(self, "admin", None) or {"AWS_ACCESS_KEY_ID": "testing"}
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=signer["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=signer.get("AWS_SECRET_ACCESS_KEY", "testing"),
        )
        name = f"{name}-{uuid.uuid4().hex[:8]}"  # the server outlives the test
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="lake", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }

    def client(self, credentials: dict[str, str]):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        )

    def keys(self, prefix: str) -> list[str]:
        listed = self.client(self.admin).list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]

    @contextlib.contextmanager
    def recorded(self) -> Iterator[list[Signed]]:
        """The requests made on the bucket meanwhile, as the server received them."""
        found: list[Signed] = []
        moto_recorder(self.endpoint, "reset-recording")
        moto_recorder(self.endpoint, "start-recording")
        try:
            yield found
        finally:
            moto_recorder(self.endpoint, "stop-recording")
        for line in self.recording.read_text().splitlines():
            request = Signed.of(json.loads(line), self.bucket)
            if request is not None:
                found.append(request)


@dataclass(frozen=True)
class Signed:
    """One request on the bucket: its method, the key it names (a listing: its prefix), the
    access key that signed it, and whether it was a put-if-absent."""

    method: str
    key: str
    signer: str
    if_none_match: bool

    @classmethod
    def of(cls, entry: dict, bucket: str) -> Signed | None:
        url = urllib.parse.urlsplit(entry["url"])
        path = urllib.parse.unquote(url.path).lstrip("/").split("/", 1)
        if path[0] != bucket:
            return None  # IAM, or the recorder itself
        query = urllib.parse.parse_qs(url.query)
        key = path[1] if len(path) > 1 and path[1] else query.get("prefix", [""])[0]
        headers = {k.lower(): v for k, v in entry["headers"].items()}
        signer = re.search(r"Credential=([^/]+)/", headers.get("authorization", ""))
        return cls(
            entry["method"], key, signer.group(1) if signer else "", "if-none-match" in headers
        )


@pytest.fixture(scope="module")
def iam_endpoint(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    where = tmp_path_factory.mktemp("moto-iam")
    recording = where / "requests.jsonl"
    with moto_server(where / "moto-server.log", recording=recording) as endpoint:
        yield endpoint, recording


@pytest.fixture
def iam_store(iam_endpoint) -> IamStore:
    endpoint, recording = iam_endpoint
    moto_auth(endpoint, "inf")  # off for the setup (the server outlives the test)
    return IamStore(endpoint, recording)


def deploy(monkeypatch, store: IamStore, shared: dict[str, str], own_dir: Path) -> Lake:
    """The environment a deployment sets (README: per-tenant credentials), and its lake."""
    env = {
        "OML_LAKE_URI": f"s3://{store.bucket}/oml-lake",
        "AWS_ENDPOINT_URL": store.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "OML_TENANT_STORAGE_OPTIONS_DIR": str(own_dir),
        **shared,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("OML_LAKE_STORAGE_OPTIONS", raising=False)
    return from_settings.lake()


def own_file(own_dir: Path, tenant_id: str, credentials: dict[str, str]) -> Path:
    return write_options(
        own_dir,
        tenant_id,
        {
            "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        },
    )


def refused(call) -> str:
    with pytest.raises(ClientError) as error:
        call()
    return error.value.response["Error"]["Code"]


@pytest.mark.s3
def test_each_tenant_is_written_and_read_with_its_own_credentials_only(
    conn, iam_store, monkeypatch, tmp_path
):
    store = iam_store
    # The shared set reaches the root's probe key and tenant B's prefix, never A's.
    shared = store.user("shared", scoped(store.bucket, "oml-lake/_oml_probe/", f"oml-lake/{B}/"))
    mine = store.user("tenant-a", scoped(store.bucket, f"oml-lake/{A}/"))
    own_file(tmp_path / "own", A, mine)
    for tenant_id in (A, B):
        mixed_workload(conn, producer.create_tenant(conn, tenant_id))
    signer = {shared["AWS_ACCESS_KEY_ID"]: "shared", mine["AWS_ACCESS_KEY_ID"]: "A's own"}

    with store.recorded() as requests:
        # The deployment's lake (its shared set probed), one drain, one set of open tables, both
        # tenants; then maintenance, the erasure evidence, the reconciler, the doctor and the
        # analytics of A; what DuckDB reads of each.
        lake = deploy(monkeypatch, store, shared, tmp_path / "own")
        drain(conn, lake, [A, B], policy=DrainPolicy(until_idle=True))
        maintained = maintain(conn, lake, A)
        evidence = erasure_evidence(conn, lake, A)
        reconciled = reconcile(conn, lake, A)
        health = examine(conn, lake, A)
        read = {}
        for tenant_id in (A, B):
            with sandbox.tenant_connection(lake, tenant_id) as tc:
                volume = reports.event_volume(tc)
                seqs = tc.rows("SELECT journal_seq FROM bronze_events ORDER BY journal_seq")
            read[tenant_id] = (sum(r["events"] for r in volume), [r["journal_seq"] for r in seqs])

    # Every request on A's prefix was signed with A's own credentials, every other with the
    # shared set; each set was probed for put-if-absent under its own prefix, twice.
    def reached(key: str) -> str:
        for name, prefix in ((A, f"oml-lake/{A}/"), (B, f"oml-lake/{B}/"), ("root", "oml-lake/")):
            if key.startswith(prefix):
                return name
        return key

    assert {(reached(r.key), signer.get(r.signer, r.signer)) for r in requests} == {
        (A, "A's own"),
        (B, "shared"),
        ("root", "shared"),
    }
    probes = Counter(
        (reached(r.key), signer[r.signer])
        for r in requests
        if r.method == "PUT" and "/_oml_probe/" in f"/{r.key}" and r.if_none_match
    )
    assert probes == {(A, "A's own"): 2, ("root", "shared"): 2}
    assert not [k for k in store.keys("oml-lake/") if "_oml_probe" in k]  # probes cleaned up

    # What was read through those credentials is exactly what the outbox holds.
    for tenant_id in (A, B):
        events = conn.execute(
            "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND op = 'journal.event'",
            (tenant_id,),
        ).fetchone()[0]
        assert read[tenant_id] == (events, list(range(1, events + 1))), tenant_id
    tables = sorted(
        {
            k.split("/_delta_log/")[0].split(f"{A}/", 1)[1]
            for k in store.keys(f"oml-lake/{A}/")
            if "/_delta_log/" in k
        }
    )
    assert len(tables) == 5  # the four core tables and the one validated area's curated table
    assert sorted({r.table.replace(".", "/") for r in maintained}) == tables
    claims = [t for t in tables if t.startswith(("silver/claims", "gold/curated/"))]
    assert sorted(t.table.replace(".", "/") for t in evidence.tables) == claims
    assert reconciled.ok and {r.table for r in reconciled.results} == {
        "bronze.events",
        "silver.claims",
        "gold.lineage",
        "gold.areas",
        "gold.curated",
    }
    assert (health.lost_tables, health.failed_checks, health.lag_ops) == ([], [], 0)
    assert lake.for_tenant(A).own_source == f"file {tmp_path / 'own' / f'{A}.json'}"
    assert conditional_put.store_key(lake.for_tenant(A)).signer == mine["AWS_ACCESS_KEY_ID"]

    # A's credentials read and write A's prefix, and are refused on B's and on the root.
    a, b_key = store.client(mine), store.keys(f"oml-lake/{B}/")[0]
    a.put_object(Bucket=store.bucket, Key=f"oml-lake/{A}/scratch", Body=b"mine")
    assert a.get_object(Bucket=store.bucket, Key=f"oml-lake/{A}/scratch")["Body"].read() == b"mine"
    assert refused(lambda: a.get_object(Bucket=store.bucket, Key=b_key)) == "AccessDenied"
    put = lambda key: a.put_object(Bucket=store.bucket, Key=key, Body=b"x")  # noqa: E731
    assert refused(lambda: put(f"oml-lake/{B}/_delta_log/x.json")) == "AccessDenied"
    assert refused(lambda: put("oml-lake/_oml_probe/x")) == "AccessDenied"
    assert refused(lambda: a.delete_object(Bucket=store.bucket, Key=b_key)) == "AccessDenied"
    assert not [k for k in store.keys(f"oml-lake/{B}/") if k.endswith("x.json")]


@pytest.mark.s3
def test_a_tenant_pointed_at_another_tenants_credentials_stops_with_one_line(
    conn, iam_store, monkeypatch, tmp_path
):
    store = iam_store
    shared = store.user("shared", scoped(store.bucket, "oml-lake/_oml_probe/"))
    mine = store.user("tenant-a", scoped(store.bucket, f"oml-lake/{A}/"))
    path = own_file(tmp_path / "own", B, mine)  # B's reference holds A's keys: a mistake
    lake = deploy(monkeypatch, store, shared, tmp_path / "own")
    mixed_workload(conn, producer.create_tenant(conn, B))

    with pytest.raises(TenantCredentialsRefused) as stopped:
        drain(conn, lake, [B], policy=DrainPolicy(until_idle=True))

    line, code = describe(stopped.value)
    assert code == EXIT_PERMANENT and "\n" not in line
    assert f"tenant {B}" in line and str(path) in line and "AccessDenied" in line
    assert store.keys(f"oml-lake/{B}/") == []  # nothing written
