"""Recovery by backfill, end to end on a real daemon: the outbox sensor fills the lake, a tenant's
lake prefix is deleted, and `dagster job backfill` over that tenant's partition rebuilds its
tables row for row from the outbox, then checks them."""

from __future__ import annotations

import subprocess

from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

from oml_dagster.lake.policy import lag

from .dagster_support import (
    BIN,
    REPO,
    backfill_command,
    background,
    dagster_home,
    delete_tenant_prefix,
    fresh_database,
    lake_snapshot,
    seed_tenant,
    subprocess_env,
    table_versions,
    wait_for,
)

FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def lake_runs(instance, **tags) -> list:
    return instance.get_runs(RunsFilter(job_name="lake_writer_job", tags=tags or None))


def test_backfill_rebuilds_a_deleted_tenant_prefix(conn, lake, tmp_path, monkeypatch):
    lost, kept = seed_tenant(conn), seed_tenant(conn)
    with fresh_database("oml_dagster_backfill") as pg:
        home = dagster_home(tmp_path / "dagster_home")
        env = subprocess_env(
            DAGSTER_HOME=str(home),
            OML_DAGSTER_AUTOSTART="1",
            OML_SENSOR_INTERVAL_SECONDS="5",
            # The sensor's runs are one per tenant here (shard runs: test_shards.py).
            OML_DRAIN_SHARDS="0",
            **pg,
        )
        for name, value in {"DAGSTER_HOME": str(home), **pg}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.get()
        daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]
        with background(daemon, env, tmp_path / "daemon.log"):
            # The sensor sequences the outbox, adds both tenants and launches one run each.
            wait_for(
                lambda: (
                    len(lake_runs(instance)) == 2
                    and all(r.status in FINISHED for r in lake_runs(instance))
                ),
                timeout=90,
                interval=0.5,
                what="the sensor's first runs",
            )
            sensor_runs = lake_runs(instance)
            assert {r.status for r in sensor_runs} == {DagsterRunStatus.SUCCESS}
            assert {r.tags["dagster/partition"] for r in sensor_runs} == {
                lost.tenant_id,
                kept.tenant_id,
            }
            assert all(r.tags["dagster/sensor_name"] == "outbox_sensor" for r in sensor_runs)
            before = lake_snapshot(lake, lost.tenant_id)
            kept_versions = table_versions(lake, kept.tenant_id)
            assert len(before) == 5

            delete_tenant_prefix(lake, lost.tenant_id)

            done = subprocess.run(
                backfill_command([lost.tenant_id]),
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            wait_for(
                lambda: (
                    (runs := lake_runs(instance, **{"dagster/partition": lost.tenant_id}))
                    and len(runs) == 2
                    and all(r.status in FINISHED for r in runs)
                ),
                timeout=90,
                interval=0.5,
                what="the backfill run",
            )

        (backfill_run,) = [r for r in lake_runs(instance) if "dagster/backfill" in r.tags]
        assert backfill_run.status == DagsterRunStatus.SUCCESS, (
            tmp_path / "daemon.log"
        ).read_text()[-3000:]
        assert backfill_run.tags["dagster/partition"] == lost.tenant_id

        # The tables are back, row for row; the other tenant was not touched.
        assert lake_snapshot(lake, lost.tenant_id) == before
        assert table_versions(lake, kept.tenant_id) == kept_versions
        last_seq = conn.execute(
            "SELECT max(seq) FROM oml.outbox WHERE tenant_id = %s", (lost.tenant_id,)
        ).fetchone()[0]
        assert lag(conn, lost.tenant_id, last_seq) == (0, 0.0)

        # The backfill ran the reconciler checks on the rebuilt tables, stored per partition.
        check = AssetCheckKey(AssetKey(["silver", "claims"]), "erased_rows_carry_no_body")
        (record,) = instance.event_log_storage.get_asset_check_execution_history(check, limit=5)
        assert record.run_id == backfill_run.run_id
        assert record.partition == lost.tenant_id
        assert record.event.dagster_event.event_specific_data.passed

        # The sensor never asked twice for a batch: two tenants, one batch each, two runs.
        sensor_keys = [
            r.tags["dagster/run_key"] for r in lake_runs(instance) if "dagster/run_key" in r.tags
        ]
        assert len(sensor_keys) == len(set(sensor_keys)) == 2
        instance.dispose()
