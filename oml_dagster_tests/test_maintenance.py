"""Lake maintenance on real tables: compaction, Z-order, checkpoints, retention properties, the
writer's skip rule across maintenance commits, the `maintain` command and the Dagster jobs and
schedules."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from dagster import (
    DagsterInstance,
    Definitions,
    RunRequest,
    build_schedule_context,
    instance_for_test,
)
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import PARTITION_NAME_TAG
from dagster._utils.tags import TagConcurrencyLimitsCounter
from deltalake import DeltaTable, write_deltalake

from oml_dagster import cli
from oml_dagster.defs import maintenance as maintenance_defs
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from oml_dagster.defs.resources import DeploymentSettings, LakeResource, PostgresResource
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import (
    APP_ID,
    BRONZE_EVENTS,
    GOLD_CURATED,
    SILVER_CLAIMS,
    TableId,
)
from oml_dagster.lake.store import deltalog, maintenance, rewrites
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.conformance._support import footer_stats
from oml_dagster_tests.dagster_support import table_versions
from oml_dagster_tests.helpers import (
    BeforeEachCommit,
    claim,
    column_chunks,
    drain_all,
    lake_snapshot,
    make_tree,
    new_id,
    promoted,
)

DAY = dt.timedelta(days=1)
REPO = Path(__file__).resolve().parent.parent


# --- helpers -----------------------------------------------------------------------------------


def txn_versions(lake: Lake, tenant_id: str) -> dict[str, int | None]:
    return {
        str(table_id): lake.open(uri).transaction_version(APP_ID)
        for table_id, _, uri in tenant_tables(lake, tenant_id)
    }


def files_by_partition(lake: Lake, uri: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in lake.open(uri).file_uris():
        part = os.path.dirname(os.path.relpath(path, uri))
        counts[part] = counts.get(part, 0) + 1
    return counts


def commit_actions(uri: str, version: int) -> dict[str, int]:
    """How many actions of each kind one commit holds (its JSON in the log)."""
    counts: dict[str, int] = {}
    for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        for kind in json.loads(line):
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def small_batches(conn, lake, keys, *, claims: int = 8, days: int = 3) -> list[acts.Claim]:
    """One drain per act, so every table collects small files: claims over `days` bronze
    partitions in two areas, an edge, a validation (a curated table) and a demote in it."""
    tree = make_tree(conn, keys)
    drain_all(conn, lake)
    now = dt.datetime.now(dt.UTC)
    made = []
    for i in range(claims):
        workarea, path = (tree.a, "u.a") if i % 2 else (tree.b, "u.b")
        c = claim(workarea, path)
        body = f"body {i} of {c.artifact_id}".encode()
        acts.promote(conn, keys, c, body, at=now - (i % days) * DAY)
        made.append(c)
        drain_all(conn, lake)
    acts.ratify(conn, keys, acts.Edge(new_id(), made[0].artifact_id, made[1].artifact_id))
    drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.b, status="committed")
    acts.validate_area(conn, keys, tree.b)
    drain_all(conn, lake)
    acts.demote(conn, keys, made[2])
    drain_all(conn, lake)
    return made


# --- compaction --------------------------------------------------------------------------------


def test_compaction_leaves_one_file_per_partition_and_every_row(conn, lake, tenant):
    small_batches(conn, lake, tenant)
    bronze_uri = lake.table_uri(tenant.tenant_id, BRONZE_EVENTS)
    before_partitions = files_by_partition(lake, bronze_uri)
    assert len(before_partitions) == 3 and all(n > 1 for n in before_partitions.values())
    rows, txns = lake_snapshot(lake, tenant.tenant_id), txn_versions(lake, tenant.tenant_id)

    results = maintenance.compact(conn, lake, tenant.tenant_id)

    by_table = {r.table: r for r in results}
    assert set(by_table) == set(rows)
    for table_id, _, uri in tenant_tables(lake, tenant.tenant_id):
        assert set(files_by_partition(lake, uri).values()) == {1}, table_id
        assert by_table[str(table_id)].files_after == len(files_by_partition(lake, uri))
    assert files_by_partition(lake, bronze_uri).keys() == before_partitions.keys()
    bronze = by_table[BRONZE_EVENTS.name]
    assert bronze.files_before == sum(before_partitions.values()) and bronze.files_after == 3
    assert bronze.files_removed == bronze.files_before and bronze.files_added == 3
    assert bronze.bytes_removed > 0 and bronze.version_after == bronze.version_before + 1
    assert lake_snapshot(lake, tenant.tenant_id) == rows
    assert txn_versions(lake, tenant.tenant_id) == txns

    # The rewritten body-bearing files carry no footer statistics for the ciphertext.
    for name, spec, uri in tenant_tables(lake, tenant.tenant_id):
        for path in lake.open(uri).file_uris():
            for column in column_chunks(path):
                if column.path_in_schema in spec.body_columns:
                    stats = column.statistics
                    assert stats is None or not stats.has_min_max, (name, path)

    # Nothing left to pack: no commit.
    again = maintenance.compact(conn, lake, tenant.tenant_id)
    assert {r.action for r in again} == {"unchanged"}
    assert all(r.version_after == r.version_before for r in again)


def _writer_packs(uri: str) -> list[int]:
    """Versions of the table committed by the writer's compaction on the way (ADR 0033)."""
    return [h["version"] for h in DeltaTable(uri).history() if h.get("oml.trigger") == "writer"]


