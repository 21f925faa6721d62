"""Shard runs (ADR 0027): the outbox sensor keeps one run per shard of tenants; a shard run
drains only its shard's pending tenants, leaves alone a tenant another run holds, and reports
each tenant's commits to that tenant's partition. Real Postgres, real Delta tables, a real
(temporary) Dagster instance; the last test runs a real `dagster-daemon`."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    build_sensor_context,
    instance_for_test,
)
from hypothesis import given
from hypothesis import strategies as st

from oml_dagster.defs.assets import TABLE_OF
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import LakeResource, PostgresResource, WriterResource
from oml_dagster.defs.shards import SHARD_TAG, shard_of
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.write.drain import DrainPolicy, drain

from .dagster_support import (
    BIN,
    REPO,
    background,
    dagster_home,
    fresh_database,
    more_acts,
    seed_tenant,
    subprocess_env,
    wait_for,
)
from .test_sensor import add_run

SILVER = AssetKey(["silver", "claims"])


def resources(shards: int, *, standing: bool = False, cap: float = 5) -> dict:
    """Shard runs that end at their first idle pass unless `standing` (ADR 0032)."""
    writer = WriterResource(drain_shards=shards, shard_drain_seconds=cap, shard_standing=standing)
    return {"postgres": PostgresResource(), "lake": LakeResource(), "writer": writer}


def tick(defs, instance, shards: int, *, standing: bool = False):
    sensor = defs.get_sensor_def("outbox_sensor")
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        resources=resources(shards, standing=standing),
    ) as context:
        data = sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return data


def tenants_of_shards(conn, lake, shards: int, want: dict[int, int]) -> dict[int, list]:
    """Seeded tenants, `want[k]` of them in shard k (tenant ids are random: draw until found)."""
    found: dict[int, list] = {k: [] for k in want}
    while any(len(found[k]) < n for k, n in want.items()):
        work = seed_tenant(conn)
        k = shard_of(work.tenant_id, shards)
        if k in found and len(found[k]) < want[k]:
            found[k].append(work)
        else:  # drained away so it does not count as pending
            drain(conn, lake, [work.tenant_id], policy=DrainPolicy(until_idle=True))
    return found


@given(st.uuids(), st.integers(min_value=1, max_value=64))
def test_every_tenant_is_in_exactly_one_shard(tenant, shards):
    tenant_id = str(tenant)
    k = shard_of(tenant_id, shards)
    assert 0 <= k < shards
    assert [s for s in range(shards) if shard_of(tenant_id, shards) == s] == [k]
    assert shard_of(tenant_id, shards) == k  # stable


def test_shards_spread_tenants_evenly():
    shards = 8
    counts = [0] * shards
    for i in range(8000):
        counts[shard_of(str(uuid.UUID(int=i * 7919 + 13, version=4)), shards)] += 1
    assert min(counts) > 800 and max(counts) < 1200, counts


def test_the_sensor_requests_one_run_per_shard_with_pending_tenants(conn, lake, defs, instance):
    by_shard = tenants_of_shards(conn, lake, 3, {0: 2, 2: 1})

    data = tick(defs, instance, 3)

    runs = {r.tags[SHARD_TAG]: r for r in data.run_requests}
    assert set(runs) == {"0/3", "2/3"}, runs
    for tag, request in runs.items():
        assert request.job_name == "lake_writer_shard_job"
        config = request.run_config["ops"]["drain_shard"]["config"]
        assert (config["shard"], config["shards"]) == (int(tag[0]), 3)
        assert request.tags["oml/pending_tenants"] == str(len(by_shard[int(tag[0])]))
    # Every tenant is a partition, whatever the run mode.
    partitions = set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME))
    assert {w.tenant_id for ws in by_shard.values() for w in ws} <= partitions

    # The same pending state asks under the same keys; a shard whose run is in flight is not
    # asked for again.
    again = tick(defs, instance, 3)
    assert {r.run_key for r in again.run_requests} == {r.run_key for r in runs.values()}
    add_shard_run(instance, "0/3", DagsterRunStatus.STARTED)
    busy = tick(defs, instance, 3)
    assert {r.tags[SHARD_TAG] for r in busy.run_requests} == {"2/3"}

    # The per-tenant mode is still there: 0 shards, one lake-writer run per tenant.
    per_tenant = tick(defs, instance, 0)
    assert {r.job_name for r in per_tenant.run_requests} == {"lake_writer_job"}
    assert len(per_tenant.run_requests) == 3


def test_standing_runs_are_kept_for_every_shard_pending_or_not(conn, lake, defs, instance):
    """With standing shard runs (the default, ADR 0032) each tick asks for a run for every shard
    with none in flight, whether its tenants have pending ops or not."""
    tenants_of_shards(conn, lake, 3, {1: 1})

    data = tick(defs, instance, 3, standing=True)
    runs = {r.tags[SHARD_TAG]: r for r in data.run_requests}
    assert set(runs) == {"0/3", "1/3", "2/3"}
    assert runs["1/3"].tags["oml/pending_tenants"] == "1"
    assert runs["0/3"].tags["oml/pending_tenants"] == "0"

    add_shard_run(instance, "0/3", DagsterRunStatus.STARTED)
    add_shard_run(instance, "2/3", DagsterRunStatus.QUEUED)
    busy = tick(defs, instance, 3, standing=True)
    assert {r.tags[SHARD_TAG] for r in busy.run_requests} == {"1/3"}
    # An idle shard's run is keyed by the tick's time: it is asked for again once its last
    # run has ended (the same key would make Dagster skip it).
    from oml_dagster.defs.sensors import shard_requests

    def idle_key(now):
        (request,) = shard_requests(instance, [], {}, 1, standing=True, now=now)
        return request.run_key

    first = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
    assert idle_key(first) == idle_key(first)
    assert idle_key(first + dt.timedelta(seconds=30)) != idle_key(first)
    assert WriterResource().resolve().standing is True


def test_a_standing_run_near_its_cap_gets_its_successor_queued_once(instance):
    """The handover (ADR 0032): once the shard's only run in flight has run `handover_after`
    seconds, the sensor asks for its successor, keyed by that run's id, so the successor waits
    in the queue and starts when it ends; not before that, and not for a shard already
    holding a successor."""
    from dagster._core.events import DagsterEvent, DagsterEventType

    from oml_dagster.defs.sensors import shard_requests

    running = add_shard_run(instance, "0/2", DagsterRunStatus.STARTED)
    start = DagsterEvent(
        event_type_value=DagsterEventType.RUN_START.value, job_name="lake_writer_shard_job"
    )
    instance.report_dagster_event(start, run_id=running.run_id)
    add_shard_run(instance, "1/2", DagsterRunStatus.STARTED)
    add_shard_run(instance, "1/2", DagsterRunStatus.QUEUED)  # its successor, already queued
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    late = soon + dt.timedelta(seconds=300)

    def asked(now):
        requests = shard_requests(instance, [], {}, 2, standing=True, handover_after=250, now=now)
        return {r.tags[SHARD_TAG]: r.run_key for r in requests}

    assert asked(soon) == {}
    assert asked(late) == {"0/2": f"shard:0/2:after:{running.run_id}"}
    assert asked(late + dt.timedelta(seconds=30)) == asked(late)  # the same key: asked once
    no_handover = shard_requests(instance, [], {}, 2, standing=True, now=late)
    assert no_handover == []
    assert WriterResource(shard_standing=False).resolve().standing is False
    # A cap of 0 s (one pass per run) cannot stand: the sensor then asks only for pending shards.
    assert WriterResource(shard_standing=True, shard_drain_seconds=0).resolve().standing is False


def test_a_standing_shard_run_drains_ops_that_arrive_while_it_waits(
    conn, lake, defs, instance, dsn
):
    """A standing run outlives its shard's backlog: ops written after it went idle are drained
    and reported by the same run, which ends at its cap."""
    import threading
    import time

    import psycopg

    (work,) = tenants_of_shards(conn, lake, 1, {0: 1})[0]
    tick(defs, instance, 1)

    def later() -> None:
        time.sleep(3)
        with psycopg.connect(dsn, autocommit=True) as other:
            more_acts(other, work, n=3)

    writer = threading.Thread(target=later)
    job = defs.resolve_job_def("lake_writer_shard_job")
    started = time.monotonic()
    writer.start()
    result = job.execute_in_process(
        run_config={"ops": {"drain_shard": {"config": {"shard": 0, "shards": 1}}}},
        instance=instance,
        resources=resources(1, standing=True, cap=8),
    )
    writer.join()
    took = time.monotonic() - started

    assert result.success
    assert took >= 8
    total = conn.execute(
        "SELECT count(*), max(seq) FROM oml.outbox WHERE tenant_id = %s", (work.tenant_id,)
    ).fetchone()
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []
    records = instance.fetch_materializations(SILVER, limit=100).records
    mine = [r for r in records if r.partition_key == work.tenant_id]
    read = sum(r.asset_materialization.metadata["ops_in_batch"].value for r in mine)
    assert read == total[0]  # the late ops too, by this run


def add_shard_run(instance, tag: str, status: DagsterRunStatus):
    run = add_run(instance, "unused", status, job="lake_writer_shard_job")
    instance.add_run_tags(run.run_id, {SHARD_TAG: tag})
    return run


def test_a_shard_run_drains_its_tenants_only_and_reports_each_partition(conn, lake, defs, instance):
    by_shard = tenants_of_shards(conn, lake, 2, {0: 3, 1: 1})
    mine, held = by_shard[0][:2], by_shard[0][2]
    other = by_shard[1][0]
    tick(defs, instance, 2)  # partitions for every tenant
    # A backfill of one of the shard's tenants is running: the shard run leaves it alone.
    add_run(instance, held.tenant_id, DagsterRunStatus.STARTED)

    job = defs.resolve_job_def("lake_writer_shard_job")
    result = job.execute_in_process(
        run_config={"ops": {"drain_shard": {"config": {"shard": 0, "shards": 2}}}},
        instance=instance,
        resources=resources(2),
    )

    assert result.success
    for work in mine:
        assert len(list(tenant_tables(lake, work.tenant_id))) == 5, work.tenant_id
    for untouched in (held, other):
        assert not list(tenant_tables(lake, untouched.tenant_id))
    for key in TABLE_OF:
        materialized = instance.get_materialized_partitions(key)
        assert materialized == {w.tenant_id for w in mine}, key
    records = instance.fetch_materializations(SILVER, limit=10).records
    by_partition = {r.partition_key: r.asset_materialization.metadata for r in records}
    for work in mine:
        meta = by_partition[work.tenant_id]
        assert meta["ops_dead_lettered"].value == work.bad_ops
        assert meta["lag_ops"].value == 0
        assert meta["batches"].value >= 1


def test_a_shard_report_on_postgres_storage_keeps_each_tenants_partition_and_metadata(
    conn, lake, defs, monkeypatch
):
    """The report is stored as one batch per asset (ADR 0063) by dagster-postgres, the deployed
    storage, whose batch write differs from SQLite's: every asset holds each tenant's partition
    with that tenant's own figures, each materialization stored once."""
    # What the run sets for itself (a run worker's process), undone after the test.
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    works = list(tenants_of_shards(conn, lake, 1, {0: 3})[0])
    with fresh_database("oml_shard_report") as pg:
        storage = {
            "postgres_db": {
                "scheme": "postgresql+psycopg2",
                "hostname": pg["DAGSTER_PG_HOST"],
                "port": int(pg["DAGSTER_PG_PORT"]),
                "username": pg["DAGSTER_PG_USER"],
                "password": pg["DAGSTER_PG_PASSWORD"],
                "db_name": pg["DAGSTER_PG_DB"],
            }
        }
        with instance_for_test(overrides={"storage": {"postgres": storage}}) as instance:
            tick(defs, instance, 1)
            job = defs.resolve_job_def("lake_writer_shard_job")
            result = job.execute_in_process(
                run_config={"ops": {"drain_shard": {"config": {"shard": 0, "shards": 1}}}},
                instance=instance,
                resources=resources(1),
            )
            assert result.success
            for key in TABLE_OF:
                assert instance.get_materialized_partitions(key) == {w.tenant_id for w in works}
            records = instance.fetch_materializations(SILVER, limit=10).records
            by_partition = {r.partition_key: r.asset_materialization.metadata for r in records}
            assert set(by_partition) == {w.tenant_id for w in works}
            for work in works:
                assert by_partition[work.tenant_id]["ops_dead_lettered"].value == work.bad_ops
            stored = instance.get_records_for_run(result.run_id, limit=1000).records
            materializations = [
                r
                for r in stored
                if r.event_log_entry.is_dagster_event
                and r.event_log_entry.dagster_event.is_step_materialization
            ]
            assert len(materializations) == len(TABLE_OF) * len(works)


