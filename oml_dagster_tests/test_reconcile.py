"""The key-less reconciler: every check passes on a clean lake (a simulated workload with every op
kind, drained in many small batches) and each fails, naming the row, on a lake corrupted in
exactly its way — a row under another tenant's prefix, a flipped byte in a signature, in signed
bytes and in a body, a silver row the outbox does not fold to, a curated row disagreeing with
silver, a tainted curated row, a stale frontier cache, a dead-lettered erase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from oml_dagster.lake.audit import reconcile as rc
from oml_dagster.lake.audit.reconcile import reconcile
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableSpec,
)
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.simulate import acts
from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

from .dagster_support import Workload, seed_tenant
from .helpers import BeforeEachCommit, drain_all


def failing(result) -> set[tuple[str, str]]:
    return {(r.table, r.name) for r in result.failed()}


def rewrite(lake: Lake, tenant_id: str, spec: TableSpec, change, workarea_id=None) -> None:
    """Overwrite a table with its rows after `change(rows)`: a foreign write that keeps the
    writer's txn version (an overwrite records no app transaction)."""
    uri = lake.table_uri(tenant_id, spec, workarea_id)
    rows = change(read_rows(lake.open(uri), spec))
    write_deltalake(
        uri,
        pa.Table.from_pylist(rows, schema=spec.schema),
        mode="overwrite",
        partition_by=list(spec.partition_by) or None,
    )