def test_the_writer_packs_small_files_on_the_way_and_changes_no_row(
    conn, lake, tenant, tmp_path, monkeypatch
):
    """A drain of micro-batches (one drain per act) bin-packs each table's small files every
    SMALL_FILES_EVERY versions: the file count stays bounded, the packing commits carry no app
    transaction, the ciphertext gets no footer statistics, and every row equals a rebuild of
    the same outbox in one drain without any packing."""
    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 4)
    small_batches(conn, lake, tenant, claims=14, days=1)
    bronze_uri = lake.table_uri(tenant.tenant_id, BRONZE_EVENTS)
    bronze = lake.open(bronze_uri)
    assert bronze.version() > 12  # without packing: a file per drain
    assert len(bronze.file_uris()) <= 4
    packs = _writer_packs(bronze_uri)
    assert packs and all(v % 4 == 1 for v in packs)  # right after a writer commit at 4k
    for version in packs:
        assert "txn" not in commit_actions(bronze_uri, version)
    silver_uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    for path in lake.open(silver_uri).file_uris():
        for column, stats in footer_stats(path).items():
            if column in SILVER_CLAIMS.body_columns:
                assert stats is None or not stats[0], path

    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 2**62)
    other = Lake(str(tmp_path / "rebuilt"))
    drain(conn, other, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert not _writer_packs(other.table_uri(tenant.tenant_id, BRONZE_EVENTS))
    assert lake_snapshot(other, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)
    # The packed tables' app transactions still fence: draining again writes nothing.
    versions = table_versions(lake, tenant.tenant_id)
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert table_versions(lake, tenant.tenant_id) == versions


def test_a_packing_that_loses_a_race_is_left_for_later(conn, lake, tenant, dsn, monkeypatch):
    """Another process's bin-pack of the same tenant lands between a batch and the writer's
    packing: the packing finds the table moved and leaves it for later; the drains go on, and
    nothing is lost or doubled (two rewrites of the same files, both committed, would double
    rows: delta-rs 1.6 lets both through)."""
    import psycopg

    from oml_dagster.lake.write import writer

    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 3)
    raced: list[str] = []
    pack = rewrites.compact_small_files

    def racing(conn_, table, spec, *, tenant_id, table_id, hooks):
        if not raced and table.version() % 3 == 0 and len(table.file_uris()) > 1:
            with psycopg.connect(dsn, autocommit=True) as elsewhere:
                results = maintenance.compact(elsewhere, lake, tenant_id)
            raced.extend(r.table for r in results if r.action == "rewrote")
        return pack(conn_, table, spec, tenant_id=tenant_id, table_id=table_id, hooks=hooks)

    monkeypatch.setattr(writer, "compact_small_files", racing)
    small_batches(conn, lake, tenant, claims=8, days=1)

    assert raced  # the race happened, and the drains went on past it
    other = Lake(lake.root + "-rebuilt")
    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 2**62)
    drain(conn, other, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(other, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)


def test_the_writer_does_not_pack_a_table_another_rewrite_holds(
    conn, lake, tenant, dsn, monkeypatch
):
    """While another session holds a table's rewrite lock (a maintenance OPTIMIZE under way),
    the writer's packing leaves that table alone, and packs it once the lock is free."""
    import psycopg

    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 2)
    bronze_uri = lake.table_uri(tenant.tenant_id, BRONZE_EVENTS)
    with (
        psycopg.connect(dsn, autocommit=True) as elsewhere,
        rewrites.rewrite_lock(elsewhere, tenant.tenant_id, TableId(BRONZE_EVENTS.name)) as held,
    ):
        assert held
        made = small_batches(conn, lake, tenant, claims=6, days=1)
        assert lake.open(bronze_uri).version() > 6
        assert not _writer_packs(bronze_uri)
        bronze = TableId(BRONZE_EVENTS.name)
        with rewrites.rewrite_lock(conn, tenant.tenant_id, bronze, wait=False) as mine:
            assert not mine
    for i in range(4):
        later = claim(made[0].workarea_id, made[0].workarea_path_at_write)
        acts.promote(conn, tenant, later, f"later {i}".encode())
        drain_all(conn, lake)
    assert _writer_packs(bronze_uri)


