"""`outbox_sensor` ticks against a real database and a real (temporary) Dagster instance:
tenants become partitions, one run per tenant with pending work, none for idle or busy tenants,
none twice for the same batch."""

from __future__ import annotations

import pytest
from dagster import (
    AssetKey,
    DagsterRunStatus,
    build_sensor_context,
)
from dagster._core.remote_origin import (
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import create_run_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from hypothesis import given, settings
from hypothesis import strategies as st

from oml_dagster.defs import sensors
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import build_resources
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.simulate import producer

from .dagster_support import delete_tenant_prefix, more_acts, seed_tenant

OUTBOX = AssetKey(["postgres", "outbox"])


@pytest.fixture(autouse=True)
def run_per_tenant(monkeypatch):
    """These ticks are the sensor's run-per-tenant mode; shard runs: test_shards.py."""
    monkeypatch.setenv("OML_DRAIN_SHARDS", "0")


def tick(defs, instance, cursor: str | None = None):
    """One sensor evaluation from `cursor`, with its partition requests applied as the daemon
    applies them."""
    sensor = defs.get_sensor_def("outbox_sensor")
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        resources=build_resources(),
        cursor=cursor,
    ) as context:
        data = sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return data


def requested(data) -> dict[str, str]:
    """partition → run key; fails if a tick asks twice for one tenant."""
    keys = [r.partition_key for r in data.run_requests]
    assert len(keys) == len(set(keys)), keys
    return {r.partition_key: r.run_key for r in data.run_requests}


def add_run(instance, tenant_id: str, status: DagsterRunStatus, job: str = "lake_writer_job"):
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            ManagedGrpcPythonEnvCodeLocationOrigin(
                LoadableTargetOrigin(module_name="oml_dagster.definitions"), "oml_lake"
            ),
            "__repository__",
        ),
        job,
    )
    return create_run_for_test(
        instance,
        job_name=job,
        status=status,
        tags={"dagster/partition": tenant_id},
        remote_job_origin=origin,
    )


def test_new_tenants_become_partitions_and_get_one_run_each(conn, lake, defs, instance):
    a, b = seed_tenant(conn), seed_tenant(conn)
    idle = producer.create_tenant(conn)  # a tenant with no acts: a partition, no run

    data = tick(defs, instance)

    assert set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)) == {
        a.tenant_id,
        b.tenant_id,
        idle.tenant_id,
    }
    runs = requested(data)
    assert set(runs) == {a.tenant_id, b.tenant_id}
    assert idle.tenant_id not in runs
    last = {t: last_seq for t, last_seq, _ in sequencer.pending_tenants(conn)}
    assert runs[a.tenant_id] == f"{a.tenant_id}:0:{last[a.tenant_id]}:0"  # never drained
    for request in data.run_requests:
        # The sensor's runs drain only; the checks run on their own schedule.
        assert set(request.asset_selection) == {
            AssetKey(p.split("/"))
            for p in (
                "bronze/events",
                "silver/claims",
                "gold/lineage",
                "gold/areas",
                "gold/curated",
            )
        }
        assert list(request.asset_check_keys) == []
        assert request.tags["dagster/partition"] == request.partition_key
    # The outbox reports each tenant's newly sequenced rows.
    reported = {e.partition: e for e in data.asset_events if e.asset_key == OUTBOX}
    assert set(reported) == {a.tenant_id, b.tenant_id}
    assert reported[a.tenant_id].metadata["last_seq"].value == last[a.tenant_id]

    # A second tick with nothing new: the tenants are known, the runs asked again carry the same
    # keys (so Dagster launches each batch once), and nothing is sequenced anew.
    again = tick(defs, instance)
    assert requested(again) == runs
    assert not again.dynamic_partitions_requests
    assert not [e for e in again.asset_events if e.asset_key == OUTBOX]


def test_every_tenant_postgres_knows_becomes_a_partition_once(conn, lake, defs, instance):
    """Tenants drained only through the CLI, or with nothing to drain, still get a partition (the
    maintenance and evidence schedules iterate the partitions); a tick adds only the missing."""
    through_cli, listed = seed_tenant(conn), seed_tenant(conn)
    drain(
        conn, lake, policy=DrainPolicy(until_idle=True)
    )  # `oml-lake drain --until-idle`: nothing left pending
    quiet = producer.create_tenant(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [listed.tenant_id])

    data = tick(defs, instance)

    assert requested(data) == {}  # nothing pending: partitions, no runs
    [added] = data.dynamic_partitions_requests
    assert sorted(added.partition_keys) == sorted([through_cli.tenant_id, quiet.tenant_id])
    assert set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)) == {
        through_cli.tenant_id,
        listed.tenant_id,
        quiet.tenant_id,
    }
    # A tenant created later is added on the next tick, alone; then nothing is asked again.
    late = producer.create_tenant(conn)
    [added] = tick(defs, instance).dynamic_partitions_requests
    assert list(added.partition_keys) == [late.tenant_id]
    again = tick(defs, instance)
    assert not again.dynamic_partitions_requests
    assert again.skip_message


def test_no_run_for_a_tenant_with_a_queued_or_running_lake_writer_run(conn, lake, defs, instance):
    queued, running, finished, free = (seed_tenant(conn) for _ in range(4))
    add_run(instance, queued.tenant_id, DagsterRunStatus.QUEUED)
    add_run(instance, running.tenant_id, DagsterRunStatus.STARTED)
    add_run(instance, finished.tenant_id, DagsterRunStatus.SUCCESS)
    # Another job's run for the free tenant does not hold the writer back (the queue serializes).
    add_run(instance, free.tenant_id, DagsterRunStatus.STARTED, job="some_maintenance_job")

    runs = requested(tick(defs, instance))

    assert set(runs) == {finished.tenant_id, free.tenant_id}
    # Every tenant with work became a partition, busy or not.
    assert set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)) == {
        w.tenant_id for w in (queued, running, finished, free)
    }


