"""Postgres access: connections to a DSN the caller passes (the edge reads `OML_PG_DSN`) and the
versioned migrations of schema `oml`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from oml_dagster.lake import queries

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=autocommit)


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
        conn.execute(queries.ADVISORY_XACT_LOCK, (queries.MIGRATION_LOCK,))
        conn.execute(queries.CREATE_SCHEMA)
        conn.execute(queries.CREATE_MIGRATIONS_TABLE)
        done = {row[0] for row in conn.execute(queries.APPLIED_MIGRATIONS)}
        for migration in migrations():
            if migration.version in done:
                continue
            conn.execute(migration.sql)
            conn.execute(
                queries.RECORD_MIGRATION,
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied


def dsn_as(dsn: str, role: str, password: str | None = None) -> str:
    """`dsn` with `role` as its user: `password` when given, no password otherwise (the owner's
    is never handed on). The writer's DSN beside the owner's, for the demo, the tests and the
    benchmarks."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["user"] = role
    info.pop("password", None)
    if password:
        info["password"] = password
    return psycopg.conninfo.make_conninfo("", **info)


def create_writer_role(conn: psycopg.Connection, role: str, password: str | None = None) -> None:
    """Create the login role a deployment's lake-writer connects as, or bring an existing one
    into line: it may log in, inherits nothing (so outside a scope it can touch no table of
    schema oml), bypasses no row-level security, and may take the two scope roles of migration
    0004 (ADR 0049). Run by the migrations' owner, after `upgrade`; idempotent."""
    name = sql.Identifier(role)
    with conn.transaction():
        conn.execute(queries.ADVISORY_XACT_LOCK, (queries.MIGRATION_LOCK,))
        row = conn.execute(queries.ROLE_EXISTS, (role,)).fetchone()
        exists = bool(row and row[0])
        attributes = sql.SQL("LOGIN NOINHERIT NOSUPERUSER NOCREATEROLE NOCREATEDB NOBYPASSRLS")
        verb = sql.SQL("ALTER ROLE" if exists else "CREATE ROLE")
        conn.execute(sql.SQL("{} {} {}").format(verb, name, attributes))
        if password:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(name, sql.Literal(password)))
        conn.execute(
            sql.SQL("GRANT {}, {} TO {}").format(
                sql.Identifier(queries.TENANT_ROLE), sql.Identifier(queries.CROSS_ROLE), name
            )
        )
