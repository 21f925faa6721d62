"""Materializing the lake assets for a tenant partition, in process, lands the same tables as the
core's own drain, and reports each table's commit in numbers."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from dagster import AssetKey

from oml_dagster.defs.checks import LAKE_CHECK_KEYS
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import WriterResource
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import GOLD_CURATED, SILVER_CLAIMS
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import acts

from .conftest import table_rows
from .dagster_support import (
    lake_snapshot,
    materialize_partition,
    more_acts,
    seed_tenant,
    table_versions,
)

LAKE_KEYS = ["bronze/events", "silver/claims", "gold/lineage", "gold/areas", "gold/curated"]
NUMERIC = [
    "rows_written",
    "rows_added",
    "rows_updated",
    "batch_start",
    "batch_end",
    "ops_in_batch",
    "ops_new",
    "ops_applied",
    "ops_dead_lettered",
    "lag_ops",
    "lag_seconds",
    "txn_version",
]


def materialize(defs, instance, tenant_id: str) -> dict[str, dict]:
    """Run lake_writer_job for the tenant; its materializations as key → metadata values."""
    _, by_key = materialize_partition(defs, instance, "lake_writer_job", tenant_id)
    found = {key.to_user_string(): values for key, values in by_key.items()}
    assert sorted(found) == sorted([*LAKE_KEYS, "reconciler/erasure_evidence"])
    return {k: v for k, v in found.items() if k in LAKE_KEYS}


def test_a_run_lands_the_same_tables_as_the_core_drain(conn, lake, tmp_path, defs, instance):
    work = seed_tenant(conn)
    sequencer.sequence(conn)
    reference = Lake(str(tmp_path / "reference"))
    drain(conn, reference, [work.tenant_id], policy=DrainPolicy(until_idle=True))

    meta = materialize(defs, instance, work.tenant_id)

    expected = lake_snapshot(reference, work.tenant_id)
    assert set(expected) == {
        "bronze.events",
        "silver.claims",
        "gold.lineage",
        "gold.areas",
        f"gold.curated/{work.areas[1]}",
    }
    assert lake_snapshot(lake, work.tenant_id) == expected
    assert table_versions(lake, work.tenant_id) == table_versions(reference, work.tenant_id)

    last_seq = conn.execute("SELECT max(seq) FROM oml.outbox").fetchone()[0]
    for key in LAKE_KEYS:
        m = meta[key]
        for name in NUMERIC:
            assert isinstance(m[name], int | float), (key, name)
        assert (m["batch_start"], m["batch_end"], m["txn_version"]) == (0, last_seq, last_seq)
        assert m["ops_in_batch"] == m["ops_new"] == last_seq  # one tenant: every seq its own
        assert m["ops_dead_lettered"] == work.bad_ops == 1
        assert m["ops_applied"] == last_seq - 1
        assert (m["lag_ops"], m["lag_seconds"]) == (0, 0.0)
        assert m["action"] == "committed"
    rows = {key: (m["rows_added"], m["rows_updated"]) for key, m in meta.items()}
    assert rows == {
        "bronze/events": (13, 0),  # one journal event per act, the refused one's included
        "silver/claims": (4, 0),
        "gold/lineage": (1, 0),
        "gold/areas": (2, 0),
        "gold/curated": (2, 0),
    }
    assert meta["silver/claims"]["table_version"] == 0
    assert meta["gold/curated"]["curated_tables"] == 1
    assert meta["gold/curated"]["table_versions"] == {work.areas[1]: 0}


def test_the_next_batch_reports_updates_versions_and_lag(conn, lake, defs, instance, monkeypatch):
    work = seed_tenant(conn, bad=False)
    sequencer.sequence(conn)
    first = materialize(defs, instance, work.tenant_id)
    batch_end = first["bronze/events"]["batch_end"]

    more_acts(conn, work, 3)
    acts.demote(conn, work.keys, work.claims[0])  # in the validated area: silver and curated
    sequencer.sequence(conn)
    second = materialize(defs, instance, work.tenant_id)

    silver, curated, bronze = (
        second["silver/claims"],
        second["gold/curated"],
        second["bronze/events"],
    )
    assert silver["batch_start"] == batch_end
    assert silver["ops_new"] == silver["ops_applied"] == 8  # four acts: an op and an event each
    assert (silver["rows_added"], silver["rows_updated"], silver["table_version"]) == (3, 1, 1)
    assert (curated["rows_added"], curated["rows_updated"]) == (0, 1)
    assert (bronze["rows_added"], bronze["table_version"]) == (4, 1)
    # Tables the batch does not touch commit nothing and keep their txn version.
    assert second["gold/lineage"]["action"] == "unchanged"
    assert second["gold/lineage"]["rows_written"] == 0
    assert second["gold/lineage"]["table_version"] == 0

    # Nothing new: the run still reports every table, at the same place, writing nothing.
    idle = materialize(defs, instance, work.tenant_id)
    assert {m["action"] for m in idle.values()} <= {"skipped", "unchanged", "nothing pending"}
    assert {m["rows_written"] for m in idle.values()} == {0}
    assert idle["silver/claims"]["table_version"] == 1
    assert idle["silver/claims"]["txn_version"] == silver["txn_version"]

    # A run capped at one batch (cap 0), smaller than the backlog, leaves lag, in ops and in
    # seconds.
    more_acts(conn, work, 10)
    sequencer.sequence(conn)
    monkeypatch.setenv("OML_MAX_BATCH", "6")
    monkeypatch.setenv("OML_RUN_DRAIN_SECONDS", "0")
    partial = materialize(defs, instance, work.tenant_id)
    assert partial["bronze/events"]["batches"] == 1
    assert partial["bronze/events"]["ops_in_batch"] == 6
    assert partial["bronze/events"]["ops_new"] == 0  # all six re-read for the lagging table
    # The batch starts where the least advanced table (lineage, untouched) stands, so its ops
    # are older than bronze's txn: bronze skips it and still lags by the 20 new ops.
    assert partial["bronze/events"]["action"] == "skipped"
    assert partial["bronze/events"]["lag_ops"] == 20
    assert partial["bronze/events"]["lag_seconds"] > 0


def test_a_run_sequences_and_drains_its_tenant_until_idle(conn, lake, defs, instance, monkeypatch):
    """One run does the work of many: it sequences the outbox itself (no sensor tick here) and
    drains batch after batch until the tenant is idle; another tenant's backlog is not its
    business. The metadata reports the run's totals and its number of batches."""
    work, other = seed_tenant(conn, bad=False), seed_tenant(conn, bad=False)
    more_acts(conn, work, 20)
    monkeypatch.setenv("OML_MAX_BATCH", "8")
    total = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s", (work.tenant_id,)
    ).fetchone()[0]
    assert total > 3 * 8  # several batches' worth, none of it sequenced yet

    meta = materialize(defs, instance, work.tenant_id)

    last_seq = conn.execute(
        "SELECT max(seq) FROM oml.outbox WHERE tenant_id = %s", (work.tenant_id,)
    ).fetchone()[0]
    for key in LAKE_KEYS:
        m = meta[key]
        assert m["batches"] >= 4, key
        assert (m["batch_start"], m["batch_end"]) == (0, last_seq), key
        assert (m["lag_ops"], m["lag_seconds"]) == (0, 0.0), key
        assert m["ops_new"] == m["ops_applied"] == total, key
    assert meta["bronze/events"]["rows_added"] == total // 2  # an op and an event per act
    assert meta["bronze/events"]["rows_written"] == total // 2
    # The lake is what one until-idle drain of the core lands, and the other tenant is untouched.
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []
    assert lake_snapshot(lake, other.tenant_id) == {}

    # Nothing new: no batch, nothing written, and the run ends at once.
    idle = materialize(defs, instance, work.tenant_id)
    assert {m["batches"] for m in idle.values()} == {0}
    assert {m["rows_written"] for m in idle.values()} == {0}


