"""Lake table evolution (ADR 0071): a version defined here (a nullable column, as a later release
would add one) brought onto drained tables in place (one metadata commit, no data file
rewritten, the protocol kept), idempotently, by `oml-lake lake upgrade` and by the writer before
it writes; a writer that does not know the column keeps writing correctly to a table that has it
(appends fill NULL, MERGEs keep what the table holds); a column it cannot fill is refused. The
shipped tables stay exactly the spec's."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from oml_dagster.cli import main as cli_main
from oml_dagster.lake.model import evolution
from oml_dagster.lake.model.evolution import Step, TableSchemaAhead
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    CORE_TABLES,
    GOLD_CURATED,
    SILVER_CLAIMS,
    TableId,
)
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import query, tenant_tables
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.helpers import assert_exactly_once, drain_all, lake_snapshot
from oml_testbed.workloads import mixed_workload, promoted

NOTE = pa.field("review_note", pa.string(), nullable=True)
SEEN = pa.field("seen_at", pa.timestamp("us", tz="UTC"), nullable=True)
# The version a later release might ship: a note on claims (silver and curated, whose schema
# is silver's), a timestamp on bronze.
V2 = (
    Step(2, (SILVER_CLAIMS.name, GOLD_CURATED.name), (NOTE,)),
    Step(2, (BRONZE_EVENTS.name,), (SEEN,)),
)


def _columns(table: DeltaTable) -> list[str]:
    return pa.schema(table.schema().to_arrow()).names


def _files(table: DeltaTable) -> set[str]:
    return set(table.file_uris())


def _tables(lake: Lake, tenant_id: str) -> dict[TableId, DeltaTable]:
    return {name: lake.open(uri) for name, _spec, uri in tenant_tables(lake, tenant_id)}


def _specs(lake: Lake, tenant_id: str):
    return {name: spec for name, spec, _uri in tenant_tables(lake, tenant_id)}


def test_the_shipped_tables_are_exactly_the_spec_s(conn, lake, tenant):
    """No step ships: a drained lake's tables hold the spec's columns and nothing else."""
    assert evolution.STEPS == ()
    mixed_workload(conn, tenant, claims=6)
    drain_all(conn, lake)
    for name, table in _tables(lake, tenant.tenant_id).items():
        spec = _specs(lake, tenant.tenant_id)[name]
        assert _columns(table) == list(spec.columns), name
        assert evolution.table_version(table, spec) == 1


def test_a_nullable_column_is_added_in_place_keeping_the_protocol_idempotently(conn, lake, tenant):
    mixed_workload(conn, tenant, claims=8)
    drain_all(conn, lake)
    silver = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    protocol, files, version = silver.protocol(), _files(silver), silver.version()
    rows_before = lake_snapshot(lake, tenant.tenant_id)

    applied = evolution.bring_forward(silver, SILVER_CLAIMS, V2)
    assert [s.version for s in applied] == [2]
    again = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    assert _columns(again) == [*SILVER_CLAIMS.columns, NOTE.name]
    assert again.version() == version + 1  # one metadata commit
    assert _files(again) == files  # no data file rewritten
    assert again.protocol() == protocol  # still readable by every engine that read it
    assert again.history(1)[0].get("oml.schemaVersion") == "2"
    assert evolution.table_version(again, SILVER_CLAIMS, V2) == 2
    assert query(again, NOTE.name).column(0).null_count == again.to_pyarrow_table().num_rows
    # Idempotent: at the code's version nothing is applied, no commit.
    assert evolution.bring_forward(again, SILVER_CLAIMS, V2) == []
    assert lake.open(again.table_uri).version() == version + 1
    # The rows as the spec reads them did not change.
    assert lake_snapshot(lake, tenant.tenant_id) == rows_before


def test_lake_upgrade_brings_every_table_forward_once(conn, lake, tenant, monkeypatch, capsys):
    tree = mixed_workload(conn, tenant, claims=8)  # validates an area: a curated table
    drain_all(conn, lake)
    monkeypatch.setattr(evolution, "STEPS", V2)
    assert cli_main(["lake", "upgrade"]) == 0
    out = capsys.readouterr().out
    assert "3 tables brought forward" in out, out  # silver, bronze, the curated table
    curated = lake.open(lake.table_uri(tenant.tenant_id, GOLD_CURATED, tree.a))
    assert NOTE.name in _columns(curated)
    for name, table in _tables(lake, tenant.tenant_id).items():
        spec = _specs(lake, tenant.tenant_id)[name]
        assert evolution.table_version(table, spec) == evolution.code_version(spec), name
    versions = {n: t.version() for n, t in _tables(lake, tenant.tenant_id).items()}
    assert cli_main(["lake", "upgrade"]) == 0
    assert "every lake table is at the code's version" in capsys.readouterr().out
    assert {n: t.version() for n, t in _tables(lake, tenant.tenant_id).items()} == versions


def test_a_table_behind_the_code_is_brought_forward_before_the_writer_writes(
    conn, lake, tenant, monkeypatch
):
    """Tables drained at version 1, then a writer that knows version 2: its next commit on each
    table follows the step's commit, the rows stay exact, the new column NULL; a tenant new to
    this writer gets its tables created at version 2 directly (no step commit)."""
    tree = mixed_workload(conn, tenant, claims=6)
    drain_all(conn, lake)
    monkeypatch.setattr(evolution, "STEPS", V2)
    promoted(conn, tenant, tree.b)
    acts.demote(conn, tenant, promoted(conn, tenant, tree.b))
    newcomer = producer.create_tenant(conn)
    mixed_workload(conn, newcomer, claims=4)
    drain_all(conn, lake)

    for table_spec in (SILVER_CLAIMS, BRONZE_EVENTS):
        table = lake.open(lake.table_uri(tenant.tenant_id, table_spec))
        assert evolution.table_version(table, table_spec) == 2
        history = table.history(3)  # newest first: the writer's commit after the step's
        assert history[0].get("oml.schemaVersion") is None
        assert history[1].get("oml.schemaVersion") == "2", history[:2]
        new = lake.open(lake.table_uri(newcomer.tenant_id, table_spec))
        assert evolution.table_version(new, table_spec) == 2
        assert not [h for h in new.history() if h.get("oml.schemaVersion")]
    assert_exactly_once(conn, lake, [tenant, newcomer])


def test_a_writer_that_does_not_know_a_column_keeps_writing_correctly(conn, lake, tenant):
    """A newer release added a nullable column (and wrote values into it); this writer, which
    does not know it, appends (NULL there) and MERGEs (the table's values kept) correctly."""
    tree = mixed_workload(conn, tenant, claims=6)
    kept = promoted(conn, tenant, tree.b)
    drain_all(conn, lake)
    for table_spec in (SILVER_CLAIMS, BRONZE_EVENTS):
        uri = lake.table_uri(tenant.tenant_id, table_spec)
        evolution.bring_forward(lake.open(uri), table_spec, V2)
    silver = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    silver.update(
        updates={NOTE.name: "'reviewed'"},
        predicate=f"artifact_id = '{kept.artifact_id}'",
    )
    # This writer (evolution.STEPS is the shipped, empty one) goes on: a retract of the noted
    # row (a MERGE), new promotions (appends), bronze events (appends).
    acts.demote(conn, tenant, kept)
    for _ in range(3):
        promoted(conn, tenant, tree.b)
    drain_all(conn, lake)

    silver = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    notes = {
        r["artifact_id"]: (r["state"], r[NOTE.name])
        for r in query(silver, f"artifact_id, state, {NOTE.name}").to_pylist()
    }
    assert notes[kept.artifact_id] == ("demoted", "reviewed")  # the MERGE kept the value
    assert sum(1 for _state, note in notes.values() if note is None) == len(notes) - 1
    bronze = lake.open(lake.table_uri(tenant.tenant_id, BRONZE_EVENTS))
    assert SEEN.name in _columns(bronze)
    assert_exactly_once(conn, lake, [tenant])


def test_a_column_the_writer_cannot_fill_is_refused(tmp_path):
    """A table with a non-nullable column the code does not know: the append is refused with a
    line naming the column, before anything is written."""
    spec = BRONZE_EVENTS
    extra = pa.field("mandatory", pa.string(), nullable=False)
    schema = pa.schema([*spec.schema, extra])
    uri = str(tmp_path / "t")
    write_deltalake(uri, schema.empty_table(), mode="error")
    table = DeltaTable(uri)
    with pytest.raises(TableSchemaAhead, match="mandatory"):
        evolution.ready_to_write(table, spec, spec.schema.empty_table(), append=True)
    assert table.version() == 0


def test_a_step_adds_nullable_columns_only_and_versions_have_no_gap():
    with pytest.raises(ValueError, match="nullable"):
        Step(2, (SILVER_CLAIMS.name,), (pa.field("x", pa.string(), nullable=False),))
    with pytest.raises(ValueError, match="without a gap"):
        evolution.steps_for(SILVER_CLAIMS, (Step(3, (SILVER_CLAIMS.name,), (NOTE,)),))
    assert evolution.code_schema(SILVER_CLAIMS, V2).names == [*SILVER_CLAIMS.columns, NOTE.name]
    assert all(evolution.code_version(s) == 1 for s in CORE_TABLES)


def test_a_step_s_commit_never_rebases_onto_another(conn, lake, tenant):
    """A stale handle's step fails on the concurrent commit (the writer reloads and re-reads its
    skip rule) instead of landing on top of a version its holder never saw."""
    mixed_workload(conn, tenant, claims=4)
    drain_all(conn, lake)
    uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    stale = lake.open(uri)
    evolution.bring_forward(lake.open(uri), SILVER_CLAIMS, V2)  # another process, first
    with pytest.raises(CommitFailedError):
        evolution.bring_forward(stale, SILVER_CLAIMS, V2)
    stale.update_incremental()
    assert evolution.bring_forward(stale, SILVER_CLAIMS, V2) == []
