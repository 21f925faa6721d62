"""Input a producer with bugs can write: none of it may hang a tenant's drain, split silver from
curated, duplicate bronze, make a rebuild differ, or be taken silently. Each test is one
finding: the op is dead-lettered naming what is wrong, and the rest of the batch still lands."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from oml_dagster.lake.errors import BatchTimeout, ConflictingCommit
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.evolution import TableSchemaAhead
from oml_dagster.lake.model.tables import APP_ID, GOLD_AREAS, GOLD_LINEAGE, TableSpec
from oml_dagster.lake.store.reads import read_rows
from oml_dagster.lake.write.deadletter import requeue
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.watchdog import Watchdog
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.conftest import curated_rows
from oml_dagster_tests.helpers import (
    BeforeEachCommit,
    LakeView,
    claim,
    dead_letters,
    drain_all,
    lake_snapshot,
    make_tree,
    new_id,
    promoted,
)

T0 = dt.datetime(2026, 11, 1, 12, 0, 0, 250000, tzinfo=dt.UTC)


def commit(conn, keys, act: acts.Act, **edits) -> None:
    """Commit `act` with its (single) op's payload edited: `None` removes a field."""
    (name, payload), *rest = act.ops
    payload = {k: v for k, v in {**payload, **edits}.items() if v is not None or k not in edits}
    act.ops = [(name, payload), *rest]
    producer.commit_acts(conn, keys, [act])


def only_dead_letter(conn) -> tuple[str, str]:
    letters = dead_letters(conn)
    assert len(letters) == 1, letters
    return next(iter(letters.values()))


def validated(conn, keys, tree) -> None:
    acts.upsert_area(conn, keys, tree.a, status="committed")
    acts.validate_area(conn, keys, tree.a, at=T0)


# --- 1. a hang ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_self_parent_and_cycle_closing_upserts_are_refused_and_the_erase_behind_them_lands(
    conn, lake, tenant
):
    tree = make_tree(conn, tenant)
    victim = promoted(conn, tenant, tree.a)
    drain_all(conn, lake)
    loop = new_id()
    acts.upsert_area(conn, tenant, loop, path="u.l", status="development", parent_id=loop)
    acts.upsert_area(conn, tenant, tree.a, parent_id=tree.a1)  # would close a -> a1 -> a
    acts.reparent_area(conn, tenant, tree.a1, tree.b, "u.b.a1")
    acts.erase(conn, tenant, victim)
    drain_all(conn, lake)
    reasons = [reason for _, reason in dead_letters(conn).values()]
    assert len(reasons) == 2, reasons
    assert any("as its own parent" in r for r in reasons)
    assert any("changes parent_id" in r and "area.reparent" in r for r in reasons)
    view = LakeView(lake, tenant.tenant_id)
    assert view.claim(victim)["state"] == "erased"
    assert view.areas[tree.a1]["path"] == "u.b.a1"
    assert loop not in view.areas


