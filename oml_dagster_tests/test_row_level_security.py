"""Row-level security (migration 0004, ADR 0049): tests that try to cross tenants.

The writer's DSN names a login role that belongs to oml_lake_tenant and oml_lake_cross and holds
nothing of its own (`oml-lake db upgrade --writer-role`): it can touch schema oml only inside a
scope, and a tenant's scope shows that tenant's rows alone. Real parts: the shared PostgreSQL
server, the `oml-lake` command, a Dagster run."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from psycopg.types.json import Jsonb

from oml_dagster.lake import queries
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.fetch import Fetcher
from oml_dagster.lake.queries import CROSS_ROLE, TENANT_ROLE, cross_scope, tenant_scope
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import TenantBatch, WriterConfig
from oml_dagster.simulate import producer
from oml_dagster.simulate.producer import Act, Event, commit_acts

from .helpers import drain_all, lake_snapshot
from .test_commit_fence import mixed_workload

# Every table of schema oml that holds a tenant_id column.
SCOPED = (
    "outbox",
    "sequencer_tenant",
    "claim_bodies",
    "api_keys",
    "tenant_policy",
    "lake_frontier",
    "lake_verdicts",
    "lake_dead_letter",
)
OML_LAKE = [sys.executable, "-m", "oml_dagster.cli"]


def _bad_act(conn, keys, op: str, payload) -> None:
    commit_acts(conn, keys, [Act(Event("test.bad", {"op": op}), [(op, payload)])])


@pytest.fixture
def two_tenants(conn, lake):
    """Two tenants with a little of everything: ops, bodies, keys, policies, a drained lake with
    its frontier and verdicts, and a dead letter each."""
    made = [producer.create_tenant(conn) for _ in range(2)]
    for keys in made:
        mixed_workload(conn, keys, claims=4)
        _bad_act(conn, keys, "claim.unknown_op", {"x": 1})
    drain_all(conn, lake)
    return [k.tenant_id for k in made]


def test_the_writer_role_holds_nothing_outside_a_scope(writer_dsn, two_tenants):
    with psycopg.connect(writer_dsn, autocommit=True) as w:
        role = w.execute(
            "SELECT rolsuper, rolbypassrls, rolinherit FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert role == (False, False, False)
        for table in SCOPED:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                w.execute(f"SELECT count(*) FROM oml.{table}")


@pytest.mark.parametrize("table", SCOPED)
def test_a_query_without_its_tenant_filter_sees_only_its_tenant(writer_dsn, two_tenants, table):
    a, b = two_tenants
    statement = f"SELECT DISTINCT tenant_id FROM oml.{table}"
    with psycopg.connect(writer_dsn, autocommit=True) as w:
        with tenant_scope(w, a):
            seen = {str(t) for (t,) in w.execute(statement)}
        assert seen == {a}
        if table == "claim_bodies":
            # No cross-tenant part needs a body: the cross role may not read ciphertext at all.
            with pytest.raises(psycopg.errors.InsufficientPrivilege), cross_scope(w):
                w.execute(statement)
        else:
            with cross_scope(w):
                assert {str(t) for (t,) in w.execute(statement)} == {a, b}


def test_a_tenant_s_scope_cannot_write_another_tenant_s_rows(writer_dsn, two_tenants):
    a, b = two_tenants
    with psycopg.connect(writer_dsn, autocommit=True) as w:
        denied = pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security")
        with denied, tenant_scope(w, a):
            w.execute(queries.VERDICTS_UPSERT, (b, 10**9))
        denied = pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security")
        with denied, tenant_scope(w, a):
            w.execute(queries.DEAD_LETTER_INSERT, (10**12, b, 1, "claim.x", Jsonb({}), "crossing"))
        with tenant_scope(w, a):
            # B's frontier rows are invisible: an update that names them changes nothing.
            changed = w.execute(
                "UPDATE oml.lake_frontier SET batch_end = 0 WHERE tenant_id = %s", (b,)
            ).rowcount
        assert changed == 0
        # the cross role writes only what the sequencer writes
        with pytest.raises(psycopg.errors.InsufficientPrivilege), cross_scope(w):
            w.execute("UPDATE oml.lake_frontier SET batch_end = 0")


def test_the_scope_ends_with_its_transaction(writer_dsn, two_tenants):
    a, _ = two_tenants
    with psycopg.connect(writer_dsn, autocommit=True) as w:
        with tenant_scope(w, a):
            assert w.execute("SELECT current_user").fetchone()[0] == TENANT_ROLE
        after = w.execute("SELECT current_user, current_setting('oml.tenant_id', true)").fetchone()
        assert after[0] != TENANT_ROLE and not after[1]
        with cross_scope(w):
            assert w.execute("SELECT current_user").fetchone()[0] == CROSS_ROLE
        # A failed statement inside a scope leaves no scope behind either.
        with pytest.raises(psycopg.errors.InsufficientPrivilege), tenant_scope(w, a):
            w.execute("DELETE FROM oml.outbox")
        assert w.execute("SELECT current_user").fetchone()[0] not in (TENANT_ROLE, CROSS_ROLE)


def _xact(conn) -> int:
    return conn.execute("SELECT txid_current()").fetchone()[0]


class _CountingTransactions(psycopg.Connection):
    """A connection that counts the transactions (and savepoints) opened on it."""

    opened = 0

    def transaction(self, *args, **kwargs):
        self.opened += 1
        return super().transaction(*args, **kwargs)


def test_a_tenant_s_reads_share_one_scoped_transaction(writer_dsn, conn, lake, two_tenants):
    """A tenant batch's read runs every PostgreSQL read in the one session its boundary opens:
    one transaction, in the tenant's role and id, none of its own inside (the writer's login
    role can run nothing outside a scope, so a read that left the session would fail). Apart,
    each scope is a transaction of its own. A scope of another tenant inside a session is
    refused, and a failure inside one leaves neither transaction nor scope behind."""
    a, b = two_tenants
    with psycopg.connect(writer_dsn, autocommit=True) as w:
        apart = []
        for _ in range(2):
            with tenant_scope(w, a):
                apart.append(_xact(w))
        assert apart[0] != apart[1]
        with tenant_scope(w, a) as session:
            inside = [_xact(session.conn) for _ in range(2)]
            seen = session.execute("SELECT DISTINCT tenant_id::text FROM oml.outbox").fetchall()
            assert seen == [(a,)] and session.tenant_id == a
            assert inside[0] == inside[1]
            refused = pytest.raises(RuntimeError, match=f"a scope of tenant {b} inside the session")
            with refused, tenant_scope(w, b):
                pass
        assert w.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        denied = pytest.raises(psycopg.errors.InsufficientPrivilege)
        with denied, tenant_scope(w, a) as session:
            session.execute("DELETE FROM oml.outbox")
        assert w.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert w.execute("SELECT current_user").fetchone()[0] not in (TENANT_ROLE, CROSS_ROLE)
        # After it, a scope is a transaction of its own again, and may be another tenant's.
        with tenant_scope(w, b):
            after = _xact(w)
            assert w.execute("SELECT current_setting('oml.tenant_id')").fetchone()[0] == b
        assert after not in inside

    keys = producer.create_tenant(conn)
    mixed_workload(conn, keys, claims=4)
    sequencer.sequence(conn)
    with _CountingTransactions.connect(writer_dsn, autocommit=True) as w, Fetcher(w) as fetcher:
        batch = TenantBatch(
            tables=OpenTables(lake), tenant_id=keys.tenant_id, config=WriterConfig()
        )
        read = batch.read(w, fetcher=fetcher, ahead=None)
        assert read.seqs and read.ops and read.bodies  # the reads ran, and found rows
        assert w.opened == 1


def test_a_scope_takes_only_a_tenant_id(conn):
    with pytest.raises(ValueError, match="is not a UUID"), tenant_scope(conn, "x'; RESET ROLE; --"):
        pass


def test_api_key_owners_are_the_one_cross_tenant_read_of_a_tenant(writer_dsn, two_tenants, conn):
    a, b = two_tenants
    keys_of_b = [
        k for (k,) in conn.execute("SELECT api_key_id FROM oml.api_keys WHERE tenant_id = %s", (b,))
    ]
    with psycopg.connect(writer_dsn, autocommit=True) as w, tenant_scope(w, a):
        owners = dict(w.execute(queries.API_KEY_OWNERS, (keys_of_b,)).fetchall())
        visible = w.execute(
            "SELECT count(*) FROM oml.api_keys WHERE api_key_id = ANY(%s)", (keys_of_b,)
        ).fetchone()[0]
    assert owners == {k: b for k in keys_of_b} and visible == 0


def test_the_commands_run_under_the_writer_role(writer_dsn, conn, dsn, lake, tmp_path):
    """A deployment's writer role drains, reconciles, examines and maintains through the
    command line; the lake equals one drained by the tables' owner."""
    made = [producer.create_tenant(conn) for _ in range(2)]
    for keys in made:
        mixed_workload(conn, keys, claims=6)
        _bad_act(conn, keys, "claim.unknown_op", {"x": 1})
    env = {**os.environ, "OML_PG_DSN": writer_dsn, "OML_LAKE_URI": lake.root}

    def oml_lake(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*OML_LAKE, *args], env=env, capture_output=True, text=True, timeout=300
        )

    done = oml_lake("drain", "--until-idle")
    assert done.returncode == 0, done.stderr
    for keys in made:
        t = keys.tenant_id
        letters = oml_lake("deadletter", "list", "--tenant", t)
        assert letters.returncode == 0 and "claim.unknown_op" in letters.stdout, letters
        seq = int(letters.stdout.split("seq ", 1)[1].split()[0])
        resolved = oml_lake("deadletter", "resolve", str(seq), "--reason", "bad op", "--by", "t")
        assert resolved.returncode == 0, resolved.stderr
        for command in (["reconcile"], ["doctor"], ["erasure-evidence"], ["maintain", "all"]):
            ran = oml_lake(*command, "--tenant", t)
            assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
        areas = oml_lake("areas-at", "--tenant", t)
        assert areas.returncode == 0, areas.stderr
    everyone = oml_lake("deadletter", "list", "--all")
    assert everyone.returncode == 0, everyone.stderr
    listed = everyone.stdout.splitlines()
    assert len(listed) == 2 and all(f"tenant {k.tenant_id} " in everyone.stdout for k in made)

    # The same outbox drained by the owner (no scope can hide a row from it) into another lake.
    from oml_dagster.lake.store.layout import Lake

    reference = Lake(str(tmp_path / "reference"))
    drain(conn, reference, [k.tenant_id for k in made], policy=DrainPolicy(until_idle=True))
    for keys in made:
        assert lake_snapshot(lake, keys.tenant_id) == lake_snapshot(reference, keys.tenant_id)


def test_a_sensor_tick_and_its_runs_work_under_the_writer_role(
    writer_dsn, conn, lake, defs, instance, monkeypatch
):
    """The code location as deployed: the sensor's cut and pending list (cross-tenant) and a
    lake-writer run with its checks (per tenant), all over the writer role's DSN."""
    from oml_dagster.lake.audit.reconcile import DEAD_LETTERS, reconcile

    from .dagster_support import materialize_partition, seed_tenant
    from .test_sensor import requested, tick

    a, b = seed_tenant(conn), seed_tenant(conn)
    monkeypatch.setenv("OML_PG_DSN", writer_dsn)
    monkeypatch.setenv("OML_DRAIN_SHARDS", "0")
    runs = requested(tick(defs, instance))
    assert set(runs) == {a.tenant_id, b.tenant_id}
    for work in (a, b):
        _, found = materialize_partition(defs, instance, "lake_writer_job", work.tenant_id)
        assert found, "the run reported its materializations"
        failed = [r.name for r in reconcile(conn, lake, work.tenant_id).failed()]
        assert failed == [DEAD_LETTERS], "the lake reconciles; its one finding: the dead letter"
    assert not requested(tick(defs, instance)), "drained: no run asked again"