def flip(data: bytes, at: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@dataclass
class Clean:
    work: Workload
    other: Workload

    @property
    def tenant_id(self) -> str:
        return self.work.tenant_id

    @property
    def curated_area(self) -> str:
        return self.work.areas[1]


@pytest.fixture
def clean(conn, lake) -> Clean:
    work = seed_tenant(conn, bad=False)
    other = seed_tenant(conn, bad=False)
    drain_all(conn, lake)
    for w in (work, other):
        result = reconcile(conn, lake, w.tenant_id)
        assert result.ok, [r.samples() for r in result.failed()]
    return Clean(work, other)


@pytest.mark.parametrize(("seed", "max_batch"), [(7, 40), (8, 17), (9, 5000)])
def test_every_check_passes_on_a_simulated_workload_drained_in_any_batches(
    conn, dsn, lake, seed, max_batch
):
    report = run(dsn, WorkloadConfig(tenants=2, claims=40, seed=seed, bad_ratio=0.06), RunConfig())
    assert report.acts > 0
    config = WriterConfig(max_batch=max_batch, txn_lag_limit=max(1, max_batch // 2))
    drain(conn, lake, policy=DrainPolicy(until_idle=True, config=config))
    tenants = [t for (t,) in conn.execute("SELECT DISTINCT tenant_id::text FROM oml.outbox")]
    assert len(tenants) == 2
    for tenant_id in tenants:
        result = reconcile(conn, lake, tenant_id)
        assert {r.name for r in result.results} == {name for _, name in rc.CHECKS}
        # Injected bad input is dead-lettered: the one finding class it leaves.
        assert failing(result) <= {(SILVER_CLAIMS.name, rc.DEAD_LETTERS)}, [
            r.samples() for r in result.failed()
        ]
        assert result.result(BRONZE_EVENTS.name, rc.CHAIN).checked > 50
        assert result.result(SILVER_CLAIMS.name, rc.OUTBOX).checked > 10
        assert result.result(GOLD_LINEAGE.name, rc.OUTBOX).checked > 0
        assert result.result(GOLD_AREAS.name, rc.OUTBOX).checked > 0


def test_a_row_under_another_tenants_prefix(conn, lake, clean):
    theirs = next(
        r
        for r in read_rows(
            lake.open(lake.table_uri(clean.other.tenant_id, SILVER_CLAIMS)), SILVER_CLAIMS
        )
        if r["state"] == "promoted"
    )
    rewrite(lake, clean.tenant_id, SILVER_CLAIMS, lambda rows: [*rows, theirs])
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {
        (SILVER_CLAIMS.name, rc.TENANT_ID),
        (SILVER_CLAIMS.name, rc.OUTBOX),  # not folded from this tenant's outbox
        (SILVER_CLAIMS.name, rc.BODIES),  # no journal event of this tenant carried its digest
    }
    (finding,) = result.result(SILVER_CLAIMS.name, rc.TENANT_ID).findings
    assert (finding.tenant_id, finding.table, finding.key, finding.version) == (
        clean.tenant_id,
        SILVER_CLAIMS.name,
        theirs["artifact_id"],
        theirs["version"],
    )
    assert clean.other.tenant_id in finding.detail
    assert reconcile(conn, lake, clean.other.tenant_id).ok


@pytest.mark.parametrize("column", ["sig", "signed_bytes"])
def test_a_flipped_byte_in_a_bronze_event(conn, lake, clean, column):
    def corrupt(rows):
        target = next(r for r in rows if r["journal_seq"] == 3)
        target[column] = flip(target[column], 5)
        return rows

    rewrite(lake, clean.tenant_id, BRONZE_EVENTS, corrupt)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(BRONZE_EVENTS.name, rc.CHAIN)}
    findings = result.result(BRONZE_EVENTS.name, rc.CHAIN).findings
    assert {f.key for f in findings} == {"journal_seq 3"}
    details = " | ".join(f.detail for f in findings)
    assert "sig does not verify over signed_bytes" in details
    if column == "signed_bytes":
        # The chain hash covers the signed bytes; a flip inside the JSON may also make the
        # envelope disagree with the row, which is a finding of the same event.
        assert "hash is not SHA-256(prev_hash || signed_bytes)" in details
    else:
        assert "hash" not in details


def test_a_gap_and_a_duplicate_in_the_chain(conn, lake, clean):
    def corrupt(rows):
        ordered = sorted(rows, key=lambda r: r["journal_seq"])
        return [r for r in ordered if r["journal_seq"] != 4] + [dict(ordered[0])]

    rewrite(lake, clean.tenant_id, BRONZE_EVENTS, corrupt)
    result = reconcile(conn, lake, clean.tenant_id)
    details = {f.key: f.detail for f in result.result(BRONZE_EVENTS.name, rc.CHAIN).findings}
    assert details["journal_seq 1"] == "a second event at journal_seq 1"
    assert details["journal_seq 5"] == "journal_seq 4 missing before it"


def test_a_flipped_byte_in_a_body(conn, lake, clean):
    target = clean.work.claims[2]  # demoted before the validation: in silver only

    def corrupt(rows):
        row = next(r for r in rows if r["artifact_id"] == target.artifact_id)
        row["body_ciphertext"] = flip(row["body_ciphertext"], 10)
        return rows

    rewrite(lake, clean.tenant_id, SILVER_CLAIMS, corrupt)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.BODIES)}
    (finding,) = result.result(SILVER_CLAIMS.name, rc.BODIES).findings
    assert (finding.key, finding.version) == (target.artifact_id, 1)
    assert "SHA-256(body_ciphertext)" in finding.detail


def test_a_digest_other_than_the_journal_carried(conn, lake, clean):
    target = clean.work.claims[2]
    other_digest = "0" * 64

    def corrupt(rows):
        row = next(r for r in rows if r["artifact_id"] == target.artifact_id)
        row.update(ciphertext_digest=other_digest)
        return rows

    rewrite(lake, clean.tenant_id, SILVER_CLAIMS, corrupt)
    findings = reconcile(conn, lake, clean.tenant_id).result(SILVER_CLAIMS.name, rc.BODIES)
    assert any("the journal event at journal_seq" in f.detail for f in findings.findings)


def test_a_silver_row_the_outbox_does_not_fold_to(conn, lake, clean):
    target = clean.work.claims[2]  # demoted by the outbox

    def corrupt(rows):
        row = next(r for r in rows if r["artifact_id"] == target.artifact_id)
        row.update(state="held", retracted_at=None)
        return rows

    rewrite(lake, clean.tenant_id, SILVER_CLAIMS, corrupt)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.OUTBOX)}
    (finding,) = result.result(SILVER_CLAIMS.name, rc.OUTBOX).findings
    assert (finding.key, finding.version) == (target.artifact_id, 1)
    assert "state 'held' but the outbox folds to 'demoted'" in finding.detail