def test_a_bad_shard_setting_is_refused(monkeypatch):
    for bad in ("-2", "four", "1.5"):
        monkeypatch.setenv("OML_DRAIN_SHARDS", bad)
        with pytest.raises(ValueError, match=f"OML_DRAIN_SHARDS='{bad}'"):
            WriterResource().resolve()
    monkeypatch.setenv("OML_DRAIN_SHARDS", "0")
    assert WriterResource().resolve().shards == 0
    monkeypatch.delenv("OML_DRAIN_SHARDS")
    assert WriterResource().resolve().shards == 4
    assert WriterResource(drain_shards=2).resolve().shards == 2


def test_the_daemon_keeps_shard_runs_that_drain_every_tenant(conn, lake, tmp_path, monkeypatch):
    """The default deployment: a real daemon on the repository's dagster.yaml launches shard
    runs (no run per tenant), standing ones for every shard; every tenant's lake is drained and
    materialized on its partition, and ops that arrive later are drained too."""
    works = [seed_tenant(conn) for _ in range(3)]
    with fresh_database("oml_dagster_shards") as pg:
        home = dagster_home(tmp_path / "dagster_home")
        env = subprocess_env(
            DAGSTER_HOME=str(home),
            OML_DAGSTER_AUTOSTART="1",
            OML_SENSOR_INTERVAL_SECONDS="5",
            OML_SHARD_RUN_SECONDS="3",
            **pg,
        )
        env.pop("OML_DRAIN_SHARDS", None)  # the default
        for name, value in {"DAGSTER_HOME": str(home), **pg}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.get()
        daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]

        def drained() -> bool:
            return all(
                instance.get_materialized_partitions(SILVER) >= {w.tenant_id for w in works}
                for _ in [0]
            )

        with background(daemon, env, tmp_path / "daemon.log"):
            wait_for(drained, timeout=120, interval=1, what="every tenant drained by shard runs")
            more_acts(conn, works[0], n=2)
            before = len(instance.get_runs(RunsFilter(job_name="lake_writer_shard_job")))
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM oml.outbox o WHERE o.tenant_id = %s AND (o.seq IS NULL"
                        " OR o.seq > (SELECT min(batch_end) FROM oml.lake_frontier f"
                        " WHERE f.tenant_id = o.tenant_id AND f.table_name NOT LIKE 'gold.curated/%%'))",
                        (works[0].tenant_id,),
                    ).fetchone()[0]
                    == 0
                ),
                timeout=90,
                interval=1,
                what="the later ops drained",
            )
            # Before the daemon stops: it interrupts the runs it launched that are in flight.
            runs = instance.get_runs(RunsFilter(job_name="lake_writer_shard_job"))
        assert len(runs) >= before >= 1
        assert not instance.get_runs(RunsFilter(job_name="lake_writer_job"))
        # Standing runs (the default): every shard has had one, though three tenants leave at
        # least one of the four with nothing pending.
        assert {r.tags[SHARD_TAG] for r in runs} == {f"{k}/4" for k in range(4)}
        failed = {
            r.run_id: [
                e.message
                for e in instance.all_logs(r.run_id)
                if e.dagster_event is not None and e.dagster_event.is_failure
            ]
            for r in runs
            if r.status == DagsterRunStatus.FAILURE
        }
        assert not failed, failed


