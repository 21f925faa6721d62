"""Freshness per tenant: `lake_freshness_sensor` ticks against a real database and a real Dagster
instance, and bronze/events' `fresh_within_bound` check shows on each tenant's partition what
the UI shows: a tenant whose oldest undrained outbox row is older than the bound fails (naming
the lag), a drained one passes, a stuck one stays failed, and a quiet tick reports nothing."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    build_sensor_context,
    partition_loading_context,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
)
from hypothesis import given
from hypothesis import strategies as st

from oml_dagster.defs import freshness
from oml_dagster.defs.freshness import (
    FRESHNESS_CHECK,
    LEVELS,
    NO_POINT,
    PLOT_COLUMNS,
    FreshnessSettings,
    build_freshness_sensor,
    sparkline,
)
from oml_dagster.defs.jobs import LAKE_ASSET_KEYS
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from oml_dagster.defs.resources import build_resources
from oml_dagster.lake.audit.freshness import tenant_lags
from oml_dagster.lake.ingest import sequencer
from oml_dagster.simulate import producer

from .dagster_support import (
    BIN,
    REPO,
    background,
    dagster_home,
    fresh_database,
    seed_tenant,
    subprocess_env,
    wait_for,
)
from .test_sensor import add_run

BRONZE = AssetKey(["bronze", "events"])


def tick(defs, instance, sensor=None) -> list:
    """One evaluation of the freshness sensor (the cursor carried from the previous tick, as the
    daemon carries it) and the run it requests, executed; the check evaluations reported."""
    sensor = sensor or defs.get_sensor_def("lake_freshness_sensor")
    cursor = instance.run_storage.get_cursor_values({"freshness-test"}).get("freshness-test")
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        resources=build_resources(),
        cursor=cursor,
    ) as context:
        data = sensor.evaluate_tick(context)
    if data.cursor is not None:  # as the daemon stores it: a tick without a cursor clears it
        instance.run_storage.set_cursor_values({"freshness-test": data.cursor})
    else:
        instance.run_storage.set_cursor_values({"freshness-test": ""})
    assert len(data.run_requests) <= 1  # one run per tick, whatever the tenant count
    reported = []
    for request in data.run_requests:
        result = defs.resolve_job_def("lake_freshness_job").execute_in_process(
            run_config=request.run_config, instance=instance
        )
        assert result.success
        reported += result.get_asset_check_evaluations()
    return reported


def latest(instance, tenant_id: str):
    """The tenant partition's latest evaluation of the check: (status, evaluation)."""
    found = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [FRESHNESS_CHECK], partition_filter=PartitionKeyFilter(key=tenant_id)
    )
    record = found.get(FRESHNESS_CHECK)
    if record is None:
        return None, None
    return record.status, record.event.dagster_event.event_specific_data


def ui_statuses(instance) -> dict[str, set[str]]:
    """What the UI's partition view of the check shows: status → partitions. An evaluation stops
    counting for a partition once the asset partition is materialized again."""
    with partition_loading_context(dynamic_partitions_store=instance):
        state = instance.event_log_storage.get_asset_check_state(
            [(FRESHNESS_CHECK, tenant_partitions)]
        )
    subsets = state[FRESHNESS_CHECK].subsets
    return {
        status.value: set(subset.subset_value.get_partition_keys())
        for status, subset in subsets.items()
        if not subset.is_empty
    }


def age(conn, tenant_id: str, seconds: int) -> None:
    """Make the tenant's outbox rows `seconds` older than they are."""
    conn.execute(
        "UPDATE oml.outbox SET created_at = created_at - make_interval(secs => %s)"
        " WHERE tenant_id = %s",
        (seconds, tenant_id),
    )


def drain_run(defs, instance, tenant_id: str):
    result = defs.resolve_job_def("lake_writer_job").execute_in_process(
        partition_key=tenant_id, instance=instance
    )
    assert result.success
    return result