def test_lineage_and_area_rows_the_outbox_does_not_fold_to(conn, lake, clean):
    edge = clean.work.edges[0]
    rewrite(
        lake,
        clean.tenant_id,
        GOLD_LINEAGE,
        lambda rows: [dict(r, state="demoted") for r in rows],
    )
    root = clean.work.areas[0]
    rewrite(
        lake,
        clean.tenant_id,
        GOLD_AREAS,
        lambda rows: [r for r in rows if r["workarea_id"] != root],
    )
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(GOLD_LINEAGE.name, rc.OUTBOX), (GOLD_AREAS.name, rc.OUTBOX)}
    (edge_finding,) = result.result(GOLD_LINEAGE.name, rc.OUTBOX).findings
    assert edge_finding.key == edge.edge_id and "state 'demoted'" in edge_finding.detail
    (area_finding,) = result.result(GOLD_AREAS.name, rc.OUTBOX).findings
    assert area_finding.key == root
    assert area_finding.detail.startswith("missing: the outbox through txn")


def test_a_curated_row_disagreeing_with_silver(conn, lake, clean):
    target = clean.work.claims[0]  # promoted and curated

    def corrupt(rows):
        for row in rows:
            if row["artifact_id"] == target.artifact_id:
                row.update(state="held")
        return rows

    rewrite(lake, clean.tenant_id, GOLD_CURATED, corrupt, clean.curated_area)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(GOLD_CURATED.name, rc.CURATED)}
    (finding,) = result.result(GOLD_CURATED.name, rc.CURATED).findings
    assert finding.table == f"{GOLD_CURATED.name}/{clean.curated_area}"
    assert (finding.key, finding.version) == (target.artifact_id, 1)
    assert "state 'held' vs silver 'promoted'" in finding.detail


def test_a_simulation_tainted_row_in_a_curated_table(conn, lake, clean):
    def corrupt(rows):
        rows[0].update(sim_derived_ids=["00000000-0000-4000-8000-000000000000"])
        return rows

    rewrite(lake, clean.tenant_id, GOLD_CURATED, corrupt, clean.curated_area)
    result = reconcile(conn, lake, clean.tenant_id)
    assert (GOLD_CURATED.name, rc.TAINT) in failing(result)
    (finding,) = result.result(GOLD_CURATED.name, rc.TAINT).findings
    assert "simulation-tainted" in finding.detail


def test_a_stale_frontier_cache(conn, lake, clean):
    conn.execute(
        "UPDATE oml.lake_frontier SET txn_version = txn_version - 1"
        " WHERE tenant_id = %s AND table_name = %s",
        (clean.tenant_id, SILVER_CLAIMS.name),
    )
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.FRONTIER)}
    (finding,) = result.result(SILVER_CLAIMS.name, rc.FRONTIER).findings
    assert "the cache is behind the Delta log" in finding.detail


def test_a_frontier_cache_ahead_of_a_lost_table(conn, lake, clean):
    import shutil

    shutil.rmtree(lake.table_uri(clean.tenant_id, GOLD_LINEAGE))
    result = reconcile(conn, lake, clean.tenant_id)
    (finding,) = result.result(GOLD_LINEAGE.name, rc.FRONTIER).findings
    assert "no Delta table (a lost lake" in finding.detail


def test_a_dead_lettered_erase(conn, lake, clean):
    ghost = acts.Claim("00000000-0000-4000-8000-0000000000aa", 1, clean.work.areas[1], "x")
    acts.erase(conn, clean.work.keys, ghost)  # the lake never held it: refused
    drain_all(conn, lake)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.DEAD_LETTERS)}
    (finding,) = result.result(SILVER_CLAIMS.name, rc.DEAD_LETTERS).findings
    assert (finding.key, finding.version) == (ghost.artifact_id, 1)
    assert finding.detail.startswith("erase dead-lettered, an erasure-SLO breach in progress")
    conn.execute("UPDATE oml.lake_dead_letter SET requeued_at = now(), requeued_by = 'test'")
    assert reconcile(conn, lake, clean.tenant_id).ok