# --- Z-order -----------------------------------------------------------------------------------


def test_zorder_then_a_demote_rewrites_one_file(conn, lake, tenant):
    """A silver table of several thousand rows (bulk rows appended straight to the table, no
    app transaction, so a Z-order writes several files), Z-ordered, then one claim demoted: the
    demote's commit replaces one data file of silver and one of curated, and adds bronze's."""
    made = small_batches(conn, lake, tenant, claims=6, days=1)
    silver_uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    silver = lake.open(silver_uri)
    template = read_rows(silver, SILVER_CLAIMS)[0]
    workareas = sorted({r["workarea_id"] for r in read_rows(silver, SILVER_CLAIMS)})
    rng = random.Random(7)
    bulk = [
        dict(
            template,
            artifact_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            claim_key=new_id(),
            workarea_id=rng.choice(workareas),
            body_ciphertext=rng.randbytes(64),
        )
        for _ in range(10_000)
    ]
    for start in range(0, len(bulk), 2_000):
        write_deltalake(
            silver,
            pa.Table.from_pylist(bulk[start : start + 2_000], schema=SILVER_CLAIMS.schema),
            mode="append",
            writer_properties=maintenance.writer_properties(SILVER_CLAIMS),
        )
    txns = txn_versions(lake, tenant.tenant_id)

    results = maintenance.zorder(conn, lake, tenant.tenant_id, target_size=256 * 1024)

    zordered = {r.table: r for r in results}
    assert set(zordered) == {
        SILVER_CLAIMS.name,
        "gold.lineage",
        next(n for n in zordered if n.startswith(GOLD_CURATED.name)),
    }
    assert zordered[SILVER_CLAIMS.name].action == "rewrote"
    files = len(lake.open(silver_uri).file_uris())
    assert files >= 3, f"Z-order wrote {files} files"
    assert txn_versions(lake, tenant.tenant_id) == txns

    target = made[4]  # in the validated area: silver and curated both change
    acts.demote(conn, tenant, target)
    drain_all(conn, lake)

    silver = lake.open(silver_uri)
    touched = commit_actions(silver_uri, silver.version())
    assert touched.get("remove") == 1 and touched.get("add") == 1, touched
    assert len(silver.file_uris()) == files
    (curated_name, _, curated_uri) = next(
        t for t in tenant_tables(lake, tenant.tenant_id) if t.spec is GOLD_CURATED
    )
    curated = lake.open(curated_uri)
    assert commit_actions(curated_uri, curated.version()).get("remove") == 1, curated_name
    row = next(
        r
        for r in read_rows(silver, SILVER_CLAIMS)
        if (r["artifact_id"], r["version"]) == (target.artifact_id, target.version)
    )
    assert row["state"] == "demoted"


# --- the writer's skip rule across maintenance -------------------------------------------------