@pytest.mark.timeout(120)
def test_a_cycle_already_in_gold_areas_does_not_hang_a_reparent(conn, lake, tenant):
    """A lake written before cycles were refused may hold one: the subtree walk still ends."""
    tree = make_tree(conn, tenant)
    drain_all(conn, lake)
    table = lake.open(lake.table_uri(tenant.tenant_id, GOLD_AREAS))
    rows = read_rows(table, GOLD_AREAS)
    cycle = [dict(r, parent_id=tree.a1) for r in rows if r["workarea_id"] == tree.a]
    (
        table.merge(
            pa.Table.from_pylist(cycle, schema=GOLD_AREAS.schema),
            "t.workarea_id = s.workarea_id",
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update_all()
        .execute()
    )
    acts.reparent_area(conn, tenant, tree.a1, tree.b, "u.b.a1")
    victim = promoted(conn, tenant, tree.b, path="u.b")
    acts.erase(conn, tenant, victim)
    drain_all(conn, lake)
    assert LakeView(lake, tenant.tenant_id).claim(victim)["state"] == "erased"


def test_the_watchdog_interrupts_a_loop_that_never_ends():
    expected = r"tenant t.*bound of 0.2 s.*op seq 7 \(area.reparent\)"
    with pytest.raises(BatchTimeout, match=expected), Watchdog(0.2, "tenant t") as dog:
        dog.on = "op seq 7 (area.reparent)"
        while True:
            pass


def test_a_fold_past_its_bound_fails_naming_its_op_and_records_nothing(conn, lake, tenant):
    make_tree(conn, tenant)
    sequencer.sequence(conn)
    with pytest.raises(BatchTimeout, match=r"tenant .* batch \(0, \d+\].*while on (op seq|the)"):
        drain_tenant(conn, lake, tenant.tenant_id, config=WriterConfig(fold_timeout_seconds=0.0))
    assert conn.execute("SELECT count(*) FROM oml.lake_verdicts").fetchone()[0] == 0
    assert lake.open(lake.table_uri(tenant.tenant_id, GOLD_AREAS)) is None
    drain_all(conn, lake)  # the next run does the batch
    assert len(LakeView(lake, tenant.tenant_id).areas) == 4


# --- 2. silver and curated -----------------------------------------------------------------------


def test_a_repair_that_erases_a_row_of_a_validated_area_erases_it_in_curated_too(
    conn, lake, tenant
):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    validated(conn, tenant, tree)
    drain_all(conn, lake)
    assert curated_rows(lake, tenant.tenant_id, tree.a)[0]["body_ciphertext"] is not None
    acts.repair(conn, tenant, c, fold_seq=1, state="erased")
    drain_all(conn, lake)
    assert dead_letters(conn) == {}
    silver = LakeView(lake, tenant.tenant_id).claim(c)
    (curated,) = curated_rows(lake, tenant.tenant_id, tree.a)
    for row in (silver, curated):
        assert (row["state"], row["body_ciphertext"], row["fold_seq"]) == ("erased", None, 1)
    assert curated["curated_at"] == T0


def test_a_held_reassign_inside_a_validated_area_is_refused(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    validated(conn, tenant, tree)
    acts.reassign(conn, tenant, c, tree.a, held=True)
    drain_all(conn, lake)
    op, reason = only_dead_letter(conn)
    assert op == "claim.reassign" and "held inside validated workarea" in reason
    assert LakeView(lake, tenant.tenant_id).claim(c)["state"] == "promoted"
    assert curated_rows(lake, tenant.tenant_id, tree.a)[0]["state"] == "promoted"


# --- 3. bronze -----------------------------------------------------------------------------------


def _event_row(conn, tenant_id, journal_seq) -> dict:
    (payload,) = conn.execute(
        "SELECT payload FROM oml.outbox WHERE tenant_id = %s AND journal_seq = %s"
        " AND op = 'journal.event'",
        (tenant_id, journal_seq),
    ).fetchone()
    return payload


def _insert_event(conn, tenant_id, journal_seq, payload) -> None:
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
        " VALUES (%s, %s, 'journal.event', %s::jsonb)",
        (tenant_id, journal_seq, json.dumps(payload)),
    )


def test_a_replayed_journal_event_lands_once_and_a_different_one_is_refused(conn, lake, tenant):
    make_tree(conn, tenant)
    drain_all(conn, lake)
    event = _event_row(conn, tenant.tenant_id, 2)
    _insert_event(conn, tenant.tenant_id, 2, event)  # an outbox replay of the same event
    _insert_event(conn, tenant.tenant_id, 3, dict(_event_row(conn, tenant.tenant_id, 3)))
    _insert_event(conn, tenant.tenant_id, 4, dict(event, journal_seq=4, event_id=new_id()))
    drain_all(conn, lake)
    op, reason = only_dead_letter(conn)
    assert op == "journal.event" and "journal_seq 4 is already held by event" in reason
    seqs = [r["journal_seq"] for r in LakeView(lake, tenant.tenant_id).bronze]
    assert sorted(seqs) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "edit,message",
    [
        ({"hash": ""}, "field 'hash'"),
        ({"sig": ""}, "field 'sig'"),
        ({"prev_hash": ""}, "field 'prev_hash'"),
        ({"signed_bytes": ""}, "field 'signed_bytes'"),
        ({"sig": "AAAA"}, "base64 of 64 bytes"),
        ({"journal_seq": 99}, "is not the outbox row's journal_seq"),
    ],
)
def test_malformed_journal_events_are_refused(conn, lake, tenant, edit, message):
    make_tree(conn, tenant)
    event = _event_row(conn, tenant.tenant_id, 1)
    conn.execute("DELETE FROM oml.outbox WHERE journal_seq = 1 AND op = 'journal.event'")
    _insert_event(conn, tenant.tenant_id, 1, {**event, **edit})
    drain_all(conn, lake)
    op, reason = only_dead_letter(conn)
    assert op == "journal.event" and message in reason, reason
    assert sorted(r["journal_seq"] for r in LakeView(lake, tenant.tenant_id).bronze) == [2, 3, 4]


