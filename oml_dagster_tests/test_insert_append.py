"""Rows new to a table are appended, not MERGEd (a MERGE would read the table's files to find
none of them): the prefetch records which keys it looked for and did not find, and a commit whose
rows are all such keys, on the table version the fold read, is an append. A concurrent commit
in between makes the retry a MERGE (or a skip): never a duplicate key."""

from __future__ import annotations

import threading

import psycopg

from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import GOLD_LINEAGE, SILVER_CLAIMS, TableId
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.simulate import acts
from oml_dagster_tests.helpers import (
    BeforeEachCommit,
    LakeView,
    drain_all,
    lake_snapshot,
    make_tree,
    new_id,
    promoted,
    table_rows,
)


def last_operation(lake: Lake, tenant_id: str, spec) -> str:
    return lake.open(lake.table_uri(tenant_id, spec)).history(1)[0]["operation"]


def unique_keys(lake: Lake, tenant_id: str) -> None:
    silver = table_rows(lake, tenant_id, SILVER_CLAIMS)
    keys = [(r["artifact_id"], r["version"]) for r in silver]
    assert len(keys) == len(set(keys)), "duplicate silver keys"
    lineage = [r["edge_id"] for r in table_rows(lake, tenant_id, GOLD_LINEAGE)]
    assert len(lineage) == len(set(lineage)), "duplicate lineage keys"


def test_new_claims_and_edges_are_appended_and_changes_merged(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    first = [promoted(conn, tenant, tree.a) for _ in range(3)]
    drain_all(conn, lake)

    fresh = [promoted(conn, tenant, tree.a) for _ in range(3)]
    acts.ratify(conn, tenant, acts.Edge(new_id(), fresh[0].artifact_id, fresh[1].artifact_id))
    drain_all(conn, lake)
    assert last_operation(lake, tenant.tenant_id, SILVER_CLAIMS) == "WRITE"
    assert last_operation(lake, tenant.tenant_id, GOLD_LINEAGE) == "WRITE"

    # A demote changes a row the table holds: a MERGE. So does a batch mixing new and old keys.
    acts.demote(conn, tenant, first[0])
    drain_all(conn, lake)
    assert last_operation(lake, tenant.tenant_id, SILVER_CLAIMS) == "MERGE"
    assert LakeView(lake, tenant.tenant_id).claim(first[0])["state"] == "demoted"
    promoted(conn, tenant, tree.b)
    acts.demote(conn, tenant, fresh[2])
    drain_all(conn, lake)
    assert last_operation(lake, tenant.tenant_id, SILVER_CLAIMS) == "MERGE"

    unique_keys(lake, tenant.tenant_id)
    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == lake_snapshot(reference, tenant.tenant_id)


def test_a_writer_whose_append_meets_a_concurrent_commit_merges_or_skips(conn, lake, tenant, dsn):
    """Writer A folds a batch of new claims and pauses before silver; writer B commits part of
    the same ops first (a smaller batch), then A goes on: its append fails on B's commit, and
    the retry MERGEs the rows above B's txn. No key twice, the same lake as one clean drain."""
    tree = make_tree(conn, tenant)
    promoted(conn, tenant, tree.a)
    drain_all(conn, lake)
    made = [promoted(conn, tenant, tree.a) for _ in range(6)]
    acts.demote(conn, tenant, made[1])  # B's batch inserts made[1]; A's retry must update it
    sequencer.sequence(conn)
    paused, resume = threading.Event(), threading.Event()

    def hold_before_silver(table: str) -> None:
        if table == "silver.claims" and not paused.is_set():
            paused.set()
            assert resume.wait(60)

    results = {}

    def writer_a() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            results["a"] = drain_tenant(
                own, lake, tenant.tenant_id, commits=BeforeEachCommit(hold_before_silver)
            )

    thread = threading.Thread(target=writer_a)
    thread.start()
    assert paused.wait(60)
    # B: a batch of about half the ops (each promotion is an event and a claim op).
    results["b"] = drain_tenant(
        conn, lake, tenant.tenant_id, config=WriterConfig(max_batch=6, txn_lag_limit=3)
    )
    resume.set()
    thread.join(60)

    a, b = results["a"], results["b"]
    assert b.batch_end < a.batch_end
    silver_a = a.outcome(TableId("silver.claims"))
    assert silver_a.action == "committed" and silver_a.attempts == 2, silver_a
    assert last_operation(lake, tenant.tenant_id, SILVER_CLAIMS) == "MERGE"
    unique_keys(lake, tenant.tenant_id)
    drain_all(conn, lake)
    unique_keys(lake, tenant.tenant_id)
    assert LakeView(lake, tenant.tenant_id).claim(made[1])["state"] == "demoted"
    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == lake_snapshot(reference, tenant.tenant_id)


def test_a_merge_narrowed_to_the_rows_boxes_finds_a_reassigned_claim_where_it_was(
    conn, lake, tenant
):
    """A MERGE's target is narrowed to the (workarea_id, artifact_id) the table holds for each
    updated row: a reassign must be matched under its old workarea (narrowing by the new one
    would miss the row and insert it a second time)."""
    tree = make_tree(conn, tenant)
    moved, kept = promoted(conn, tenant, tree.a), promoted(conn, tenant, tree.b, path="u.b")
    drain_all(conn, lake)

    acts.reassign(conn, tenant, moved, tree.b, held=False)
    acts.demote(conn, tenant, kept)
    drain_all(conn, lake)

    assert last_operation(lake, tenant.tenant_id, SILVER_CLAIMS) == "MERGE"
    unique_keys(lake, tenant.tenant_id)
    view = LakeView(lake, tenant.tenant_id)
    assert view.claim(moved)["workarea_id"] == tree.b
    assert view.claim(kept)["state"] == "demoted"
    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == lake_snapshot(reference, tenant.tenant_id)


def test_the_target_filter_names_where_the_table_holds_each_updated_row():
    from oml_dagster.lake.model.tables import KeyedWork
    from oml_dagster.lake.write.commit import MOST_TARGET_BOXES, target_filter_of

    work = KeyedWork(SILVER_CLAIMS, txn=0)
    held = {"artifact_id": "a1", "version": 1, "workarea_id": "w-old", "applied_seq": 1}
    work.load([held])
    work.looked_for([("a1", 1), ("a2", 1)])
    moved = dict(held, workarea_id="w-new")
    new = {"artifact_id": "a2", "version": 1, "workarea_id": "w-new", "applied_seq": 2}
    assert (
        target_filter_of(work, [moved, new]) == "(t.workarea_id = 'w-old' AND t.artifact_id = 'a1')"
    )
    assert work.only_new([new]) and not work.only_new([moved, new])
    # A row whose key was never looked for: where it lies is unknown, so no narrowing.
    stray = dict(new, artifact_id="a3")
    assert target_filter_of(work, [moved, stray]) is None
    # Quotes are escaped; too many boxes fall back to the plain MERGE.
    quoted = {"artifact_id": "it's", "version": 1, "workarea_id": "w", "applied_seq": 1}
    work.load([quoted])
    assert "'it''s'" in target_filter_of(work, [quoted])
    many = [dict(held, artifact_id=f"m{i}") for i in range(MOST_TARGET_BOXES + 1)]
    work.load(many)
    assert target_filter_of(work, many) is None