def test_a_lagging_tenant_fails_on_its_partition_until_drained(conn, lake, defs, instance):
    lagging, drained = seed_tenant(conn), seed_tenant(conn)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [lagging.tenant_id, drained.tenant_id])
    run = drain_run(defs, instance, drained.tenant_id)
    # The run checks freshness after its drain too (a backfill or UI launch): nothing waits.
    [in_run] = [
        e for e in run.get_asset_check_evaluations() if e.check_name == "fresh_within_bound"
    ]
    assert in_run.passed and in_run.partition == drained.tenant_id
    age(conn, lagging.tenant_id, 3600)  # written an hour ago, never drained: no run drains it

    data = tick(defs, instance)
    assert {e.partition for e in data} == {lagging.tenant_id, drained.tenant_id}

    status, evaluation = latest(instance, lagging.tenant_id)
    assert status == AssetCheckExecutionRecordStatus.FAILED
    assert evaluation.severity == AssetCheckSeverity.ERROR
    lag = evaluation.metadata["lag_seconds"].value
    assert 3600 <= lag < 3700
    assert evaluation.description.startswith(f"lag {lag:.0f} s, past the bound of 300 s")
    assert "no lake-writer run is queued or running" in evaluation.description
    ops = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s", (lagging.tenant_id,)
    ).fetchone()[0]
    assert evaluation.metadata["ops_waiting"].value == ops
    assert evaluation.metadata["drained_through"].value == 0
    assert evaluation.metadata["lake_writer_run_in_flight"].value is False

    status, evaluation = latest(instance, drained.tenant_id)
    assert status == AssetCheckExecutionRecordStatus.SUCCEEDED
    assert evaluation.metadata["lag_seconds"].value == 0.0
    assert evaluation.target_materialization_data is not None
    assert ui_statuses(instance) == {
        "FAILED": {lagging.tenant_id},
        "SUCCEEDED": {drained.tenant_id},
    }

    # Still stuck a tick later: still FAILED, not reported again until its lag has doubled.
    assert tick(defs, instance) == []
    age(conn, lagging.tenant_id, 3700)
    data = tick(defs, instance)
    assert [e.partition for e in data] == [lagging.tenant_id]
    assert data[0].metadata["lag_seconds"].value >= 2 * lag
    assert ui_statuses(instance)["FAILED"] == {lagging.tenant_id}

    # A run drains it: the next tick reports it back within the bound, on the new
    # materialization, so the UI shows it as passing.
    drain_run(defs, instance, lagging.tenant_id)
    data = tick(defs, instance)
    assert {e.partition for e in data} == {lagging.tenant_id}
    status, evaluation = latest(instance, lagging.tenant_id)
    assert status == AssetCheckExecutionRecordStatus.SUCCEEDED
    assert evaluation.description == "nothing waits: every outbox row is in every core table"
    assert ui_statuses(instance) == {"SUCCEEDED": {lagging.tenant_id, drained.tenant_id}}
    assert tick(defs, instance) == []


def test_a_materialization_makes_the_tenant_due_again(conn, lake, defs, instance):
    work = seed_tenant(conn)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
    [event] = tick(defs, instance)
    assert event.passed and event.target_materialization_data is None  # young rows, no run yet
    assert ui_statuses(instance) == {"SUCCEEDED": {work.tenant_id}}
    drain_run(defs, instance, work.tenant_id)
    # Dagster shows an evaluation as current only until the partition's next materialization:
    # the run's own check is current now; the sensor's next tick evaluates against it again.
    [event] = tick(defs, instance)
    assert event.partition == work.tenant_id and event.passed
    assert event.target_materialization_data is not None
    assert ui_statuses(instance) == {"SUCCEEDED": {work.tenant_id}}
    assert tick(defs, instance) == []


def test_unsequenced_rows_count_and_a_bound_is_configurable(conn, lake, defs, instance):
    held = producer.create_tenant(conn)
    seed_tenant(conn, held, bad=False)  # written, never sequenced: the sensor's cut never ran
    age(conn, held.tenant_id, 600)
    [lag] = tenant_lags(conn).values()
    assert lag.ops_waiting == 0 and lag.ops_unsequenced > 0 and lag.last_seq is None
    assert 600 <= lag.seconds < 700
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [held.tenant_id])

    lenient = build_freshness_sensor(FreshnessSettings(bound_seconds=3600), autostart=True)
    [event] = tick(defs, instance, lenient)
    assert event.passed
    assert event.metadata["bound_seconds"].value == 3600.0
    assert "within the bound of 3600 s" in event.description

    strict = build_freshness_sensor(FreshnessSettings(bound_seconds=60), autostart=True)
    [event] = tick(defs, instance, strict)
    assert not event.passed
    assert event.metadata["ops_unsequenced"].value == lag.ops_unsequenced
    assert "past the bound of 60 s" in event.description


def test_quiet_ticks_report_nothing_and_new_partitions_come_a_page_at_a_time(
    conn, defs, instance, monkeypatch
):
    monkeypatch.setattr(freshness, "NEW_PER_TICK", 10)
    tenants = sorted(str(uuid.uuid4()) for _ in range(25))
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, tenants)
    seen = [sorted(e.partition for e in tick(defs, instance)) for _ in range(4)]
    assert [len(s) for s in seen] == [10, 10, 5, 0]
    assert sorted(t for s in seen for t in s) == tenants
    assert ui_statuses(instance) == {"SUCCEEDED": set(tenants)}
    # A partition added later is evaluated on the next tick.
    late = str(uuid.uuid4())
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [late])
    assert [e.partition for e in tick(defs, instance)] == [late]


