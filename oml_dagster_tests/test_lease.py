"""The leader lease: the run queue (a real `dagster-daemon` on the repository's dagster.yaml)
never runs two runs of one tenant at once while it runs different tenants side by side; and runs
started outside the queue overlap safely because the core fences every commit."""

from __future__ import annotations

import itertools
import subprocess
import threading

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write import drain as drain_loop
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import TenantBatch
from oml_dagster_tests.helpers import BeforeEachCommit

from .dagster_support import (
    BIN,
    REPO,
    backfill_command,
    background,
    dagster_home,
    fresh_database,
    lake_snapshot,
    seed_tenant,
    subprocess_env,
    wait_for,
)

FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


@pytest.fixture
def deployment(tmp_path, dsn, lake, monkeypatch):
    """DAGSTER_HOME with the repository's dagster.yaml on a fresh Postgres database; the test
    process and every subprocess share it."""
    with fresh_database("oml_dagster_lease") as pg:
        home = dagster_home(tmp_path / "dagster_home")
        # The test launches every run itself: the sensor and schedules stay off.
        env = subprocess_env(DAGSTER_HOME=str(home), OML_DAGSTER_AUTOSTART="0", **pg)
        for name, value in {"DAGSTER_HOME": str(home), **pg}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.get()
        try:
            yield instance, env, tmp_path
        finally:
            instance.dispose()


def overlap(a, b) -> bool:
    return a.start_time < b.end_time and b.start_time < a.end_time


def test_runs_of_one_tenant_never_overlap_while_two_tenants_do(conn, lake, deployment):
    instance, env, tmp = deployment
    a, b = seed_tenant(conn, claims=60), seed_tenant(conn, claims=60)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [a.tenant_id, b.tenant_id])

    # Two backfills over both tenants, queued before any daemon runs: four runs wait, two per
    # tenant. Backfill runs carry dagster/partition like every other partitioned run.
    launches = [
        subprocess.Popen(
            backfill_command([a.tenant_id, b.tenant_id]),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    for proc in launches:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode()
    queued = instance.get_runs(RunsFilter(job_name="lake_writer_job"))
    assert len(queued) == 4
    assert {r.status for r in queued} == {DagsterRunStatus.QUEUED}
    assert sorted(r.tags["dagster/partition"] for r in queued) == sorted(
        [a.tenant_id, b.tenant_id] * 2
    )

    daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]
    with background(daemon, env, tmp / "daemon.log"):
        wait_for(
            lambda: all(
                r.status in FINISHED
                for r in instance.get_runs(RunsFilter(job_name="lake_writer_job"))
            ),
            timeout=120,
            interval=0.5,
            what="the four backfill runs to finish",
        )

    records = instance.get_run_records(RunsFilter(job_name="lake_writer_job"))
    assert {r.dagster_run.status for r in records} == {DagsterRunStatus.SUCCESS}, (
        tmp / "daemon.log"
    ).read_text()[-3000:]
    by_tenant: dict[str, list] = {a.tenant_id: [], b.tenant_id: []}
    for record in records:
        by_tenant[record.dagster_run.tags["dagster/partition"]].append(record)
    for tenant_runs in by_tenant.values():
        first, second = tenant_runs
        assert not overlap(first, second), "two runs of one tenant ran at once"
    assert any(overlap(x, y) for x in by_tenant[a.tenant_id] for y in by_tenant[b.tenant_id]), (
        "runs of different tenants were serialized"
    )

    # The second run of each tenant found its batch committed and changed nothing.
    reference = Lake(str(tmp / "reference"))
    drain(conn, reference, [a.tenant_id, b.tenant_id], policy=DrainPolicy(until_idle=True))
    for work in (a, b):
        assert lake_snapshot(lake, work.tenant_id) == lake_snapshot(reference, work.tenant_id)


def test_maintenance_and_drains_of_one_tenant_never_overlap(conn, lake, deployment):
    """Maintenance jobs are partitioned by tenant too, so the same lease serializes them with
    the tenant's lake-writer runs."""
    instance, env, tmp = deployment
    work = seed_tenant(conn, claims=60)
    sequencer.sequence(conn)
    drain(conn, lake, [work.tenant_id], policy=DrainPolicy(until_idle=True))
    seed_tenant(conn, work.keys, claims=30)  # more to drain while maintenance is queued
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
    jobs = ["compact_job", "lake_writer_job", "vacuum_job", "lake_writer_job", "zorder_job"]
    for job in jobs:
        done = subprocess.run(
            backfill_command([work.tenant_id], job),
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert len(instance.get_runs()) == len(jobs)

    daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]
    with background(daemon, env, tmp / "daemon.log"):
        wait_for(
            lambda: all(r.status in FINISHED for r in instance.get_runs()),
            timeout=180,
            interval=0.5,
            what="the maintenance and lake-writer runs to finish",
        )
    records = instance.get_run_records()
    assert {r.dagster_run.status for r in records} == {DagsterRunStatus.SUCCESS}, (
        tmp / "daemon.log"
    ).read_text()[-3000:]
    assert sorted(r.dagster_run.job_name for r in records) == sorted(jobs)
    for i, x in enumerate(records):
        for y in records[i + 1 :]:
            assert not overlap(x, y), (
                f"{x.dagster_run.job_name} and {y.dagster_run.job_name} of one tenant ran at once"
            )
    reference = Lake(str(tmp / "reference"))
    drain(conn, reference, [work.tenant_id], policy=DrainPolicy(until_idle=True))
    drain(conn, lake, [work.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, work.tenant_id) == lake_snapshot(reference, work.tenant_id)


def test_two_runs_started_outside_the_queue_are_fenced(conn, lake, tmp_path, monkeypatch):
    from oml_dagster.definitions import defs

    work = seed_tenant(conn, claims=20)
    sequencer.sequence(conn)

    # Both runs fold the same batch and reach their first commit together: a true overlap. The
    # runs drain through the core's loop (until idle); the first two bronze commits meet.
    barrier = threading.Barrier(2, timeout=60)
    bronze_commits = itertools.count()

    def before_commit(table: str) -> None:
        if table == "bronze.events" and next(bronze_commits) < 2:
            barrier.wait()

    class RacingBatch(TenantBatch):
        def __init__(self, **options):
            super().__init__(**{**options, "commits": BeforeEachCommit(before_commit)})

    monkeypatch.setattr(drain_loop, "TenantBatch", RacingBatch)
    job = defs.resolve_job_def("lake_writer_job")
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            # Each run has its own instance, closed in the thread that opened it.
            with DagsterInstance.ephemeral() as instance:
                instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
                results.append(
                    job.execute_in_process(
                        partition_key=work.tenant_id, instance=instance, raise_on_error=False
                    )
                )
        except BaseException as error:  # surfaced below, with the thread's own traceback
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 2 and all(r.success for r in results)

    def bronze(result) -> dict:
        (event,) = [
            e
            for e in result.get_asset_materialization_events()
            if e.asset_key.to_user_string() == "bronze/events"
        ]
        return {k: v.value for k, v in event.materialization.metadata.items()}

    # One run committed bronze; the other met its commit, reloaded and skipped by the txn fence.
    outcomes = sorted((bronze(r)["action"], bronze(r)["commit_attempts"]) for r in results)
    assert outcomes == [("committed", 1), ("skipped", 2)]

    reference = Lake(str(tmp_path / "reference"))
    drain(conn, reference, [work.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, work.tenant_id) == lake_snapshot(reference, work.tenant_id)
    events = lake_snapshot(lake, work.tenant_id)["bronze.events"]
    assert len(events) == len({e["journal_seq"] for e in events})
