"""Every op of the catalog, checked against the table's rows after a drain."""

from __future__ import annotations

import base64
import datetime as dt
import json

from oml_dagster.simulate import acts
from oml_dagster_tests.helpers import LakeView, dead_letters, drain_all, make_tree, new_id, promoted

T0 = dt.datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _body(conn, c) -> bytes:
    row = conn.execute(
        "SELECT body_ciphertext FROM oml.claim_bodies WHERE artifact_id = %s AND version = %s",
        (c.artifact_id, c.version),
    ).fetchone()
    return bytes(row[0])


def _seq_of(conn, op: str, **match) -> int:
    rows = conn.execute(
        "SELECT seq, payload FROM oml.outbox WHERE op = %s ORDER BY seq", (op,)
    ).fetchall()
    found = [seq for seq, payload in rows if all(payload.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (op, match, found)
    return found[0]


def test_promote_materializes_every_submission_column(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    attachments = [
        {
            "plaintext_digest": "a" * 64,
            "ciphertext_digest": "b" * 64,
            "media_type": "image/png",
            "size_bytes": 42,
        }
    ]
    c = acts.Claim(
        new_id(),
        1,
        tree.a,
        "u.a",
        kind="derived_fact",
        producer="crew:x",
        attachments=attachments,
        created_at=T0,
        promoted_at=T0 + dt.timedelta(seconds=1),
    )
    acts.promote(conn, tenant, c, b"secret body")
    obj = acts.Claim(new_id(), 2, tree.b, "u.b", body_ref="object")
    acts.promote(conn, tenant, obj, b"object body")
    drain_all(conn, lake)

    row = LakeView(lake, tenant.tenant_id).claim(c)
    assert row["tenant_id"] == tenant.tenant_id
    assert row["state"] == "promoted"
    assert row["body_ciphertext"] == _body(conn, c)
    assert row["kind"] == "derived_fact" and row["producer"] == "crew:x"
    assert row["attachments"] == attachments
    assert row["created_at"] == T0 and row["promoted_at"] == T0 + dt.timedelta(seconds=1)
    assert row["plaintext_digest"] == c.plaintext_digest
    assert row["ciphertext_digest"] == c.ciphertext_digest
    assert row["retracted_at"] is None and row["fold_seq"] is None
    assert row["applied_seq"] == _seq_of(conn, "claim.promote", artifact_id=c.artifact_id)
    # body_ref = object: the ciphertext lives elsewhere, the lake holds none.
    assert LakeView(lake, tenant.tenant_id).claim(obj)["body_ciphertext"] is None


def test_journal_events_land_in_bronze_once_each(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    drain_all(conn, lake)
    bronze = sorted(LakeView(lake, tenant.tenant_id).bronze, key=lambda r: r["journal_seq"])
    events = conn.execute(
        "SELECT seq, payload FROM oml.outbox WHERE op = 'journal.event' ORDER BY seq"
    ).fetchall()
    assert [r["journal_seq"] for r in bronze] == [1, 2, 3, 4, 5]
    for row, (seq, payload) in zip(bronze, events, strict=True):
        assert row["outbox_seq"] == seq
        assert row["tenant_id"] == tenant.tenant_id
        assert row["hash"] == base64.b64decode(payload["hash"])
        assert row["signed_bytes"] == base64.b64decode(payload["signed_bytes"])
        assert row["payload"] == payload["payload"]
        assert row["event_date"] == row["at"].date()
    promote_event = bronze[-1]
    assert promote_event["artifact_id"] == c.artifact_id and promote_event["version"] == 1
    assert "body_ciphertext" not in json.loads(promote_event["payload"])


def test_demote_then_demote_again_changes_nothing(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    acts.demote(conn, tenant, c, at=T0)
    drain_all(conn, lake)
    first = LakeView(lake, tenant.tenant_id).claim(c)
    assert first["state"] == "demoted" and first["retracted_at"] == T0
    assert first["body_ciphertext"] == _body(conn, c)

    acts.demote(conn, tenant, c, at=T0 + dt.timedelta(hours=1))
    drain_all(conn, lake)
    assert LakeView(lake, tenant.tenant_id).claim(c) == first
    assert dead_letters(conn) == {}


def test_erase_nulls_body_and_attachments_and_is_terminal(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    attachments = [
        {
            "plaintext_digest": "c" * 64,
            "ciphertext_digest": "d" * 64,
            "media_type": "t",
            "size_bytes": 1,
        }
    ]
    c = acts.Claim(new_id(), 1, tree.a, "u.a", attachments=attachments)
    acts.promote(conn, tenant, c, b"to be erased")
    drain_all(conn, lake)
    acts.demote(conn, tenant, c, at=T0)
    acts.erase(conn, tenant, c, at=T0 + dt.timedelta(minutes=1))
    drain_all(conn, lake)
    erased = LakeView(lake, tenant.tenant_id).claim(c)
    assert erased["state"] == "erased"
    assert erased["body_ciphertext"] is None and erased["attachments"] is None
    assert erased["retracted_at"] == T0 + dt.timedelta(minutes=1)
    assert erased["plaintext_digest"] == c.plaintext_digest  # digests and attribution remain

    # erased is terminal: later ops change nothing and are not errors.
    acts.demote(conn, tenant, c)
    acts.repromote(conn, tenant, c)
    acts.reassign(conn, tenant, c, tree.b, held=True)
    acts.erase(conn, tenant, c)
    drain_all(conn, lake)
    assert LakeView(lake, tenant.tenant_id).claim(c) == erased
    assert dead_letters(conn) == {}


def test_erase_in_the_batch_of_its_promotion(conn, lake, tenant):
    """Drain after the shred: the body is gone from claim_bodies, the row lands erased."""
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    acts.erase(conn, tenant, c)
    drain_all(conn, lake)
    row = LakeView(lake, tenant.tenant_id).claim(c)
    assert row["state"] == "erased" and row["body_ciphertext"] is None


def test_reassign_moves_and_reassign_into_held_keeps_the_body(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    moved, held = promoted(conn, tenant, tree.a), promoted(conn, tenant, tree.a)
    acts.reassign(conn, tenant, moved, tree.b, held=False)
    acts.reassign(conn, tenant, held, tree.a1, held=True)
    drain_all(conn, lake)
    view = LakeView(lake, tenant.tenant_id)
    m, h = view.claim(moved), view.claim(held)
    assert (m["workarea_id"], m["state"], m["workarea_path_at_write"]) == (
        tree.b,
        "promoted",
        "u.a",
    )
    assert (h["workarea_id"], h["state"]) == (tree.a1, "held")
    assert h["body_ciphertext"] == _body(conn, held) and h["retracted_at"] is None

    # A held row returns to promoted on a new promotion of the same version.
    acts.repromote(conn, tenant, held)
    drain_all(conn, lake)
    again = LakeView(lake, tenant.tenant_id).claim(held)
    assert again["state"] == "promoted" and again["body_ciphertext"] == _body(conn, held)
    assert again["applied_seq"] > h["applied_seq"]


def test_promote_of_a_demoted_row_is_refused(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    acts.demote(conn, tenant, c)
    acts.repromote(conn, tenant, c)
    drain_all(conn, lake)
    (reason,) = [r for op, r in dead_letters(conn).values() if op == "claim.promote"]
    assert "promote a new version instead" in reason and c.artifact_id in reason
    assert LakeView(lake, tenant.tenant_id).claim(c)["state"] == "demoted"


def test_simulation_end_demotes_its_rows_and_edges_and_the_taint_closure_on_request(
    conn, lake, tenant
):
    tree = make_tree(conn, tenant)
    sim_a, sim_b = new_id(), new_id()
    own_a = promoted(conn, tenant, tree.a, provenance="simulation", simulation_id=sim_a)
    tainted_a = promoted(conn, tenant, tree.a, sim_derived_ids=[sim_a])
    own_b = promoted(conn, tenant, tree.b, provenance="simulation", simulation_id=sim_b)
    tainted_b = promoted(conn, tenant, tree.b, sim_derived_ids=[sim_b])
    clean = promoted(conn, tenant, tree.b)
    edge = acts.Edge(new_id(), own_a.artifact_id, clean.artifact_id, simulation_id=sim_a)
    other_edge = acts.Edge(new_id(), own_b.artifact_id, clean.artifact_id, simulation_id=sim_b)
    acts.ratify(conn, tenant, edge)
    acts.ratify(conn, tenant, other_edge)
    drain_all(conn, lake)

    acts.simulation_end(conn, tenant, sim_a, demote_tainted=False, at=T0)
    acts.simulation_end(conn, tenant, sim_b, demote_tainted=True, at=T0)
    drain_all(conn, lake)
    view = LakeView(lake, tenant.tenant_id)
    states = {
        c.artifact_id: view.claim(c)["state"] for c in (own_a, tainted_a, own_b, tainted_b, clean)
    }
    assert states == {
        own_a.artifact_id: "demoted",
        tainted_a.artifact_id: "promoted",  # closure flagged for re-review, not demoted
        own_b.artifact_id: "demoted",
        tainted_b.artifact_id: "demoted",
        clean.artifact_id: "promoted",
    }
    assert view.claim(own_a)["retracted_at"] == T0
    assert {e: r["state"] for e, r in view.lineage.items()} == {
        edge.edge_id: "demoted",
        other_edge.edge_id: "demoted",
    }


def test_simulation_end_touches_only_promoted_and_held_rows(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    sim = new_id()
    erased = promoted(conn, tenant, tree.a, provenance="simulation", simulation_id=sim)
    held = promoted(conn, tenant, tree.a, provenance="simulation", simulation_id=sim)
    acts.erase(conn, tenant, erased, at=T0)
    acts.reassign(conn, tenant, held, tree.b, held=True)
    drain_all(conn, lake)
    before = LakeView(lake, tenant.tenant_id).claim(erased)
    acts.simulation_end(conn, tenant, sim, demote_tainted=True, at=T0 + dt.timedelta(days=1))
    drain_all(conn, lake)
    view = LakeView(lake, tenant.tenant_id)
    assert view.claim(erased) == before
    assert view.claim(held)["state"] == "demoted"


def test_repair_replaces_the_row_and_fences_older_ops(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    drain_all(conn, lake)
    c.kind = "steering"
    acts.repair(conn, tenant, c, fold_seq=1000, state="promoted")
    acts.demote(conn, tenant, c)  # journal_seq far below 1000: refused
    acts.repair(conn, tenant, c, fold_seq=999, state="demoted")  # older repair: refused
    drain_all(conn, lake)
    row = LakeView(lake, tenant.tenant_id).claim(c)
    assert (row["kind"], row["state"], row["fold_seq"]) == ("steering", "promoted", 1000)
    assert row["body_ciphertext"] == _body(conn, c)
    reasons = sorted(r for _, r in dead_letters(conn).values())
    assert len(reasons) == 2
    assert any("not newer than the row's fold_seq 1000" in r for r in reasons)
    assert any("fold_seq 999 is lower than the row's fold_seq 1000" in r for r in reasons)


def test_repair_inserts_a_row_the_lake_lacks(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    c = acts.Claim(
        new_id(), 3, tree.a, "u.a", plaintext_digest="e" * 64, ciphertext_digest="f" * 64
    )
    acts.repair(conn, tenant, c, fold_seq=7, state="demoted")
    drain_all(conn, lake)
    row = LakeView(lake, tenant.tenant_id).claim(c)
    assert (row["state"], row["fold_seq"], row["body_ciphertext"]) == ("demoted", 7, None)


def test_edges_ratify_and_demote(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    x, y = promoted(conn, tenant, tree.a), promoted(conn, tenant, tree.a)
    claim_edge = acts.Edge(new_id(), x.artifact_id, y.artifact_id, edge_label="supersedes")
    area_edge = acts.Edge(
        new_id(),
        tree.a,
        tree.b,
        graph="workarea",
        edge_label="relates_to",
        src_version=None,
        dst_version=None,
    )
    acts.ratify(conn, tenant, claim_edge)
    acts.ratify(conn, tenant, area_edge)
    drain_all(conn, lake)
    lineage = LakeView(lake, tenant.tenant_id).lineage
    row = lineage[claim_edge.edge_id]
    assert (row["state"], row["edge_label"], row["src_id"], row["src_version"]) == (
        "ratified",
        "supersedes",
        x.artifact_id,
        1,
    )
    assert (row["proposer"], row["ratifier"]) == ("key:proposer", "key:ratifier")
    assert lineage[area_edge.edge_id]["src_version"] is None

    acts.demote_edge(conn, tenant, claim_edge.edge_id)
    acts.demote_edge(conn, tenant, claim_edge.edge_id)  # a second demote changes nothing
    drain_all(conn, lake)
    lineage = LakeView(lake, tenant.tenant_id).lineage
    assert lineage[claim_edge.edge_id]["state"] == "demoted"
    assert lineage[area_edge.edge_id]["state"] == "ratified"
    assert dead_letters(conn) == {}


def test_area_upsert_status_and_crew_updates(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    acts.upsert_area(
        conn,
        tenant,
        tree.a,
        at=T0,
        status="committed",
        crew_name="crew-a",
        crew_charter_uri="https://x/charter",
        crew_external_manager="mgr-1",
    )
    drain_all(conn, lake)
    area = LakeView(lake, tenant.tenant_id).areas[tree.a]
    assert (
        area["status"],
        area["crew_name"],
        area["crew_charter_uri"],
        area["crew_external_manager"],
    ) == (
        "committed",
        "crew-a",
        "https://x/charter",
        "mgr-1",
    )
    assert area["updated_at"] == T0 and area["path"] == "u.a" and area["parent_id"] == tree.root
    root = LakeView(lake, tenant.tenant_id).areas[tree.root]
    assert root["parent_id"] is None and root["status"] == "development"


def test_reparent_rewrites_the_whole_subtree(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    deep = new_id()
    acts.upsert_area(conn, tenant, deep, path="u.a.a1.d", status="development", parent_id=tree.a1)
    drain_all(conn, lake)
    acts.reparent_area(conn, tenant, tree.a, tree.b, "u.b.a", at=T0)
    drain_all(conn, lake)
    areas = LakeView(lake, tenant.tenant_id).areas
    assert {k: areas[k]["path"] for k in (tree.a, tree.a1, deep, tree.b)} == {
        tree.a: "u.b.a",
        tree.a1: "u.b.a.a1",
        deep: "u.b.a.a1.d",
        tree.b: "u.b",
    }
    assert areas[tree.a]["parent_id"] == tree.b
    assert areas[deep]["updated_at"] == T0 and areas[tree.b]["updated_at"] != T0
    assert areas[deep]["applied_seq"] == areas[tree.a]["applied_seq"]


def test_reparent_into_its_own_subtree_is_refused(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    acts.reparent_area(conn, tenant, tree.a, tree.a1, "u.a.a1.a")
    drain_all(conn, lake)
    ((op, reason),) = dead_letters(conn).values()
    assert op == "area.reparent" and "cycle" in reason
    assert LakeView(lake, tenant.tenant_id).areas[tree.a]["path"] == "u.a"