def test_drain_maintain_drain_again_no_duplicates(conn, lake, tenant, tmp_path):
    """Maintenance commits carry no app transaction; the writer's txn version survives them, a
    second drain is a no-op, and later batches land exactly as on a lake never maintained."""
    made = small_batches(conn, lake, tenant)
    txns = txn_versions(lake, tenant.tenant_id)

    maintenance.maintain(conn, lake, tenant.tenant_id, task="all")
    assert txn_versions(lake, tenant.tenant_id) == txns

    passes = drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert not any(b.committed for p in passes for b in p.batches)

    # More acts after maintenance: a promote, an erase in the curated area, an edge demote.
    extra = claim(made[0].workarea_id, made[0].workarea_path_at_write)
    acts.promote(conn, tenant, extra, b"after maintenance")
    acts.erase(conn, tenant, made[4])
    drain_all(conn, lake)
    maintenance.maintain(conn, lake, tenant.tenant_id, task="compact")
    acts.demote(conn, tenant, extra)
    drain_all(conn, lake)

    reference = Lake(str(tmp_path / "reference"))
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    maintained = lake_snapshot(lake, tenant.tenant_id)
    assert maintained == lake_snapshot(reference, tenant.tenant_id)
    events = [r["event_id"] for r in maintained[BRONZE_EVENTS.name]]
    journal = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND op = 'journal.event'",
        (tenant.tenant_id,),
    ).fetchone()[0]
    assert len(events) == len(set(events)) == journal


def test_optimize_between_a_batchs_commits_neither_duplicates_nor_loses(
    conn, lake, tenant, tmp_path
):
    """Without the lease (a failover overlap): compaction and Z-order land between two table
    commits of one batch, on the table the writer is about to commit. The writer's commit meets
    the maintenance commit, reloads, and the skip rule still decides correctly."""
    made = small_batches(conn, lake, tenant, claims=4)
    for c in made[:2]:
        acts.demote(conn, tenant, c)
    acts.promote(conn, tenant, claim(made[0].workarea_id, made[0].workarea_path_at_write), b"x")

    def optimize_first(table_name: str) -> None:
        if table_name in (BRONZE_EVENTS.name, SILVER_CLAIMS.name):
            maintenance.compact(conn, lake, tenant.tenant_id)
            maintenance.zorder(conn, lake, tenant.tenant_id)

    sequencer.sequence(conn)
    result = drain_tenant(conn, lake, tenant.tenant_id, commits=BeforeEachCommit(optimize_first))
    assert result.committed
    drain_all(conn, lake)

    reference = Lake(str(tmp_path / "reference"))
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    maintained = lake_snapshot(lake, tenant.tenant_id)
    assert maintained == lake_snapshot(reference, tenant.tenant_id)
    events = [r["event_id"] for r in maintained[BRONZE_EVENTS.name]]
    assert len(events) == len(set(events))


# --- checkpoints and retention properties ------------------------------------------------------


def test_checkpoint_when_far_behind_or_when_commits_outlived_the_bound(conn, lake, monkeypatch):
    # A bound no commit here outlives while the suite runs (a loaded machine takes seconds over
    # the drains below); the aged case sets it to a second.
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(hours=1))
    tree = make_tree(conn, keys)
    for _ in range(3):
        acts.promote(conn, keys, claim(tree.a), b"b")
        drain_all(conn, lake)
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)

    # Fresh commits, few of them: no checkpoint.
    first = {r.table: r for r in maintenance.checkpoint(conn, lake, keys.tenant_id)}
    assert {r.action for r in first.values()} == {"unchanged"}
    assert deltalog.last_checkpoint(lake.filesystem(silver_uri)) is None

    # Far behind (the interval made small here): a checkpoint at the current version.
    monkeypatch.setattr(maintenance, "CHECKPOINT_INTERVAL", 3)
    due = {r.table: r for r in maintenance.checkpoint(conn, lake, keys.tenant_id)}
    silver = lake.open(silver_uri)
    assert due[SILVER_CLAIMS.name].action == "checkpointed"
    assert deltalog.last_checkpoint(lake.filesystem(silver_uri)) == silver.version()
    assert due[SILVER_CLAIMS.name].checkpoint_version == silver.version()
    monkeypatch.undo()

    # A new commit after the checkpoint, aged past the bound: checkpoint again so log cleanup
    # can expire it.
    conn.execute(
        "UPDATE oml.tenant_policy SET lake_erasure_bound = interval '1 second'"
        " WHERE tenant_id = %s",
        (keys.tenant_id,),
    )
    acts.promote(conn, keys, claim(tree.a), b"c")
    drain_all(conn, lake)
    acts.promote(conn, keys, claim(tree.a), b"d")
    drain_all(conn, lake)
    time.sleep(1.2)
    aged = {r.table: r for r in maintenance.checkpoint(conn, lake, keys.tenant_id)}
    assert aged[SILVER_CLAIMS.name].action == "checkpointed"
    assert deltalog.last_checkpoint(lake.filesystem(silver_uri)) == lake.open(silver_uri).version()


