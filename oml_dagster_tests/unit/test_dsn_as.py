"""`db.dsn_as`: the writer's DSN made from the owner's (the demo, the tests, the benchmarks)."""

from __future__ import annotations

import psycopg
import pytest

from oml_dagster.lake.db import dsn_as


@pytest.mark.parametrize(
    "owner",
    [
        "postgresql://owner:owner-secret@127.0.0.1:5433/lake?sslmode=disable",
        "host=127.0.0.1 port=5433 dbname=lake user=owner password=owner-secret sslmode=disable",
    ],
)
def test_the_role_replaces_the_user_and_the_owner_s_password_stays_behind(owner):
    for password, expected in ((None, None), ("", None), ("writer-secret", "writer-secret")):
        info = psycopg.conninfo.conninfo_to_dict(dsn_as(owner, "oml_writer", password))
        assert info.pop("user") == "oml_writer"
        assert info.pop("password", None) == expected
        assert info == {"host": "127.0.0.1", "port": "5433", "dbname": "lake", "sslmode": "disable"}