def test_a_long_shard_run_reports_each_tenant_as_it_goes(conn, lake, defs, instance, monkeypatch):
    """Materializations come every REPORT_SECONDS (here: after every pass), each covering the
    batches since the last one: together they account for every op the run read."""
    from oml_dagster.defs import shards

    monkeypatch.setattr(shards, "REPORT_SECONDS", 0.0)
    (work,) = tenants_of_shards(conn, lake, 1, {0: 1})[0]
    tick(defs, instance, 1)
    small = {
        **resources(1),
        "writer": WriterResource(
            drain_shards=1, shard_drain_seconds=60, max_batch=6, shard_standing=False
        ),
    }
    job = defs.resolve_job_def("lake_writer_shard_job")
    result = job.execute_in_process(
        run_config={"ops": {"drain_shard": {"config": {"shard": 0, "shards": 1}}}},
        instance=instance,
        resources=small,
    )
    assert result.success
    records = instance.fetch_materializations(SILVER, limit=100).records
    mine = [r for r in records if r.partition_key == work.tenant_id]
    assert len(mine) > 2, len(mine)
    read = sum(r.asset_materialization.metadata["ops_in_batch"].value for r in mine)
    total = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s", (work.tenant_id,)
    ).fetchone()[0]
    assert read == total
    batches = sum(r.asset_materialization.metadata["batches"].value for r in mine)
    assert batches >= len(mine)


def test_a_broken_tenant_does_not_stop_its_shard(conn, lake, defs, instance):
    """A tenant whose lake cannot be written (a file where its prefix should be) fails alone:
    the shard's other tenants are drained and reported, and the run fails naming it."""
    from pathlib import Path

    healthy, broken = tenants_of_shards(conn, lake, 1, {0: 2})[0]
    Path(lake.root).mkdir(parents=True, exist_ok=True)
    Path(lake.tenant_uri(broken.tenant_id)).write_text("not a directory")
    tick(defs, instance, 1)

    job = defs.resolve_job_def("lake_writer_shard_job")
    result = job.execute_in_process(
        run_config={"ops": {"drain_shard": {"config": {"shard": 0, "shards": 1}}}},
        instance=instance,
        resources=resources(1),
        raise_on_error=False,
    )

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert broken.tenant_id in failure.step_failure_data.error.message
    assert healthy.tenant_id not in failure.step_failure_data.error.message
    assert len(list(tenant_tables(lake, healthy.tenant_id))) == 5
    assert instance.get_materialized_partitions(SILVER) == {healthy.tenant_id}
