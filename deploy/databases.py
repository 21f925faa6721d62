"""Create the demo's databases and print the environment that names them, as shell exports.

    python deploy/databases.py ADMIN_DSN [--lake-db NAME] [--dagster-db NAME] [--use-admin-db]
                                         [--fresh]

The lake's database (OML_PG_DSN) is ADMIN_DSN's own database with --use-admin-db (the operator
named it), else --lake-db on that server. Dagster's storage goes to --dagster-db on the same
server (DAGSTER_PG_HOST/_PORT/_USER/_PASSWORD/_DB, as dagster.yaml reads them); without the
right to create it, to the lake's database (Dagster's tables live in schema public, the lake's
in schema oml)."""

from __future__ import annotations

import argparse
import shlex

import psycopg
from psycopg import sql


def _with_db(dsn: str, dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**info)


def _ensure(admin_dsn: str, name: str) -> bool:
    """Create database `name` unless it exists; False when this user may not create it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return True
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


def _drop(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("admin_dsn")
    parser.add_argument("--lake-db", default="oml_demo")
    parser.add_argument("--dagster-db", default="oml_dagster_demo")
    parser.add_argument("--use-admin-db", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="drop the demo databases first")
    args = parser.parse_args()
    if args.fresh:
        _drop(args.admin_dsn, args.dagster_db)
        if not args.use_admin_db:
            _drop(args.admin_dsn, args.lake_db)

    if args.use_admin_db:
        lake_dsn = args.admin_dsn
    else:
        if not _ensure(args.admin_dsn, args.lake_db):
            raise SystemExit(f"cannot create database {args.lake_db}; set OML_PG_DSN to one")
        lake_dsn = _with_db(args.admin_dsn, args.lake_db)

    info = psycopg.conninfo.conninfo_to_dict(lake_dsn)
    dagster_db = args.dagster_db if _ensure(lake_dsn, args.dagster_db) else info["dbname"]
    exports = {
        "OML_PG_DSN": lake_dsn,
        "DAGSTER_PG_HOST": info.get("host") or "127.0.0.1",
        "DAGSTER_PG_PORT": str(info.get("port") or 5432),
        "DAGSTER_PG_USER": info.get("user") or "postgres",
        "DAGSTER_PG_PASSWORD": info.get("password") or "",
        "DAGSTER_PG_DB": dagster_db,
    }
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
