"""Postgres access: connections from `OML_PG_DSN` and the versioned migrations of schema `oml`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from oml_dagster.settings import PG_DSN

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Serializes concurrent `db upgrade` runs (an arbitrary, project-owned key).
_MIGRATION_LOCK = 0x6F6D6C00


def dsn_from_env() -> str:
    return PG_DSN.read()


def connect(dsn: str | None = None, *, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(dsn or dsn_from_env(), autocommit=autocommit)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    found = []
    for entry in resources.files("oml_dagster.lake.migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions are not 1..n without gaps: {versions}")
    return found


def upgrade(conn: psycopg.Connection) -> list[Migration]:
    """Apply every migration not yet applied, each in its own transaction; idempotent."""
    applied: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS oml")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS oml.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM oml.schema_migrations")}
        for migration in migrations():
            if migration.version in done:
                continue
            conn.execute(migration.sql)
            conn.execute(
                "INSERT INTO oml.schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied
