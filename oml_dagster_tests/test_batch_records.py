"""What a batch keeps and records beyond its commits: a small keyed table whole, as its own
commits left it (so the next batch need not read the table again), and its verdicts, which
another writer's disagreeing verdicts stop before any of them or any table commit lands."""

from __future__ import annotations

import psycopg
import pytest

from oml_dagster.lake import queries
from oml_dagster.lake.errors import VerdictConflict
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.fetch import Fetcher
from oml_dagster.lake.model.tables import GOLD_AREAS
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.lake.write.writer import TenantBatch, WriterConfig, drain_tenant
from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

WORKLOAD = WorkloadConfig(tenants=2, claims=40, seed=5, bad_ratio=0.05)


def _by_key(rows: list[dict], spec) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(r[c] for c in spec.merge_key))


def test_small_tables_kept_whole_are_the_tables_after_every_batch(dsn, conn, lake):
    """Through a drain's batches (one OpenTables, as a shard run keeps them), every keyed table
    kept whole (silver, lineage, gold.areas, curated tables) equals the table read afresh, after
    the batch's MERGEs, appends, txn-only commits and packing; and the batches after the first
    look their rows up in what is kept instead of reading the tables again."""
    report = run(dsn, WORKLOAD, RunConfig(writers=2))
    sequencer.sequence(conn)
    config = WriterConfig.for_batch(7)
    checked: dict[str, int] = {}
    for tenant_id in report.tenants:
        tables = OpenTables(lake)
        batches = 0
        for _ in range(500):
            result = drain_tenant(conn, lake, tenant_id, config=config, tables=tables)
            if not result.committed and not result.refused:
                break
            batches += 1
            for found in tenant_tables(lake, tenant_id):
                if not found.spec.merge_key:
                    continue
                table = tables.open(found.uri)
                assert table is not None
                before = tables.whole_read
                kept = tables.whole_rows(table, found.spec)
                if kept is None or tables.whole_read != before:
                    continue  # not kept, or read afresh just now
                fresh = read_rows(lake.open(found.uri), found.spec)
                assert _by_key(kept, found.spec) == _by_key(fresh, found.spec), (
                    tenant_id,
                    str(found.table),
                    result.batch_end,
                )
                checked[found.spec.name] = checked.get(found.spec.name, 0) + 1
        assert batches > 5, batches
        # Read whole about once a table, not once a batch.
        assert tables.whole_read < batches, (tables.whole_read, batches)
    assert {"silver.claims", "gold.lineage", "gold.areas"} <= set(checked), checked


def test_verdicts_another_writer_decided_otherwise_stop_the_batch(dsn, conn, lake):
    """A batch whose refusals differ from those another writer recorded for the same seqs first
    raises VerdictConflict naming the seqs, and records nothing: no refusal, no decided
    frontier, no table commit."""
    report = run(dsn, WorkloadConfig(tenants=1, claims=20, seed=3, bad_ratio=0.0), RunConfig())
    tenant_id = report.tenants[0]
    sequencer.sequence(conn)
    batch = TenantBatch(tables=OpenTables(lake), tenant_id=tenant_id, config=WriterConfig())
    with Fetcher(conn) as fetcher:
        read = batch.read(conn, fetcher=fetcher, ahead=None)
    folded = batch.fold(read)
    assert read.seqs and not folded.refused
    # Another writer decided first that one of these ops is refused.
    seq, journal_seq, op, payload, _ = read.rows[len(read.rows) // 2]
    with queries.tenant_scope(conn, tenant_id) as session:
        session.execute(
            queries.DEAD_LETTER_INSERT,
            (seq, tenant_id, journal_seq, op, psycopg.types.json.Jsonb(payload), "decided first"),
        )
    with pytest.raises(VerdictConflict, match=str(seq)):
        batch.commit(conn, read, folded)
    with queries.tenant_scope(conn, tenant_id) as session:
        decided = session.execute(queries.DECIDED_THROUGH, (tenant_id,)).fetchone()
        refused = session.execute(
            "SELECT seq, reason FROM oml.lake_dead_letter WHERE tenant_id = %s", (tenant_id,)
        ).fetchall()
    assert decided is None or decided[0] < read.batch_end
    assert refused == [(seq, "decided first")]
    assert lake.open(lake.table_uri(tenant_id, GOLD_AREAS)) is None