def test_idle_and_drained_tenants_get_no_run_and_each_batch_one_key(conn, lake, defs, instance):
    a = seed_tenant(conn)
    first = requested(tick(defs, instance))[a.tenant_id]

    # Drained (here by the core itself, as a run would): the tenant is idle, nothing requested.
    drain_tenant(conn, lake, a.tenant_id)
    data = tick(defs, instance)
    assert requested(data) == {}
    assert data.skip_message

    # New acts: a new batch, a new key.
    more_acts(conn, a, 30)
    second = requested(tick(defs, instance))[a.tenant_id]
    assert second != first

    # A backlog longer than one run's batch: the run takes part of it, and the next tick asks for
    # the rest under a key of its own.
    drain_tenant(conn, lake, a.tenant_id, config=WriterConfig(max_batch=10, txn_lag_limit=5))
    third = requested(tick(defs, instance))[a.tenant_id]
    assert third not in (first, second)
    assert requested(tick(defs, instance))[a.tenant_id] == third


def test_after_a_lost_lake_each_rebuilt_batch_gets_a_new_key(conn, lake, defs, instance):
    """A backfill rebuilds a lost tenant one batch per run; the sensor must carry on from there
    even though the rebuilt frontier and the outbox look exactly as they did before the loss."""
    a = seed_tenant(conn)
    more_acts(conn, a, 20)
    small = WriterConfig(max_batch=10, txn_lag_limit=5)
    seen = []
    while (key := requested(tick(defs, instance)).get(a.tenant_id)) is not None:
        seen.append(key)
        drain_tenant(conn, lake, a.tenant_id, config=small)  # one run: one batch
    assert len(seen) >= 3 and len(set(seen)) == len(seen)

    delete_tenant_prefix(lake, a.tenant_id)
    drain_tenant(conn, lake, a.tenant_id, config=small)  # the backfill's run: the first batch again

    key = requested(tick(defs, instance))[a.tenant_id]
    assert key not in seen


def test_a_gap_is_reported_on_the_outbox_and_the_run_waits_for_nothing(conn, lake, defs, instance):
    a = seed_tenant(conn)
    tick(defs, instance)
    last_journal = conn.execute(
        "SELECT last_journal_seq FROM oml.sequencer_tenant WHERE tenant_id = %s", (a.tenant_id,)
    ).fetchone()[0]
    # A row two positions ahead: the act in between is not visible yet.
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, '{}')",
        (a.tenant_id, last_journal + 2, "journal.event"),
    )

    data = tick(defs, instance)

    gaps = [e for e in data.asset_events if e.asset_key == OUTBOX]
    assert len(gaps) == 1 and gaps[0].partition == a.tenant_id
    assert gaps[0].metadata["missing_journal_seq"].value == last_journal + 1
    assert gaps[0].metadata["rows_waiting_behind_gap"].value == 1


@given(
    tenants=st.lists(st.uuids().map(str), unique=True, max_size=40).map(sorted),
    most=st.integers(min_value=1, max_value=12),
    start=st.none() | st.uuids().map(str),
)
@settings(max_examples=200, deadline=None)
def test_taking_turns_visits_every_tenant_within_its_share_of_ticks(tenants, most, start):
    """Each tick takes at most `most` tenants, none twice, in id order from its cursor; ticks
    that each start after the last one taken visit every tenant within ceil(n / most) ticks."""
    seen: list[str] = []
    after = start
    for _ in range(-(-len(tenants) // most) if tenants else 1):
        taken = sensors.taking_turns(tenants, after, most)
        assert len(taken) == min(most, len(tenants)) and len(set(taken)) == len(taken)
        assert set(taken) <= set(tenants)
        seen += taken
        after = taken[-1] if taken else after
    assert set(seen) == set(tenants)


def test_a_tick_hands_the_daemon_a_bounded_share_of_many_tenants(
    conn, lake, defs, instance, monkeypatch
):
    """The daemon adds each new partition and stores each event with a storage
    connection of its own, so a tick adds at most MOST_NEW_PARTITIONS_PER_TICK partitions and
    reports the outbox of at most MOST_OUTBOX_EVENTS_PER_TICK tenants, in turns; runs are asked
    only for tenants that are partitions; the rest come on the next ticks."""
    monkeypatch.setattr(sensors, "MOST_NEW_PARTITIONS_PER_TICK", 2)
    monkeypatch.setattr(sensors, "MOST_OUTBOX_EVENTS_PER_TICK", 2)
    works = sorted((seed_tenant(conn, bad=False) for _ in range(5)), key=lambda w: w.tenant_id)
    ids = [w.tenant_id for w in works]
    cursor, reported, asked = None, [], set()
    for n in range(3):
        data = tick(defs, instance, cursor)
        cursor = data.cursor
        added = [k for r in data.dynamic_partitions_requests or [] for k in r.partition_keys]
        assert added == ids[2 * n : 2 * n + 2]  # the next two unknown tenants, in id order
        known = set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME))
        assert set(requested(data)) <= known
        asked |= set(requested(data))
        events = [e.partition for e in data.asset_events if e.asset_key == OUTBOX]
        assert len(events) == 2 and set(events) <= known
        reported += events
        for work in works:
            more_acts(conn, work, 1)  # every tenant has rows for the next tick's cut
    assert set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)) == set(ids)
    assert set(reported) == set(ids)  # the outbox of each tenant reported in turn
    assert asked == set(ids)
