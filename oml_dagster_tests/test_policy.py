"""What Postgres says about tenants, answered once for every caller: the tenant list, each
tenant's erasure bound, and drain lag."""

from __future__ import annotations

import datetime as dt
import uuid

from oml_dagster import from_settings, settings
from oml_dagster.lake import policy
from oml_dagster.simulate import producer


def test_every_tenant_is_the_policy_table_and_the_sequencer_together(conn):
    with_policy = producer.create_tenant(conn).tenant_id
    only_sequenced = str(uuid.UUID(int=1, version=4))  # ops enqueued without a policy row
    conn.execute(
        "INSERT INTO oml.sequencer_tenant (tenant_id, last_journal_seq, last_seq) VALUES (%s, 1, 1)",
        (only_sequenced,),
    )
    both = producer.create_tenant(conn).tenant_id
    conn.execute(
        "INSERT INTO oml.sequencer_tenant (tenant_id, last_journal_seq, last_seq) VALUES (%s, 1, 2)",
        (both,),
    )
    assert policy.known_tenants(conn) == sorted({with_policy, only_sequenced, both})
    # The command line's default tenant list is the same one.
    assert policy.resolve_tenants(conn, None) == policy.known_tenants(conn)
    assert policy.resolve_tenants(conn, [both]) == [both]


def test_the_erasure_bound_is_the_policy_s_else_the_default(conn):
    set_bound = producer.create_tenant(conn, erasure_bound=dt.timedelta(hours=3)).tenant_id
    assert policy.erasure_bound(conn, set_bound) == dt.timedelta(hours=3)
    unknown = str(uuid.uuid4())
    assert policy.erasure_bound(conn, unknown) == policy.DEFAULT_ERASURE_BOUND
    # The default is the policy table's own.
    default = producer.create_tenant(conn).tenant_id
    assert policy.erasure_bound(conn, default) == policy.DEFAULT_ERASURE_BOUND


def test_lag_counts_the_ops_past_the_drained_seq(conn):
    tenant = str(uuid.uuid4())
    assert policy.lag(conn, tenant, 0) == (0, 0.0)
    for seq in (1, 2, 3):
        conn.execute(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload, seq, created_at)"
            " VALUES (%s, %s, 'claim.promote', '{}', %s, now() - interval '30 seconds')",
            (tenant, seq, seq),
        )
    ops, seconds = policy.lag(conn, tenant, 1)
    assert ops == 2 and 29 <= seconds < 120


def test_the_cadence_comes_from_its_setting(monkeypatch):
    monkeypatch.delenv("OML_ERASURE_CADENCE_SECONDS", raising=False)
    assert from_settings.erasure_cadence() == policy.DEFAULT_CADENCE == dt.timedelta(days=1)
    assert policy.DEFAULT_CADENCE.total_seconds() == settings.ERASURE_CADENCE_SECONDS.default
    monkeypatch.setenv("OML_ERASURE_CADENCE_SECONDS", "3600")
    assert from_settings.erasure_cadence() == dt.timedelta(hours=1)
