"""The code location loads, and its shape is pinned: asset keys, groups, dependencies,
partitions, checks, jobs, sensors, schedules, and the instance and workspace files."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
import yaml
from dagster import (
    AssetKey,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    build_schedule_context,
    instance_for_test,
)

from oml_dagster.defs import maintenance
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import DeploymentSettings

from .dagster_support import BIN, REPO, subprocess_env

TICK = dt.datetime(2026, 1, 1, 4, tzinfo=dt.UTC)


def key(path: str) -> AssetKey:
    return AssetKey(path.split("/"))


EXPECTED_ASSETS = {
    # key: (group, upstream keys)
    "postgres/outbox": ("postgres", set()),
    "bronze/events": ("bronze", {"postgres/outbox"}),
    "silver/claims": ("silver", {"postgres/outbox"}),
    "gold/lineage": ("gold", {"silver/claims"}),
    "gold/areas": ("gold", {"bronze/events"}),
    "gold/curated": ("gold", {"silver/claims", "gold/areas"}),
    "reconciler/erasure_evidence": ("reconciler", {"silver/claims", "gold/curated"}),
    "analytics/event_volume": ("analytics", {"bronze/events"}),
    "analytics/lake_lag": (
        "analytics",
        {
            "postgres/outbox",
            "bronze/events",
            "silver/claims",
            "gold/lineage",
            "gold/areas",
            "gold/curated",
        },
    ),
    "analytics/claims_by_state": ("analytics", {"silver/claims", "gold/areas"}),
    "analytics/lineage_stats": ("analytics", {"gold/lineage", "silver/claims"}),
}
ANALYTICS_ASSETS = {k for k in EXPECTED_ASSETS if k.startswith("analytics/")}
LAKE_TABLES = (
    set(EXPECTED_ASSETS) - {"postgres/outbox", "reconciler/erasure_evidence"} - ANALYTICS_ASSETS
)
LAKE_ASSETS = LAKE_TABLES | {"reconciler/erasure_evidence"}
EXPECTED_CHECKS = {
    ("bronze/events", "tenant_id_matches_partition"),
    ("silver/claims", "tenant_id_matches_partition"),
    ("gold/lineage", "tenant_id_matches_partition"),
    ("gold/areas", "tenant_id_matches_partition"),
    ("gold/curated", "tenant_id_matches_partition"),
    ("silver/claims", "erased_rows_carry_no_body"),
    ("gold/curated", "erased_rows_carry_no_body"),
    ("gold/curated", "curated_agrees_with_silver"),
    ("silver/claims", "erasure_slo_holds"),
    ("bronze/events", "journal_chain_verifies"),
    ("silver/claims", "bodies_match_digests"),
    ("silver/claims", "agrees_with_outbox"),
    ("gold/lineage", "agrees_with_outbox"),
    ("gold/areas", "agrees_with_outbox"),
    ("silver/claims", "no_open_dead_letters"),
    ("gold/curated", "no_simulation_tainted_rows"),
    *((table, "frontier_matches_delta_log") for table in LAKE_TABLES),
}
ANALYTICS_CHECKS = {(a, "second_reader_agrees") for a in ANALYTICS_ASSETS}
# Reported per tenant by lake_freshness_sensor's runs, not by the reconcile schedule's.
FRESHNESS_CHECKS = {("bronze/events", "fresh_within_bound")}


@pytest.fixture(scope="module")
def defs():
    from oml_dagster.definitions import defs

    return defs


@pytest.fixture(scope="module")
def repo(defs):
    return defs.get_repository_def()


def test_asset_graph_is_pinned(repo):
    graph = repo.asset_graph
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == set(EXPECTED_ASSETS)
    for path, (group, upstream) in EXPECTED_ASSETS.items():
        node = graph.get(key(path))
        assert node.group_name == group, path
        assert {p.to_user_string() for p in node.parent_keys} == upstream, path
        assert isinstance(node.partitions_def, DynamicPartitionsDefinition), path
        assert node.partitions_def.name == TENANT_PARTITIONS_NAME, path
    # The outbox is external (observed, never materialized by this code location); the five
    # lake tables are one multi-asset, written by one step; the erasure evidence is its own.
    assert not graph.get(key("postgres/outbox")).is_executable
    lake_nodes = {graph.get(key(p)) for p in LAKE_ASSETS}
    assert all(n.is_executable for n in lake_nodes)
    assert len({id(graph.get(key(p)).assets_def) for p in LAKE_TABLES}) == 1
    evidence = graph.get(key("reconciler/erasure_evidence")).assets_def
    assert evidence is not graph.get(key("silver/claims")).assets_def
    # Each analytics asset is its own step: one can be rematerialized without the others.
    assert len({id(graph.get(key(p)).assets_def) for p in ANALYTICS_ASSETS}) == 4
    assert TENANT_PARTITIONS_NAME == "oml_lake_tenants"


def test_lake_tables_show_their_columns_with_the_spec_meaning(repo):
    from oml_dagster.lake.model.tables import GOLD_CURATED, SILVER_CLAIMS

    for path, spec in (("silver/claims", SILVER_CLAIMS), ("gold/curated", GOLD_CURATED)):
        metadata = repo.asset_graph.get(key(path)).metadata
        columns = {c.name: c for c in metadata["dagster/column_schema"].columns}
        assert list(columns) == list(spec.columns), path
        assert columns["state"].description.startswith("promoted | demoted | erased | held")
        assert columns["body_ciphertext"].constraints.nullable
        assert not columns["artifact_id"].constraints.nullable
    lineage = repo.asset_graph.get(key("gold/lineage")).metadata["dagster/column_schema"]
    # The spec gives proposed_at no meaning: no description rather than an empty one.
    assert {c.name: c.description for c in lineage.columns}["proposed_at"] is None


def test_asset_checks_are_pinned_and_partitioned(repo):
    graph = repo.asset_graph
    found = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert found == EXPECTED_CHECKS | ANALYTICS_CHECKS | FRESHNESS_CHECKS
    for check_key in graph.asset_check_keys:
        partitions_def = graph.get(check_key).partitions_def
        assert partitions_def is not None and partitions_def.name == TENANT_PARTITIONS_NAME


def test_jobs_are_pinned(repo):
    names = {j.name for j in repo.get_all_jobs() if not j.name.startswith("__")}
    expected = {
        "lake_writer_job",
        "lake_writer_shard_job",
        "lake_analytics_job",
        "lake_freshness_job",
        "tenant_export_job",
        "tenant_purge_job",
        *(j.name for j in maintenance.MAINTENANCE_JOBS),
    }
    assert names == expected
    job = repo.get_job("lake_writer_job")
    assert job.executor_def.name == "in_process"
    # The sensor's lake-writer runs never materialize the analytics.
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == LAKE_ASSETS
    analytics_job = repo.get_job("lake_analytics_job")
    assert {
        k.to_user_string() for k in analytics_job.asset_layer.selected_asset_keys
    } == ANALYTICS_ASSETS
    assert job.partitions_def.name == TENANT_PARTITIONS_NAME
    # Every tenant-touching job is tenant-partitioned, so the per-tenant run limit holds for it;
    # the shard job's runs name their shard instead (oml/shard, limited in dagster.yaml). The
    # freshness job only reads Postgres, for many tenants in one run: not partitioned.
    assert repo.get_job("lake_freshness_job").partitions_def is None
    for j in repo.get_all_jobs():
        if not j.name.startswith("__") and j.name not in (
            "lake_writer_shard_job",
            "lake_freshness_job",
        ):
            assert j.partitions_def is not None, j.name
            assert j.partitions_def.name == TENANT_PARTITIONS_NAME, j.name
    assert repo.get_job("lake_writer_shard_job").executor_def.name == "in_process"


def test_sensors_and_schedules_are_pinned(repo):
    sensors = {s.name: s for s in repo.sensor_defs}
    assert set(sensors) == {"outbox_sensor", "lake_freshness_sensor", "departure_sensor"}
    assert sensors["departure_sensor"].job_name == "tenant_purge_job"
    sensor = sensors["outbox_sensor"]
    assert {t.job_name for t in sensor.targets} == {"lake_writer_job", "lake_writer_shard_job"}
    assert sensor.minimum_interval_seconds == 30
    freshness = sensors["lake_freshness_sensor"]
    assert freshness.job_name == "lake_freshness_job"
    assert freshness.minimum_interval_seconds == 60
    # Production defaults keep the promises: the sensors and every schedule start running.
    assert {s.default_status for s in sensors.values()} == {DefaultSensorStatus.RUNNING}
    assert {s.default_status.value for s in repo.schedule_defs} == {"RUNNING"}
    schedules = {s.name for s in repo.schedule_defs}
    assert schedules == {
        "reconcile_schedule",
        "daily_analytics_schedule",
        *(s.name for s in maintenance.build_schedules(DeploymentSettings())),
    }
    assert repo.get_schedule_def("reconcile_schedule").job_name == "lake_writer_job"
    assert repo.get_schedule_def("daily_analytics_schedule").job_name == "lake_analytics_job"


def test_analytics_schedule_requests_one_run_per_tenant(repo):
    schedule = repo.get_schedule_def("daily_analytics_schedule")
    with instance_for_test() as instance:
        with build_schedule_context(
            instance=instance, repository_def=repo, scheduled_execution_time=TICK
        ) as context:
            assert schedule.evaluate_tick(context).skip_message
        instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, ["t1", "t2"])
        with build_schedule_context(
            instance=instance, repository_def=repo, scheduled_execution_time=TICK
        ) as context:
            requests = schedule.evaluate_tick(context).run_requests
    assert sorted(r.partition_key for r in requests) == ["t1", "t2"]
    assert len({r.run_key for r in requests}) == 2


AUTOMATION_PROBE = (
    "from oml_dagster.definitions import defs\n"
    "r = defs.get_repository_def()\n"
    "s = r.get_sensor_def('outbox_sensor')\n"
    "c = r.get_schedule_def('reconcile_schedule')\n"
    "print(s.minimum_interval_seconds, s.default_status.value,"
    " ','.join(sorted({d.default_status.value for d in r.schedule_defs})), c.cron_schedule)"
)


def load_definitions(**extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", AUTOMATION_PROBE],
        env=subprocess_env(**extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_automation_settings_come_from_the_environment():
    done = load_definitions(
        OML_SENSOR_INTERVAL_SECONDS="5",
        OML_DAGSTER_AUTOSTART="1",
        OML_RECONCILE_CRON="*/10 * * * *",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "RUNNING", "RUNNING", "*/10", "*", "*", "*", "*"]


def test_autostart_is_on_unless_switched_off():
    for value in ("", "1", "true", "YES"):
        done = load_definitions(OML_DAGSTER_AUTOSTART=value)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[1:3] == ["RUNNING", "RUNNING"], value
    for value in ("0", "false", "No"):
        done = load_definitions(OML_DAGSTER_AUTOSTART=value)
        assert done.returncode == 0, done.stderr
        # Sensor, then every schedule (reconcile, maintenance, analytics): all stopped.
        assert done.stdout.split()[1:3] == ["STOPPED", "STOPPED"], value


def test_an_unrecognised_autostart_value_is_refused():
    done = load_definitions(OML_DAGSTER_AUTOSTART="maybe")
    assert done.returncode != 0
    assert "OML_DAGSTER_AUTOSTART='maybe'" in done.stderr


def test_reconcile_schedule_requests_checks_only_per_tenant(defs, repo):
    schedule = repo.get_schedule_def("reconcile_schedule")
    with instance_for_test() as instance:
        with build_schedule_context(
            instance=instance, repository_def=repo, scheduled_execution_time=TICK
        ) as context:
            assert schedule.evaluate_tick(context).skip_message
        instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, ["t1", "t2"])
        with build_schedule_context(
            instance=instance, repository_def=repo, scheduled_execution_time=TICK
        ) as context:
            requests = schedule.evaluate_tick(context).run_requests
    assert sorted(r.partition_key for r in requests) == ["t1", "t2"]
    for request in requests:
        assert list(request.asset_selection) == [key("reconciler/erasure_evidence")]
        assert {(k.asset_key.to_user_string(), k.name) for k in request.asset_check_keys} == (
            EXPECTED_CHECKS
        )


def test_instance_file_sets_the_lease():
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    db = config["storage"]["postgres"]["postgres_db"]
    assert db["scheme"] == "postgresql+psycopg2"
    assert {db[k]["env"] for k in ("hostname", "port", "username", "password", "db_name")} == {
        "DAGSTER_PG_HOST",
        "DAGSTER_PG_PORT",
        "DAGSTER_PG_USER",
        "DAGSTER_PG_PASSWORD",
        "DAGSTER_PG_DB",
    }
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    runs = config["concurrency"]["runs"]
    assert isinstance(runs["max_concurrent_runs"], int)
    assert runs["tag_concurrency_limits"] == [
        {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
        {"key": "oml/shard", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
    ]
    # The run coordinator's own limits would conflict with (and be refused next to) this block.
    assert "max_concurrent_runs" not in config["run_coordinator"].get("config", {})
    assert "tag_concurrency_limits" not in config["run_coordinator"].get("config", {})


def test_workspace_loads_with_the_dagster_cli(tmp_path):
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "oml_dagster.definitions"
    done = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO,
        env=subprocess_env(DAGSTER_HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "oml_lake" in done.stdout + done.stderr