def test_a_run_reports_the_tenant_lag_on_every_table(conn, lake, defs, instance, monkeypatch):
    """The lake-writer's materializations carry the lag the check judges (`drain_lag_*`), the
    same on every table: a capped run (one batch of 4 ops) leaves the rest waiting."""
    monkeypatch.setenv("OML_RUN_DRAIN_SECONDS", "0")
    monkeypatch.setenv("OML_MAX_BATCH", "4")
    work = seed_tenant(conn)
    sequencer.sequence(conn)
    age(conn, work.tenant_id, 120)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
    result = defs.resolve_job_def("lake_writer_job").execute_in_process(
        partition_key=work.tenant_id, instance=instance, asset_selection=LAKE_ASSET_KEYS
    )
    assert result.success
    found = {
        e.event_specific_data.materialization.asset_key.to_user_string(): (
            e.event_specific_data.materialization.metadata
        )
        for e in result.get_asset_materialization_events()
    }
    assert len([k for k in found if k != "reconciler/erasure_evidence"]) == 5
    total = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s", (work.tenant_id,)
    ).fetchone()[0]
    lags = {
        (m["drain_lag_ops"].value, m["drain_lag_seconds"].value)
        for k, m in found.items()
        if k != "reconciler/erasure_evidence"
    }
    [(ops, seconds)] = lags  # one number for the tenant, on every table
    assert ops == total - 4
    assert 120 <= seconds < 220


def test_a_tick_waits_for_the_freshness_run_in_flight(conn, defs, instance):
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [str(uuid.uuid4())])
    assert len(tick(defs, instance)) == 1  # the partition judged once
    cursor = instance.run_storage.get_cursor_values({"freshness-test"})["freshness-test"]
    running = add_run(instance, "-", DagsterRunStatus.STARTED, job="lake_freshness_job")
    late = str(uuid.uuid4())
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [late])
    assert tick(defs, instance) == []  # no second run while one is in flight
    assert instance.run_storage.get_cursor_values({"freshness-test"})["freshness-test"] == cursor
    instance.report_run_canceled(running)
    assert [e.partition for e in tick(defs, instance)] == [late]  # only the new one


@pytest.mark.parametrize("value", ["5m", "0", "-30", "nan", "inf"])
def test_a_bad_bound_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=rf"OML_FRESHNESS_BOUND_SECONDS='{value}': expected"):
        FreshnessSettings.from_env({"OML_FRESHNESS_BOUND_SECONDS": value})


def test_settings_come_from_the_environment():
    assert FreshnessSettings.from_env({}) == FreshnessSettings(300.0, 60)
    assert FreshnessSettings.from_env(
        {"OML_FRESHNESS_BOUND_SECONDS": "900", "OML_FRESHNESS_INTERVAL_SECONDS": " 15 "}
    ) == FreshnessSettings(900.0, 15)
    with pytest.raises(ValueError, match="OML_FRESHNESS_INTERVAL_SECONDS='2.5': expected whole"):
        FreshnessSettings.from_env({"OML_FRESHNESS_INTERVAL_SECONDS": "2.5"})


PROBE = (
    "from oml_dagster.definitions import defs\n"
    "r = defs.get_repository_def()\n"
    "s = r.get_sensor_def('lake_freshness_sensor')\n"
    "print(s.minimum_interval_seconds, s.default_status.value)\n"
)