def test_an_erased_row_with_its_body(conn, lake, clean):
    target = clean.work.claims[2]

    def corrupt(rows):
        row = next(r for r in rows if r["artifact_id"] == target.artifact_id)
        row.update(state="erased")
        return rows

    rewrite(lake, clean.tenant_id, SILVER_CLAIMS, corrupt)
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.ERASED), (SILVER_CLAIMS.name, rc.OUTBOX)}


def test_unknown_checks_are_refused_by_name(conn, lake, clean):
    with pytest.raises(ValueError, match="no_such_check"):
        reconcile(conn, lake, clean.tenant_id, only=[(SILVER_CLAIMS.name, "no_such_check")])


def test_the_reconcile_command_exits_1_on_a_finding(conn, dsn, lake, clean):
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    command = [sys.executable, "-m", "oml_dagster.cli", "reconcile", "--tenant", clean.tenant_id]
    ok = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"tenant {clean.tenant_id}: agrees" in ok.stdout

    conn.execute(
        "UPDATE oml.lake_frontier SET txn_version = 1 WHERE tenant_id = %s AND table_name = %s",
        (clean.tenant_id, GOLD_AREAS.name),
    )
    found = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 1, found.stdout + found.stderr
    report = json.loads(found.stdout)
    assert report["tenant_id"] == clean.tenant_id and report["ok"] is False
    (check,) = [c for c in report["checks"] if not c["passed"]]
    assert (check["table"], check["check"]) == (GOLD_AREAS.name, rc.FRONTIER)
    assert check["findings"][0]["table"] == GOLD_AREAS.name


def test_a_second_row_for_a_key(conn, lake, clean):
    rewrite(lake, clean.tenant_id, GOLD_LINEAGE, lambda rows: [*rows, dict(rows[0])])
    result = reconcile(conn, lake, clean.tenant_id)
    assert failing(result) == {(GOLD_LINEAGE.name, rc.OUTBOX)}
    (finding,) = result.result(GOLD_LINEAGE.name, rc.OUTBOX).findings
    assert finding.detail.startswith("a second row for its key")


def test_the_reconciler_and_the_erasure_evidence_in_dagster_per_partition(
    conn, lake, defs, instance
):
    from dagster import AssetKey

    from oml_dagster.defs.checks import ERASURE_EVIDENCE, LAKE_CHECK_KEYS
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
    from oml_dagster.lake.ingest import sequencer

    work = seed_tenant(conn, bad=False)
    sequencer.sequence(conn)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [work.tenant_id])
    job = defs.resolve_job_def("lake_writer_job")
    assert job.execute_in_process(partition_key=work.tenant_id, instance=instance).success
    conn.execute(
        "UPDATE oml.lake_frontier SET txn_version = 1 WHERE tenant_id = %s AND table_name = %s",
        (work.tenant_id, GOLD_AREAS.name),
    )

    # What the reconcile schedule asks for: the evidence and the checks, no drain.
    reconciler_run = job.get_subset(
        asset_selection={ERASURE_EVIDENCE}, asset_check_selection=set(LAKE_CHECK_KEYS)
    )
    result = reconciler_run.execute_in_process(partition_key=work.tenant_id, instance=instance)
    (materialized,) = [
        e.event_specific_data.materialization for e in result.get_asset_materialization_events()
    ]
    assert materialized.asset_key == ERASURE_EVIDENCE and materialized.partition == work.tenant_id
    meta = {k: v.value for k, v in materialized.metadata.items()}
    assert meta["erased_versions"] == 1
    (artifact,) = meta["artifacts"]["artifacts"]
    assert artifact["artifact_id"] == work.claims[3].artifact_id
    assert artifact["status"] == "applied"

    evaluations = result.get_asset_check_evaluations()
    assert {e.partition for e in evaluations} == {work.tenant_id}
    (failed,) = [e for e in evaluations if not e.passed]
    assert (failed.asset_key, failed.check_name) == (AssetKey(["gold", "areas"]), rc.FRONTIER)
    assert failed.metadata["findings"].value == 1
    assert "frontier cache txn 1" in failed.metadata["sample_findings"].value[0]
    record = instance.event_log_storage.get_asset_check_execution_history(
        failed.asset_check_key, limit=1
    )[0]
    assert record.partition == work.tenant_id