def test_retention_properties_follow_the_policy(conn, lake, tenant):
    """The default bound (7 days) keeps superseded files; a policy change reaches every table's
    properties at the next VACUUM, to the second."""
    small_batches(conn, lake, tenant, claims=4)
    maintenance.compact(conn, lake, tenant.tenant_id)
    superseded = {
        str(table_id): len(deltalog.list_files(lake.filesystem(uri)).data)
        - len(lake.open(uri).file_uris())
        for table_id, _, uri in tenant_tables(lake, tenant.tenant_id)
    }
    results = maintenance.vacuum(conn, lake, tenant.tenant_id)
    assert all(r.operation == maintenance.VACUUM for r in results)  # nothing to update
    for r in results:
        assert r.files_removed == 0 and r.files_after - r.live_files == superseded[r.table]

    conn.execute(
        "UPDATE oml.tenant_policy SET lake_erasure_bound = interval '45 minutes 30 seconds'"
        " WHERE tenant_id = %s",
        (tenant.tenant_id,),
    )
    results = maintenance.vacuum(conn, lake, tenant.tenant_id)
    updated = [r for r in results if r.operation == maintenance.PROPERTIES]
    assert {r.table for r in updated} == {
        str(t.table) for t in tenant_tables(lake, tenant.tenant_id)
    }
    for name, _, uri in tenant_tables(lake, tenant.tenant_id):
        config = lake.open(uri).metadata().configuration
        assert config["delta.deletedFileRetentionDuration"] == "interval 2730 seconds", name
        assert config["delta.logRetentionDuration"] == "interval 2730 seconds", name
    assert not any(r.files_removed for r in results)
    again = maintenance.vacuum(conn, lake, tenant.tenant_id)
    assert not any(r.operation == maintenance.PROPERTIES for r in again)


# --- the command line --------------------------------------------------------------------------


def test_maintain_command_prints_what_it_rewrote_removed_and_kept(conn, lake, tenant, capsys):
    other = producer.create_tenant(conn)
    for keys in (tenant, other):
        tree = make_tree(conn, keys)
        for _ in range(3):
            acts.promote(conn, keys, claim(tree.a), b"body")
            drain_all(conn, lake)

    assert cli.main(["maintain", "compact", "--tenant", tenant.tenant_id]) == 0
    out = capsys.readouterr().out
    assert f"tenant {tenant.tenant_id} silver.claims compact: rewrote 3 files" in out
    assert "live files 3 -> 1" in out and other.tenant_id not in out

    assert cli.main(["maintain", "vacuum"]) == 0
    out = capsys.readouterr().out
    for keys in (tenant, other):
        assert f"tenant {keys.tenant_id} silver.claims vacuum: removed 0 files" in out
        assert f"tenant {keys.tenant_id} silver.claims log-cleanup:" in out
        assert f"tenant {keys.tenant_id} vacuum: " in out
    assert "kept 4 on storage (1 live, 3 inside the bound)" in out


# --- Dagster -----------------------------------------------------------------------------------


def test_schedules_request_one_run_per_tenant_partition():
    tick = dt.datetime(2026, 3, 1, 4, tzinfo=dt.UTC)
    schedules = maintenance_defs.build_schedules(DeploymentSettings())
    with instance_for_test() as instance:
        repository = Definitions(
            jobs=maintenance_defs.MAINTENANCE_JOBS,
            schedules=schedules,
            resources={"postgres": PostgresResource(), "lake": LakeResource()},
        ).get_repository_def()

        def evaluate(schedule):
            with build_schedule_context(
                instance=instance, scheduled_execution_time=tick, repository_def=repository
            ) as context:
                return schedule.evaluate_tick(context)

        for schedule in schedules:
            assert evaluate(schedule).skip_message == "no tenant partitions yet"
        instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, ["t-a", "t-b"])
        for schedule in schedules:
            requests = evaluate(schedule).run_requests
            assert all(isinstance(r, RunRequest) for r in requests)
            assert sorted(r.partition_key for r in requests) == ["t-a", "t-b"]
            assert len({r.run_key for r in requests}) == 2
            assert all(tick.isoformat() in r.run_key for r in requests)