def test_the_run_drain_cap_is_checked(monkeypatch):
    monkeypatch.setenv("OML_RUN_DRAIN_SECONDS", "soon")
    with pytest.raises(ValueError, match="OML_RUN_DRAIN_SECONDS='soon'"):
        WriterResource().resolve()
    monkeypatch.setenv("OML_RUN_DRAIN_SECONDS", "-1")
    with pytest.raises(ValueError, match="OML_RUN_DRAIN_SECONDS"):
        WriterResource().resolve()
    monkeypatch.delenv("OML_RUN_DRAIN_SECONDS")
    assert WriterResource().resolve().run_drain_seconds == 60.0
    assert WriterResource(run_drain_seconds=0).resolve().run_drain_seconds == 0.0


def test_the_reconciler_checks_run_per_partition(conn, lake, defs, instance):
    work = seed_tenant(conn)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
    job = defs.resolve_job_def("lake_writer_job")
    # A backfill or a UI run: drain, then check.
    result = job.execute_in_process(partition_key=work.tenant_id, instance=instance)
    evaluations = result.get_asset_check_evaluations()
    # The reconciler's and, after the drain, the tenant's freshness (nothing left waiting).
    [fresh] = [e for e in evaluations if e.check_name == "fresh_within_bound"]
    assert fresh.passed and fresh.metadata["lag_seconds"].value == 0.0
    evaluations = [e for e in evaluations if e is not fresh]
    assert len(evaluations) == len(LAKE_CHECK_KEYS) == 21
    # The seeded self-signed promotion is an open dead letter: the one finding.
    failed = [(e.check_name, e.metadata) for e in evaluations if not e.passed]
    assert [name for name, _ in failed] == ["no_open_dead_letters"], failed
    assert "self_signed" in failed[0][1]["sample_findings"].value[0]
    assert {e.partition for e in evaluations} == {work.tenant_id}
    by_name = {(e.asset_key.to_user_string(), e.check_name): e for e in evaluations}
    assert by_name[("silver/claims", "erased_rows_carry_no_body")].metadata["checked"].value == 1
    slo = by_name[("silver/claims", "erasure_slo_holds")].metadata
    assert slo["erased_rows"].value == 1 and slo["overdue_files"].value == 0
    assert by_name[("bronze/events", "tenant_id_matches_partition")].metadata["checked"].value == (
        13
    )
    record = instance.event_log_storage.get_asset_check_execution_history(
        evaluations[0].asset_check_key, limit=1
    )[0]
    assert record.partition == work.tenant_id
    assert AssetKey(["silver", "claims"]) in {e.asset_key for e in evaluations}

    # An operator resolves the dead letter for good: the check passes and shows who and why.
    from oml_dagster.lake.write import deadletter

    (letter,) = deadletter.list_dead_letters(conn, work.tenant_id)
    deadletter.resolve(conn, letter.seq, "ana", "forged promotion, rejected")
    again = job.execute_in_process(partition_key=work.tenant_id, instance=instance)
    [check] = [
        e for e in again.get_asset_check_evaluations() if e.check_name == "no_open_dead_letters"
    ]
    assert check.passed and check.metadata["resolved"].value == 1
    assert "resolved by ana: forged promotion" in check.metadata["sample_resolved"].value[0]