def test_a_batch_half_committed_before_a_crash_is_no_row_finding(conn, lake, clean):
    """Tables at different txn versions (a writer died between commits) are each compared with
    the fold as of their own version; only the frontier cache, not yet refreshed, is behind."""
    from oml_dagster.lake.ingest import sequencer
    from oml_dagster.lake.write.writer import drain_tenant

    class Crash(Exception):
        pass

    def die_before_silver(table: str) -> None:
        if table == SILVER_CLAIMS.name:
            raise Crash(table)

    more = [
        acts.Claim(f"00000000-0000-4000-8000-00000000010{i}", 1, clean.work.areas[0], "root")
        for i in range(3)
    ]
    for c in more:
        acts.promote(conn, clean.work.keys, c, b"after " + c.artifact_id.encode())
    acts.demote(conn, clean.work.keys, clean.work.claims[0])  # reaches curated too
    sequencer.sequence(conn)
    with pytest.raises(Crash):
        drain_tenant(conn, lake, clean.tenant_id, commits=BeforeEachCommit(die_before_silver))
    bronze = lake.open(lake.table_uri(clean.tenant_id, BRONZE_EVENTS))
    silver = lake.open(lake.table_uri(clean.tenant_id, SILVER_CLAIMS))
    assert bronze.transaction_version("oml-lakewriter") > silver.transaction_version(
        "oml-lakewriter"
    )

    result = reconcile(conn, lake, clean.tenant_id)
    assert {name for _, name in failing(result)} == {rc.FRONTIER, rc.CURATED}, [
        r.samples() for r in result.failed()
    ]
    assert all(
        "the cache is behind the Delta log" in f.detail
        for f in result.result(BRONZE_EVENTS.name, rc.FRONTIER).findings
    )
    drain_all(conn, lake)
    assert reconcile(conn, lake, clean.tenant_id).ok


def test_an_op_applied_without_a_verdict_the_catalog_now_refuses(conn, lake):
    work = seed_tenant(conn, bad=True)  # a self-signed promotion: refused at parse
    drain_all(conn, lake)
    ((seq,),) = conn.execute("SELECT seq FROM oml.lake_dead_letter").fetchall()
    conn.execute("DELETE FROM oml.lake_dead_letter")  # as if the writer had applied it
    result = reconcile(conn, lake, work.tenant_id)
    assert failing(result) == {(SILVER_CLAIMS.name, rc.OUTBOX)}
    (finding,) = result.result(SILVER_CLAIMS.name, rc.OUTBOX).findings
    assert (finding.table, finding.key) == ("oml.outbox", f"seq {seq}")
    assert "refused by the catalog now" in finding.detail and "self_signed" in finding.detail


@pytest.mark.s3
def test_the_reconciler_and_the_evidence_on_an_s3_lake(conn, s3_lake):
    from oml_dagster.lake.audit.erasure import erased_artifacts

    work = seed_tenant(conn, bad=False)
    target = work.claims[0]
    drain_all(conn, s3_lake)
    acts.erase(conn, work.keys, target)  # after the drain: superseded files hold its body
    drain_all(conn, s3_lake)
    result = reconcile(conn, s3_lake, work.tenant_id)
    assert result.ok, [r.samples() for r in result.failed()]
    assert result.result(BRONZE_EVENTS.name, rc.CHAIN).checked > 10
    evidence = erased_artifacts(conn, s3_lake, work.tenant_id)
    found = {a.artifact_id: a for a in evidence.artifacts}
    copies = found[target.artifact_id].copies
    assert {c.copy_class for c in copies} == {"superseded"}
    # In silver and in the validated area's curated table, relative to the tenant prefix.
    assert {c.path.split("/part-")[0] for c in copies} == {
        "silver/claims",
        f"gold/curated/{work.areas[1]}",
    }