def test_a_requeued_journal_event_keeps_its_own_journal_seq(conn, lake, tenant):
    """A re-enqueued dead letter sits at the tenant's last journal_seq; the event inside it
    keeps the journal_seq of its act and lands there."""
    make_tree(conn, tenant)
    event = _event_row(conn, tenant.tenant_id, 2)
    conn.execute(
        "UPDATE oml.api_keys SET api_key_id = 'rotated' WHERE tenant_id = %s", (tenant.tenant_id,)
    )
    drain_all(conn, lake)
    assert len(dead_letters(conn)) == 4  # the key is unknown
    conn.execute(
        "UPDATE oml.api_keys SET api_key_id = %s WHERE tenant_id = %s",
        (event["api_key_id"], tenant.tenant_id),
    )
    for seq in sorted(dead_letters(conn)):
        requeue(conn, seq, by="test")
    drain_all(conn, lake)
    assert sorted(r["journal_seq"] for r in LakeView(lake, tenant.tenant_id).bronze) == [1, 2, 3, 4]


# --- 4. a rebuild ----------------------------------------------------------------------------------


def test_a_rebuilt_lake_equals_the_lost_one_row_for_row_curated_at_included(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    promoted(conn, tenant, tree.a)
    validated(conn, tenant, tree)
    drain_all(conn, lake)
    before = lake_snapshot(lake, tenant.tenant_id)
    assert [r["curated_at"] for r in before[f"gold.curated/{tree.a}"]] == [T0]
    shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == before


# --- 5. what was accepted silently ---------------------------------------------------------------


def _second_root(conn, k, tree):
    acts.upsert_area(conn, k, new_id(), path="v", status="development", parent_id=None)


def _unknown_parent(conn, k, tree):
    acts.upsert_area(conn, k, new_id(), path="u.x", status="development", parent_id=new_id())


def _down_the_ladder(conn, k, tree):
    acts.upsert_area(conn, k, tree.b, status="committed")
    acts.upsert_area(conn, k, tree.b, status="development")


def _validate_from_development(conn, k, tree):
    acts.validate_area(conn, k, tree.b)


def _path_not_under_parent(conn, k, tree):
    acts.upsert_area(conn, k, new_id(), path="u.b.x", status="development", parent_id=tree.a)


def _reparent_path_not_under_parent(conn, k, tree):
    acts.reparent_area(conn, k, tree.a1, tree.b, "u.a.a1")


def _promote_into_unknown_area(conn, k, tree):
    acts.promote(conn, k, claim(new_id()), b"body")


def _reassign_into_unknown_area(conn, k, tree):
    c = promoted(conn, k, tree.a)
    acts.reassign(conn, k, c, new_id(), held=False)


def _repromote_held_with_other_digests(conn, k, tree):
    c = promoted(conn, k, tree.a)
    acts.reassign(conn, k, c, tree.b, held=True)
    act = acts.repromote_act(c)
    commit(conn, k, act, ciphertext_digest="c" * 64)


def _repair_admitting_a_held_body(conn, k, tree):
    c = claim(tree.a, plaintext_digest="a" * 64, ciphertext_digest="b" * 64)
    acts.repair(conn, k, c, fold_seq=1, state="held")


def _repair_into_a_validated_area(conn, k, tree):
    validated(conn, k, tree)
    c = promoted(conn, k, tree.b, path="u.b")
    c.workarea_id = tree.a
    acts.repair(conn, k, c, fold_seq=1, state="promoted")


def _repair_tainting_a_validated_row(conn, k, tree):
    c = promoted(conn, k, tree.a)
    validated(conn, k, tree)
    c.sim_derived_ids = [new_id()]
    acts.repair(conn, k, c, fold_seq=1, state="promoted")


def _repair_with_a_body_and_body_ref_object(conn, k, tree):
    c = promoted(conn, k, tree.a)
    c.body_ref = "object"
    act = acts.repair_act(c, 1, "promoted")
    (_, payload), *_ = act.ops
    commit(conn, k, act, row=dict(payload["row"], body_ciphertext="Ym9keQ=="))


def _negative_size_bytes(conn, k, tree):
    attachment = {
        "plaintext_digest": "a" * 64,
        "ciphertext_digest": "b" * 64,
        "media_type": "text/plain",
        "size_bytes": -1,
    }
    acts.promote(conn, k, claim(tree.a, attachments=[attachment]), b"body")


def _edge_to_a_claim_the_lake_does_not_hold(conn, k, tree):
    c = promoted(conn, k, tree.a)
    acts.ratify(conn, k, acts.Edge(new_id(), c.artifact_id, new_id()))


def _edge_to_an_unknown_workarea(conn, k, tree):
    edge = acts.Edge(new_id(), tree.a, new_id(), graph="workarea", edge_label="relates_to")
    edge.src_version = edge.dst_version = None
    acts.ratify(conn, k, edge)


def _edge_label_of_the_other_graph(conn, k, tree):
    a, b = promoted(conn, k, tree.a), promoted(conn, k, tree.a)
    acts.ratify(conn, k, acts.Edge(new_id(), a.artifact_id, b.artifact_id, edge_label="mirrors"))


def _iso_week_instant(conn, k, tree):
    c = promoted(conn, k, tree.a)
    commit(conn, k, acts.demote_act(c), at="2026-W44-1T12:00Z")


def _basic_format_instant(conn, k, tree):
    c = promoted(conn, k, tree.a)
    commit(conn, k, acts.demote_act(c), at="20261101T120000Z")


def _unknown_field(conn, k, tree):
    c = promoted(conn, k, tree.a)
    commit(conn, k, acts.demote_act(c), reason_code="R7")


@pytest.mark.parametrize(
    "write,op,message",
    [
        (_second_root, "area.upsert", "the tenant's root is"),
        (_unknown_parent, "area.upsert", "under an unknown parent"),
        (_down_the_ladder, "area.upsert", "cannot move down the ladder from committed"),
        (_validate_from_development, "area.validate", "in status development"),
        (_path_not_under_parent, "area.upsert", "does not extend its parent's path 'u.a'"),
        (_reparent_path_not_under_parent, "area.reparent", "does not extend its parent's path"),
        (_promote_into_unknown_area, "claim.promote", "which gold.areas does not hold"),
        (_reassign_into_unknown_area, "claim.reassign", "which gold.areas does not hold"),
        (_repromote_held_with_other_digests, "claim.promote", "another ciphertext_digest"),
        (_repair_admitting_a_held_body, "claim.repair", "would admit a held body"),
        (_repair_into_a_validated_area, "claim.repair", "into validated workarea"),
        (_repair_tainting_a_validated_row, "claim.repair", "simulation-tainted row"),
        (_repair_with_a_body_and_body_ref_object, "claim.repair", "body_ref object"),
        (_negative_size_bytes, "claim.promote", "attachments[0].size_bytes': expected an int"),
        (_edge_to_a_claim_the_lake_does_not_hold, "edge.ratify", "is not held by the lake"),
        (_edge_to_an_unknown_workarea, "edge.ratify", "is not held by gold.areas"),
        (_edge_label_of_the_other_graph, "edge.ratify", "'mirrors' is not a claim edge label"),
        (_iso_week_instant, "claim.demote", "field 'at': expected an RFC 3339 instant"),
        (_basic_format_instant, "claim.demote", "field 'at': expected an RFC 3339 instant"),
        (_unknown_field, "claim.demote", "unknown field(s) 'reason_code'"),
    ],
)
def test_what_was_accepted_silently_is_refused_by_name(conn, lake, tenant, write, op, message):
    tree = make_tree(conn, tenant)
    write(conn, tenant, tree)
    behind = promoted(conn, tenant, tree.b, path="u.b")  # the rest of the batch still lands
    acts.erase(conn, tenant, behind)
    drain_all(conn, lake)
    refused_op, reason = only_dead_letter(conn)
    assert (refused_op, message in reason) == (op, True), reason
    assert LakeView(lake, tenant.tenant_id).claim(behind)["state"] == "erased"


# --- 7. errors are not retried as conflicts --------------------------------------------------------


def test_a_failing_write_is_raised_at_once_not_retried_as_a_conflict(conn, lake, tenant):
    make_tree(conn, tenant)
    wrong = TableSpec("wrong", GOLD_LINEAGE.relpath, GOLD_AREAS.schema)
    write_deltalake(
        lake.table_uri(tenant.tenant_id, GOLD_LINEAGE), pa.Table.from_pylist([], wrong.schema)
    )
    sequencer.sequence(conn)
    # Refused before the write by the columns' check (ADR 0071), or by delta-rs: at once either
    # way, never taken for a conflict.
    with pytest.raises((DeltaError, TableSchemaAhead)) as raised:
        drain_tenant(
            conn, lake, tenant.tenant_id, config=WriterConfig(max_batch=50, txn_lag_limit=1)
        )
    assert not isinstance(raised.value, CommitFailedError)


def test_a_conflict_that_never_ends_names_its_cause(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    drain_all(conn, lake)
    acts.upsert_area(conn, tenant, new_id(), path="u.c", status="development", parent_id=tree.root)
    sequencer.sequence(conn)
    uri = lake.table_uri(tenant.tenant_id, GOLD_AREAS)

    def racing_writer(table_name: str) -> None:
        if table_name == GOLD_AREAS.name:
            table = lake.open(uri)
            write_deltalake(
                table,
                pa.Table.from_pylist([], GOLD_AREAS.schema),
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id=APP_ID, version=1)]
                ),
            )

    config = WriterConfig(max_commit_attempts=1)
    with pytest.raises(ConflictingCommit) as raised:
        drain_tenant(
            conn, lake, tenant.tenant_id, config=config, commits=BeforeEachCommit(racing_writer)
        )
    assert isinstance(raised.value.__cause__, CommitFailedError)