def test_the_checks_fail_on_a_corrupted_table(conn, lake, defs, instance):
    from deltalake import write_deltalake

    work = seed_tenant(conn)
    sequencer.sequence(conn)
    materialize(defs, instance, work.tenant_id)

    # Someone else's writes: a claim of the validated area again in silver, erased with its body
    # kept and under another tenant's id; and a curated row silver never held.
    silver_uri = lake.table_uri(work.tenant_id, SILVER_CLAIMS)
    (row,) = [
        r
        for r in table_rows(lake, work.tenant_id, SILVER_CLAIMS)
        if r["artifact_id"] == work.claims[0].artifact_id
    ]
    assert row["body_ciphertext"] is not None
    forged = dict(row, tenant_id=str(uuid.uuid4()), state="erased")
    write_deltalake(
        silver_uri, pa.Table.from_pylist([forged], schema=SILVER_CLAIMS.schema), mode="append"
    )
    stray = dict(row, artifact_id=str(uuid.uuid4()), curated_at=row["promoted_at"])
    write_deltalake(
        lake.table_uri(work.tenant_id, GOLD_CURATED, work.areas[1]),
        pa.Table.from_pylist([stray], schema=GOLD_CURATED.schema),
        mode="append",
    )

    job = defs.resolve_job_def("lake_writer_job")
    checks_only = job.get_subset(asset_selection=set(), asset_check_selection=set(LAKE_CHECK_KEYS))
    result = checks_only.execute_in_process(partition_key=work.tenant_id, instance=instance)
    assert not result.get_asset_materialization_events()  # the checks alone ran
    verdicts = {
        (e.asset_key.to_user_string(), e.check_name): e.passed
        for e in result.get_asset_check_evaluations()
    }
    failed = {k for k, passed in verdicts.items() if not passed}
    assert failed == {
        ("silver/claims", "tenant_id_matches_partition"),
        ("silver/claims", "erased_rows_carry_no_body"),
        ("silver/claims", "erasure_slo_holds"),  # an erased row keeps a body
        ("silver/claims", "agrees_with_outbox"),  # a second row for the version
        ("silver/claims", "no_open_dead_letters"),  # the seeded self-signed promotion
        ("gold/curated", "curated_agrees_with_silver"),
    }
