"""Bad input (DESIGN §2): every refused op lands in oml.lake_dead_letter with a reason naming the
field or rule, the rest of the batch applies, and nothing is lost."""

from __future__ import annotations

import shutil

import psycopg
import pytest

from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import acts, producer
from oml_dagster.simulate.producer import Act, Event, commit_acts
from oml_dagster_tests.helpers import LakeView, dead_letters, drain_all, make_tree, new_id, promoted


def _bad_act(conn, keys, op: str, payload) -> None:
    """An ordinary act whose outbox carries one malformed or forbidden op."""
    commit_acts(conn, keys, [Act(Event("test.bad", {"op": op}), [(op, payload)])])


def _promote_payload(tree, **override) -> dict:
    c = acts.Claim(
        new_id(), 1, tree.a, "u.a", plaintext_digest="a" * 64, ciphertext_digest="b" * 64
    )
    return {**c.payload(), **override}


BAD_CASES = [
    ("unknown op", "claim.teleport", lambda t, other: {"x": 1}, "unknown op 'claim.teleport'"),
    (
        "missing field",
        "claim.promote",
        lambda t, other: {k: v for k, v in _promote_payload(t).items() if k != "claim_key"},
        "field 'claim_key' is missing",
    ),
    (
        "mistyped field",
        "claim.promote",
        lambda t, other: _promote_payload(t, version="one"),
        "field 'version': expected an integer",
    ),
    (
        "bad digest",
        "claim.promote",
        lambda t, other: _promote_payload(t, plaintext_digest="XYZ"),
        "field 'plaintext_digest'",
    ),
    (
        "bad instant",
        "claim.demote",
        lambda t, other: {"artifact_id": new_id(), "version": 1, "at": "yesterday"},
        "field 'at'",
    ),
    (
        "bad enum",
        "claim.promote",
        lambda t, other: _promote_payload(t, provenance="alien"),
        "field 'provenance': expected one of",
    ),
    ("not an object", "edge.demote", lambda t, other: [1, 2], "payload is not a JSON object"),
    (
        "wrong tenant",
        "claim.promote",
        lambda t, other: _promote_payload(t, tenant_id=other),
        "wrong tenant",
    ),
    (
        "self signed",
        "claim.promote",
        lambda t, other: _promote_payload(t, self_signed=True),
        "self_signed",
    ),
    (
        "ratifier is proposer",
        "edge.ratify",
        lambda t, other: acts.Edge(
            new_id(), new_id(), new_id(), proposer="k1", ratifier="k1"
        ).payload(),
        "ratifier equals the proposer",
    ),
    (
        "demote unknown row",
        "claim.demote",
        lambda t, other: {"artifact_id": new_id(), "version": 1, "at": "2026-11-01T00:00:00Z"},
        "does not hold",
    ),
    (
        "erase unknown row",
        "claim.erase",
        lambda t, other: {"artifact_id": new_id(), "version": 4, "at": "2026-11-01T00:00:00Z"},
        "does not hold",
    ),
    (
        "reassign unknown row",
        "claim.reassign",
        lambda t, other: {
            "artifact_id": new_id(),
            "version": 1,
            "workarea_id": t.b,
            "held": False,
            "at": "2026-11-01T00:00:00Z",
        },
        "does not hold",
    ),
    (
        "demote unknown edge",
        "edge.demote",
        lambda t, other: {"edge_id": new_id(), "at": "2026-11-01T00:00:00Z"},
        "edge the lake does not hold",
    ),
    (
        "validate unknown area",
        "area.validate",
        lambda t, other: {"workarea_id": new_id(), "at": "2026-11-01T00:00:00Z"},
        "unknown workarea",
    ),
    (
        "upsert validated status",
        "area.upsert",
        lambda t, other: {"workarea_id": t.b, "at": "2026-11-01T00:00:00Z", "status": "validated"},
        "set by area.validate",
    ),
]


@pytest.mark.parametrize("case,op,payload,reason", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_each_bad_op_is_dead_lettered_and_the_rest_applies(
    conn, lake, tenant, case, op, payload, reason
):
    other = producer.create_tenant(conn)
    tree = make_tree(conn, tenant)
    before = promoted(conn, tenant, tree.a)
    _bad_act(conn, tenant, op, payload(tree, other.tenant_id))
    after = promoted(conn, tenant, tree.b, path="u.b")
    drain_all(conn, lake)

    letters = dead_letters(conn)
    assert len(letters) == 1, letters
    ((seq, (dead_op, dead_reason)),) = letters.items()
    assert dead_op == op and reason in dead_reason, dead_reason
    # Nothing else is lost: both good claims and every journal event (the bad act's too) land.
    view = LakeView(lake, tenant.tenant_id)
    assert view.claim(before)["state"] == view.claim(after)["state"] == "promoted"
    assert sorted(r["journal_seq"] for r in view.bronze) == list(range(1, 8))


def test_a_journal_event_signed_with_another_tenants_key_is_refused(conn, lake, tenant):
    other = producer.create_tenant(conn)
    impostor = producer.TenantKeys(tenant.tenant_id, other.api_key_id, other.private_key, "agent:x")
    make_tree(conn, tenant)
    commit_acts(conn, impostor, [Act(Event("test.impostor", {}), [])])
    drain_all(conn, lake)
    ((op, reason),) = dead_letters(conn).values()
    assert op == "journal.event" and "wrong tenant" in reason and other.api_key_id in reason
    assert len(LakeView(lake, tenant.tenant_id).bronze) == 4
    assert len(LakeView(lake, tenant.tenant_id).areas) == 4


def test_refusals_are_recorded_once_across_replays_and_overlapping_writers(conn, lake, tenant, dsn):
    make_tree(conn, tenant)
    _bad_act(
        conn,
        tenant,
        "claim.demote",
        {"artifact_id": new_id(), "version": 1, "at": "2026-11-01T00:00:00Z"},
    )
    drain_all(conn, lake)
    # A second writer re-drains the tenant from scratch (the lake lost): same verdicts, once.
    shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    with psycopg.connect(dsn, autocommit=True) as second:
        drain(second, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert len(dead_letters(conn)) == 1
    assert len(LakeView(lake, tenant.tenant_id).areas) == 4


def test_requeue_applies_the_fixed_op_after_everything_sequenced(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    bad = _promote_payload(tree, self_signed=True)
    _bad_act(conn, tenant, "claim.promote", bad)
    drain_all(conn, lake)
    ((seq, (op, reason)),) = dead_letters(conn).items()

    new_id_ = deadletter.requeue(
        conn, seq, by="operator:ana", payload={**bad, "self_signed": False}
    )
    drain_all(conn, lake)
    silver = LakeView(lake, tenant.tenant_id).silver
    assert (bad["artifact_id"], 1) in silver
    requeued = deadletter.list_dead_letters(conn, include_requeued=True)
    assert [(d.seq, d.requeued_by, d.requeued_id) for d in requeued] == [
        (seq, "operator:ana", new_id_)
    ]
    assert deadletter.list_dead_letters(conn) == []
    with pytest.raises(deadletter.RequeueError, match="already re-enqueued"):
        deadletter.requeue(conn, seq, by="operator:ana")
    with pytest.raises(deadletter.RequeueError, match="no dead letter with seq 999999"):
        deadletter.requeue(conn, 999999, by="operator:ana")