def load(**extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE],
        env=subprocess_env(**extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_code_location_reads_the_settings_and_refuses_a_bad_one():
    done = load(OML_FRESHNESS_INTERVAL_SECONDS="20", OML_DAGSTER_AUTOSTART="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["20", "RUNNING"]
    done = load(OML_DAGSTER_AUTOSTART="0")
    assert done.stdout.split() == ["60", "STOPPED"]
    done = load(OML_FRESHNESS_BOUND_SECONDS="five minutes")
    assert done.returncode != 0
    assert "OML_FRESHNESS_BOUND_SECONDS='five minutes': expected seconds" in done.stderr


def test_the_daemon_flags_a_stuck_tenant_and_passes_a_drained_one(
    conn, lake, tmp_path, monkeypatch
):
    """A real daemon with the repository's dagster.yaml (Postgres storage, the run queue): the
    outbox sensor's runs drain one tenant; the other's runs fail (a file stands where its lake
    prefix should be), so nothing drains it, and the freshness sensor flags it on its partition."""
    flowing = seed_tenant(conn)
    stuck = seed_tenant(conn)
    age(conn, stuck.tenant_id, 900)
    Path(lake.root).mkdir(parents=True, exist_ok=True)
    Path(lake.tenant_uri(stuck.tenant_id)).write_text("not a directory")
    with fresh_database("oml_dagster_freshness") as pg:
        home = dagster_home(tmp_path / "dagster_home")
        env = subprocess_env(
            DAGSTER_HOME=str(home),
            OML_DAGSTER_AUTOSTART="1",
            OML_SENSOR_INTERVAL_SECONDS="5",
            OML_FRESHNESS_INTERVAL_SECONDS="5",
            OML_FRESHNESS_BOUND_SECONDS="120",
            OML_DRAIN_SHARDS="0",  # a run per tenant: the stuck one's runs fail on their own
            **pg,
        )
        for name, value in {"DAGSTER_HOME": str(home), **pg}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.get()
        daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]
        with background(daemon, env, tmp_path / "daemon.log"):

            def judged():
                statuses = ui_statuses(instance)
                return (
                    stuck.tenant_id in statuses.get("FAILED", set())
                    and flowing.tenant_id in statuses.get("SUCCEEDED", set())
                    and statuses
                )

            statuses = wait_for(judged, timeout=120, interval=1, what="both tenants judged")
            runs = instance.get_runs()  # before the daemon stops (it interrupts runs it launches)
        writer = [r for r in runs if r.job_name == "lake_writer_job"]
        assert flowing.tenant_id in {r.tags["dagster/partition"] for r in writer}
        failed = {
            r.tags["dagster/partition"] for r in writer if r.status == DagsterRunStatus.FAILURE
        }
        assert failed <= {stuck.tenant_id}
        judging = [r.status for r in runs if r.job_name == "lake_freshness_job"]
        assert judging and DagsterRunStatus.FAILURE not in judging  # the last may still run
        status, evaluation = latest(instance, stuck.tenant_id)
        assert status == AssetCheckExecutionRecordStatus.FAILED
        waiting = evaluation.metadata["ops_waiting"].value
        assert waiting + evaluation.metadata["ops_unsequenced"].value > 0
        assert evaluation.metadata["lag_seconds"].value >= 900
        assert "past the bound of 120 s" in evaluation.description
        assert statuses["SUCCEEDED"] >= {flowing.tenant_id}
        instance.dispose()


def test_a_tenant_s_check_carries_its_lag_plot_over_time(conn, lake, defs, instance):
    """The partition's evaluation plots the tenant's own lag: its lake-writer reports and earlier
    checks, then now. A tenant stuck since its last drain shows low columns, a gap, and the
    highest column last."""
    tenant = seed_tenant(conn)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [tenant.tenant_id])
    drain_run(defs, instance, tenant.tenant_id)  # reports lag 0, and checks it in the run
    assert [e.passed for e in tick(defs, instance)] == [True]  # judged once, at lag 0
    seed_tenant(conn, tenant.keys)  # more of its ops, never drained
    age(conn, tenant.tenant_id, 3600)
    [evaluation] = tick(defs, instance)
    assert not evaluation.passed
    plot = evaluation.metadata["lag_over_time"].value
    _, line, legend = plot.split("`")
    assert len(line) == PLOT_COLUMNS
    assert line[0] == LEVELS[0] and line[-1] == LEVELS[-1]
    assert NO_POINT in line  # nothing was measured between the checks
    # The drain run's report and its in-run check, the first tick's check, and now.
    assert legend.split(" points")[0].strip() == "4"
    assert f"greatest lag {evaluation.metadata['lag_seconds'].value:.0f} s" in legend


POINTS = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
        st.floats(min_value=0, max_value=1e5, allow_nan=False),
    ),
    min_size=1,
    max_size=200,
)


@given(POINTS)
def test_the_lag_plot_is_one_column_per_slice_of_time_with_the_peak_on_top(points):
    line = sparkline(points)
    times = [at for at, _ in points]
    assert len(line) == (PLOT_COLUMNS if max(times) > min(times) else 1)
    assert set(line) <= set(LEVELS) | {NO_POINT}
    # The first and last slices hold the first and last points; the greatest lag is drawn full
    # height (when there is any lag), and nothing is drawn higher than its slice's greatest lag.
    assert line[0] != NO_POINT and line[-1] != NO_POINT
    top = max(lag for _, lag in points)
    if top > 0:
        assert LEVELS[-1] in line
    else:
        assert set(line) <= {LEVELS[0], NO_POINT}
    assert sum(c != NO_POINT for c in line) <= len(points)
