"""Shared fixtures: a fresh PostgreSQL database per test (cloned from a migrated template), a
fresh lake directory, tenants, and readers of the lake's tables."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from oml_dagster.lake import db
from oml_dagster.lake.model.tables import GOLD_CURATED, TableSpec
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows
from oml_dagster.simulate import producer
from oml_testbed.pg_cluster import private_cluster
from oml_testbed.s3_server import moto_server, new_bucket, store_options

ADMIN_DSN = os.environ.get("OML_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _dsn_for(database: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo(**info)


@pytest.fixture(autouse=True)
def _defs_state_storage_scoped_to_the_test() -> Iterator[None]:
    """Dagster keeps the current defs-state storage in a ContextVar that entering an instance sets;
    an evaluation context that builds an instance from a ref and is never exited leaves it set, and
    the next test that loads a repository then hits the dead instance's weakref. Scope it here.
    A test run that never loaded Dagster (the unit tests) has nothing to scope and does not pay
    for importing it; a test that loads it first leaves it to the next test's scope."""
    if "dagster" not in sys.modules:
        yield
        return
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    with set_defs_state_storage(None):
        yield


@pytest.fixture(scope="session")
def template_db():
    name = f"oml_tmpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(_dsn_for(name), autocommit=True) as conn:
        db.upgrade(conn)
        producer.ensure_schema(conn)
    yield name
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(template_db, monkeypatch):
    name = f"oml_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = _dsn_for(name)
    monkeypatch.setenv("OML_PG_DSN", url)
    yield url
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def writer_dsn(conn, dsn) -> Iterator[str]:
    """The DSN of a login role of the kind the README asks a deployment's writer to use, made by
    `db upgrade`'s own code (ADR 0049): no privileges of its own, row-level security on. Roles
    are the cluster's: one per test keeps tests apart."""
    role = f"oml_writer_{uuid.uuid4().hex[:8]}"
    db.create_writer_role(conn, role)
    yield db.dsn_as(dsn, role)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
    conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def writer_conn(writer_dsn) -> Iterator[psycopg.Connection]:
    with psycopg.connect(writer_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def lake(tmp_path, monkeypatch) -> Lake:
    root = str(tmp_path / "oml-lake")
    monkeypatch.setenv("OML_LAKE_URI", root)
    return Lake(root)


@pytest.fixture
def tenant(conn) -> producer.TenantKeys:
    return producer.create_tenant(conn)


def table_rows(
    lake: Lake, tenant_id: str, spec: TableSpec, workarea_id: str | None = None
) -> list[dict]:
    table = lake.open(lake.table_uri(tenant_id, spec, workarea_id))
    return [] if table is None else read_rows(table, spec)


def by_key(rows: list[dict], *key: str) -> dict:
    return {tuple(r[k] for k in key) if len(key) > 1 else r[key[0]]: r for r in rows}


def curated_rows(lake: Lake, tenant_id: str, workarea_id: str) -> list[dict]:
    return table_rows(lake, tenant_id, GOLD_CURATED, workarea_id)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory) -> Iterator[str]:
    """A real S3 API server (``python -m moto.server``) on a free loopback port, for the session.

    The process is terminated (then killed if it lingers) at teardown, which frees the port.
    """
    with moto_server(tmp_path_factory.mktemp("moto") / "moto-server.log") as endpoint:
        yield endpoint


@pytest.fixture
def s3_lake(moto_endpoint) -> Lake:
    """A lake root in a fresh bucket on the loopback S3 server."""
    bucket = new_bucket(moto_endpoint)
    return Lake(f"s3://{bucket}/oml-lake", store_options(moto_endpoint)).checked()


@pytest.fixture(scope="module")
def defs():
    """The code location's Definitions, loaded once per module."""
    from oml_dagster.definitions import defs

    return defs


@pytest.fixture
def instance():
    """A throwaway Dagster instance."""
    from dagster import instance_for_test

    with instance_for_test() as dagster_instance:
        yield dagster_instance


@pytest.fixture
def s3_env_lake(s3_lake, monkeypatch) -> Lake:
    """`s3_lake`, also configured through the environment (OML_LAKE_URI and the AWS_* variables)
    the way a deployment configures it: `from_settings.lake()`, the Dagster resources, `oml-lake`
    subprocesses and a bare `Lake(uri)` (delta-rs reads the AWS_* variables) all reach it."""
    for key, value in s3_lake.storage_options.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OML_LAKE_URI", s3_lake.root)
    return s3_lake


@pytest.fixture(scope="module")
def cluster():
    """A private PostgreSQL cluster of this module's own, to stop, kill and start (the fault
    tests, the first connection, the exporter); skipped, saying why, where none can be run."""
    try:
        with private_cluster() as running:
            yield running
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