def test_schedule_cron_and_timezone_come_from_the_environment():
    defaults = maintenance_defs.build_schedules(DeploymentSettings.from_env({}))
    assert {s.name: s.cron_schedule for s in defaults} == {
        "nightly_compact_schedule": "0 2 * * *",
        "weekly_zorder_schedule": "0 3 * * 0",
        "nightly_vacuum_schedule": "0 4 * * *",
    }
    assert {s.execution_timezone for s in defaults} == {"UTC"}
    # On by default: a fresh deployment vacuums within the erasure bound without being told to.
    assert {s.default_status.value for s in defaults} == {"RUNNING"}
    env = {
        "OML_COMPACT_CRON": "15 1 * * *",
        "OML_ZORDER_CRON": "0 5 * * 6",
        "OML_VACUUM_CRON": "*/30 * * * *",
        "OML_SCHEDULE_TIMEZONE": "Europe/Berlin",
        "OML_DAGSTER_AUTOSTART": "false",
    }
    configured = maintenance_defs.build_schedules(DeploymentSettings.from_env(env))
    assert [s.cron_schedule for s in configured] == ["15 1 * * *", "0 5 * * 6", "*/30 * * * *"]
    assert {s.execution_timezone for s in configured} == {"Europe/Berlin"}
    assert {s.default_status.value for s in configured} == {"STOPPED"}
    with pytest.raises(ValueError, match="OML_DAGSTER_AUTOSTART='sometimes'"):
        DeploymentSettings.from_env({"OML_DAGSTER_AUTOSTART": "sometimes"})
    assert [s.job_name for s in configured] == ["compact_job", "zorder_job", "vacuum_job"]
    # The earlier name of the timezone variable still counts; two disagreeing names are refused.
    earlier = DeploymentSettings.from_env({"OML_MAINTENANCE_TZ": "Asia/Tokyo"})
    assert earlier.schedule_timezone == "Asia/Tokyo"
    with pytest.raises(ValueError, match="OML_MAINTENANCE_TZ='UTC' disagree"):
        DeploymentSettings.from_env(
            {"OML_SCHEDULE_TIMEZONE": "Europe/Berlin", "OML_MAINTENANCE_TZ": "UTC"}
        )


def test_maintenance_jobs_run_under_the_tenant_lease_and_report_metadata(conn, dsn, lake):
    """Each job is partitioned by the same tenant partitions as the lake writer, so its runs
    carry `dagster/partition` = the tenant (the key of the per-tenant run limit)."""
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(seconds=1))
    tree = make_tree(conn, keys)
    for _ in range(3):
        acts.promote(conn, keys, claim(tree.a), b"body")
        drain_all(conn, lake)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [keys.tenant_id])
    resources = {"postgres": PostgresResource(dsn=dsn), "lake": LakeResource(uri=lake.root)}

    for job_def in maintenance_defs.MAINTENANCE_JOBS:
        assert job_def.partitions_def == tenant_partitions

    compacted = maintenance_defs.compact_job.execute_in_process(
        partition_key=keys.tenant_id, resources=resources, instance=instance
    )
    assert compacted.success
    assert compacted.dagster_run.tags["dagster/partition"] == keys.tenant_id
    metadata = _output_metadata(compacted, "compact_tables")
    assert metadata["files_removed"] > 0 and metadata["files_after"] < metadata["files_before"]
    assert {"bytes_removed", "versions", "duration_seconds", "tables_detail"} <= set(metadata)

    time.sleep(1.2)
    vacuumed = maintenance_defs.vacuum_job.execute_in_process(
        partition_key=keys.tenant_id, resources=resources, instance=instance
    )
    assert vacuumed.success
    assert vacuumed.dagster_run.tags["dagster/partition"] == keys.tenant_id
    assert _output_metadata(vacuumed, "vacuum_tables")["files_removed"] > 0
    assert _output_metadata(vacuumed, "checkpoint_tables")["changed"] > 0
    # Expired log entries go in whichever step first reaches them (delta-rs also expires logs
    # when it writes a checkpoint or commits a VACUUM).
    steps = ("checkpoint_tables", "vacuum_tables", "cleanup_logs")
    assert sum(_output_metadata(vacuumed, s)["log_files_removed"] for s in steps) > 0


def test_the_run_queue_keeps_maintenance_and_the_writer_of_a_tenant_apart(conn, dsn, lake):
    """The deployment's per-tenant run limit (dagster.yaml), applied by Dagster's own counter to
    a real maintenance run: the tenant's lake-writer run waits while it runs and vice versa;
    another tenant's run does not."""
    keys = producer.create_tenant(conn)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [keys.tenant_id])
    resources = {"postgres": PostgresResource(dsn=dsn), "lake": LakeResource(uri=lake.root)}
    maintenance_run = maintenance_defs.vacuum_job.execute_in_process(
        partition_key=keys.tenant_id, resources=resources, instance=instance
    ).dagster_run
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]

    def writer_run(tenant_id: str) -> DagsterRun:
        return DagsterRun(job_name="lake_writer_job", tags={PARTITION_NAME_TAG: tenant_id})

    while_maintaining = TagConcurrencyLimitsCounter(limits, [maintenance_run])
    assert while_maintaining.is_blocked(writer_run(keys.tenant_id))
    assert not while_maintaining.is_blocked(writer_run(new_id()))
    while_writing = TagConcurrencyLimitsCounter(limits, [writer_run(keys.tenant_id)])
    assert while_writing.is_blocked(maintenance_run)


def _output_metadata(result, op_name: str) -> dict:
    for event in result.events_for_node(op_name):
        if event.event_type_value == "STEP_OUTPUT":
            return {k: v.value for k, v in event.step_output_data.metadata.items()}
    raise AssertionError(f"no output of {op_name}")


# --- S3 ----------------------------------------------------------------------------------------


@pytest.mark.s3
def test_maintenance_on_an_s3_lake(conn, s3_lake):
    """The same steps through the object store: listing, `_last_checkpoint`, VACUUM, cleanup."""
    lake = s3_lake
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(seconds=1))
    tree = make_tree(conn, keys)
    for _ in range(3):
        acts.promote(conn, keys, claim(tree.a), b"body")
        drain_all(conn, lake)
    rows = lake_snapshot(lake, keys.tenant_id)

    compacted = {r.table: r for r in maintenance.compact(conn, lake, keys.tenant_id)}
    assert compacted[SILVER_CLAIMS.name].files_removed == 3
    time.sleep(1.2)
    results = maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")

    by_step = {(r.table, r.operation): r for r in results}
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)
    assert by_step[(SILVER_CLAIMS.name, maintenance.VACUUM)].files_removed == 3
    assert by_step[(SILVER_CLAIMS.name, maintenance.VACUUM)].files_after == 1
    assert deltalog.last_checkpoint(lake.filesystem(silver_uri)) is not None
    assert sum(r.log_files_removed for r in results) > 0
    assert lake_snapshot(lake, keys.tenant_id) == rows


def test_tables_stay_compact_and_bounded_under_a_long_workload(conn, lake):
    """Round after round of acts, small-batch drains and the full maintenance cycle: every
    table's files on storage, live files and log entries stay bounded instead of growing."""
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(seconds=1))
    tree = make_tree(conn, keys)
    sizes = []
    for _ in range(8):
        made = [promoted(conn, keys, tree.a) for _ in range(6)]
        acts.demote(conn, keys, made[0])
        acts.erase(conn, keys, made[1])
        drain(
            conn,
            lake,
            [keys.tenant_id],
            policy=DrainPolicy(until_idle=True, config=WriterConfig(max_batch=4, txn_lag_limit=2)),
        )
        time.sleep(1.5)
        maintenance.maintain(conn, lake, keys.tenant_id, task="all")
        on_disk = {}
        for name, _, uri in tenant_tables(lake, keys.tenant_id):
            parquet = [
                f
                for _, _, files in os.walk(uri)
                for f in files
                if f.endswith(".parquet") and "checkpoint" not in f
            ]
            logs = [f for f in os.listdir(os.path.join(uri, "_delta_log")) if f.endswith(".json")]
            on_disk[name] = (len(parquet), len(logs))
        sizes.append(on_disk)
    # Bounded, not growing: each round writes several files and commits per table, so without
    # maintenance the last rounds would hold about four times the early rounds' counts. A file
    # or entry whose retention ends within a second of a run may survive one more round, so a
    # round's count swings (bronze: 1 to 7 files from one round to the next on a loaded
    # machine): the peaks of the last three rounds are held to those of the first three.
    for name in sizes[-1]:
        history = [s[name] for s in sizes]
        early = [max(counts[i] for counts in history[:3]) for i in (0, 1)]
        late = [max(counts[i] for counts in history[-3:]) for i in (0, 1)]
        assert late[0] <= 2 * early[0] + 2, (name, history)
        assert late[1] <= 2 * early[1] + 4, (name, history)
