"""The fold without Postgres and without Delta: a `TenantState` built in memory, ops parsed,
checked and applied by the catalog as the writer does (`catalog.fold`), asserting the contract's
rules (DESIGN §2 "The op catalog", spec "Retracts: MERGE semantics per table"): the claim state
ladder, erased as terminal, freeze of validated areas, repairs and fold_seq, simulation end and
its taint closure, edges, the area tree, journal events kept once per journal_seq, and the
refusals with their reasons. Property tests state the rules that hold for every op sequence, and
that the one fold gives the writer's batches and the reconciler's read-only pass the same rows
(ADR 0050)."""

from __future__ import annotations

import copy
import datetime as dt
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model import catalog
from oml_dagster.lake.model.tables import (
    GOLD_AREAS,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    AppendWork,
    KeyedWork,
    TenantState,
)
from oml_dagster.simulate import acts
from oml_dagster.simulate.producer import GENESIS_HASH, Event, TenantKeys, instant, journal_entry

TENANT = "00000000-0000-4000-8000-00000000aaaa"
OTHER_TENANT = "00000000-0000-4000-8000-00000000bbbb"
T0 = dt.datetime(2026, 11, 2, 12, 0, tzinfo=dt.UTC)


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


ROOT, A, B, A1 = uid(1), uid(2), uid(3), uid(4)  # A1 is a child of A
SIM, SIM2 = uid(90), uid(91)


def _keys(tenant_id: str, n: int) -> TenantKeys:
    private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(bytes([n])).digest())
    return TenantKeys(tenant_id, f"key-{n}", private, "agent:writer")


KEYS = _keys(TENANT, 1)
FOREIGN = _keys(OTHER_TENANT, 2)


class Fold:
    """One tenant's working tables in memory, and ops folded into them one at a time."""

    def __init__(self):
        self.state = TenantState(
            tenant_id=TENANT,
            bronze=AppendWork(txn=0),
            silver=KeyedWork(SILVER_CLAIMS, txn=0),
            lineage=KeyedWork(GOLD_LINEAGE, txn=0),
            areas=KeyedWork(GOLD_AREAS, txn=0),
            curated={},
            bodies={},
            api_keys={KEYS.api_key_id: TENANT, FOREIGN.api_key_id: OTHER_TENANT},
        )
        self.seq = 0
        self.journal_seq = 0

    def op(self, name: str, payload: dict, journal_seq: int | None = None) -> catalog.Op:
        """Parse the next outbox row (raises RefusedOp as the writer's parse step would)."""
        self.seq += 1
        self.journal_seq = journal_seq or self.journal_seq + 1
        return catalog.parse(
            name, payload, seq=self.seq, journal_seq=self.journal_seq, tenant_id=TENANT
        )

    def run(self, name: str, payload: dict, journal_seq: int | None = None) -> str | None:
        """Parse, check and apply one op; the refusal's reason, or None when it applied."""
        try:
            op = self.op(name, payload, journal_seq)
            catalog.check(op, self.state)
        except RefusedOp as refused:
            return refused.reason
        catalog.apply(op, self.state)
        return None

    def act(self, act: acts.Act, journal_seq: int | None = None) -> str | None:
        ((name, payload),) = act.ops
        return self.run(name, payload, journal_seq)

    def ok(self, act: acts.Act, journal_seq: int | None = None) -> None:
        assert self.act(act, journal_seq) is None

    def refused(self, act: acts.Act, journal_seq: int | None = None) -> str:
        before = snapshot(self.state)
        reason = self.act(act, journal_seq)
        assert reason is not None, "expected a refusal"
        assert snapshot(self.state) == before  # a refused op changes nothing
        return reason

    def row(self, claim: acts.Claim) -> dict:
        return self.state.silver.get((claim.artifact_id, claim.version))

    def area(self, workarea_id: str) -> dict:
        return self.state.areas.get((workarea_id,))


def snapshot(state: TenantState) -> dict:
    return copy.deepcopy(
        {
            "silver": state.silver.rows,
            "lineage": state.lineage.rows,
            "areas": state.areas.rows,
            "curated": {w: c.rows for w, c in state.curated.items()},
            "bronze": state.bronze.rows,
            "events": state.events,
        }
    )


def tree(fold: Fold, a_status: str = "committed") -> Fold:
    """root u (committed), u.a (a_status), u.b (committed), u.a.a1 (development)."""
    fold.ok(acts.upsert_area_act(ROOT, T0, parent_id=None, path="u", status="committed"))
    fold.ok(acts.upsert_area_act(A, T0, parent_id=ROOT, path="u.a", status=a_status))
    fold.ok(acts.upsert_area_act(B, T0, parent_id=ROOT, path="u.b", status="committed"))
    fold.ok(acts.upsert_area_act(A1, T0, parent_id=A, path="u.a.a1", status="development"))
    return fold


def claim(n: int, area: str = A, version: int = 1, **kw) -> acts.Claim:
    digest = hashlib.sha256(f"{n}/{version}".encode()).hexdigest()
    return acts.Claim(
        uid(100 + n),
        version,
        area,
        "u.a",
        claim_key=uid(500 + n),
        plaintext_digest=digest,
        ciphertext_digest=hashlib.sha256(digest.encode()).hexdigest(),
        created_at=T0,
        promoted_at=T0,
        **kw,
    )


def tainted(n: int, area: str = A, sim: str = SIM) -> acts.Claim:
    return claim(n, area, simulation_id=sim, provenance="simulation")


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


@pytest.fixture
def fold() -> Fold:
    return tree(Fold())


# --- promote -----------------------------------------------------------------------------------


def test_promote_inserts_a_promoted_row_with_its_body_from_claim_bodies(fold):
    c, o = claim(1), claim(2, body_ref="object")
    fold.state.bodies[(c.artifact_id, 1)] = b"ciphertext"
    fold.ok(acts.promote_act(c))
    fold.ok(acts.promote_act(o))
    row = fold.row(c)
    assert (row["state"], row["body_ciphertext"], row["retracted_at"], row["fold_seq"]) == (
        "promoted",
        b"ciphertext",
        None,
        None,
    )
    assert row["tenant_id"] == TENANT and row["applied_seq"] == fold.seq - 1
    assert row["workarea_id"] == A and row["plaintext_digest"] == c.plaintext_digest
    assert fold.row(o)["body_ciphertext"] is None  # body_ref object: no lake body


def test_promote_of_a_shredded_body_lands_without_one(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    assert fold.row(c)["body_ciphertext"] is None


def test_promote_replay_of_a_promoted_row_changes_nothing(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    before = snapshot(fold.state)
    fold.ok(acts.promote_act(c))
    assert snapshot(fold.state) == before


def test_promote_refusals(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    other = claim(1)
    other.plaintext_digest = "f" * 64
    assert "with another plaintext_digest" in fold.refused(acts.promote_act(other))
    fold.ok(acts.demote_act(c, at(1)))
    assert "of a demoted row" in fold.refused(acts.promote_act(c))
    assert "gold.areas does not hold" in fold.refused(acts.promote_act(claim(2, uid(77))))
    assert "self_signed development rows" in fold.refused(
        acts.promote_act(claim(3), self_signed=True)
    )
    no_sim = claim(4, provenance="simulation")
    assert "'simulation_id' is required" in fold.refused(acts.promote_act(no_sim))


def test_held_row_promoted_again_reads_its_body_and_clears_retracted_at(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.reassign_act(c, B, True, at(1)))
    assert fold.row(c)["state"] == "held"
    fold.state.bodies[(c.artifact_id, 1)] = b"body"
    fold.ok(acts.repromote_act(c))
    row = fold.row(c)
    assert (row["state"], row["body_ciphertext"], row["retracted_at"]) == (
        "promoted",
        b"body",
        None,
    )


# --- demote, erase -----------------------------------------------------------------------------


def test_demote_sets_state_and_retracted_at_and_a_second_demote_changes_nothing(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.demote_act(c, at(5)))
    row = fold.row(c)
    assert (row["state"], row["retracted_at"]) == ("demoted", at(5))
    before = snapshot(fold.state)
    fold.ok(acts.demote_act(c, at(6)))  # a move the row already made: not an error
    assert snapshot(fold.state) == before


def test_erase_nulls_body_and_attachments_and_keeps_digests(fold):
    attachment = {
        "plaintext_digest": "a" * 64,
        "ciphertext_digest": "b" * 64,
        "media_type": "text/csv",
        "size_bytes": 3,
    }
    c = claim(1, attachments=[attachment])
    fold.state.bodies[(c.artifact_id, 1)] = b"body"
    fold.ok(acts.promote_act(c))
    fold.ok(acts.demote_act(c, at(1)))
    fold.ok(acts.erase_act(c, at(2)))  # demoted -> erased
    row = fold.row(c)
    assert (row["state"], row["body_ciphertext"], row["attachments"]) == ("erased", None, None)
    assert row["retracted_at"] == at(2) and row["ciphertext_digest"] == c.ciphertext_digest


def test_erased_is_terminal(fold):
    c = claim(1, area=A)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.erase_act(c, at(1)))
    before = snapshot(fold.state)
    for later in (
        acts.demote_act(c, at(2)),
        acts.erase_act(c, at(3)),
        acts.promote_act(c),
        acts.reassign_act(c, B, True, at(4)),
        acts.repair_act(c, 99, "promoted"),
        acts.simulation_end_act(SIM, True, at(5)),
    ):
        fold.ok(later)  # none of them is an error...
    assert snapshot(fold.state)["silver"] == before["silver"]  # ...and none changes the row


@pytest.mark.parametrize("name", ["claim.demote", "claim.erase"])
def test_retract_of_a_row_the_lake_does_not_hold_is_refused(fold, name):
    c = claim(1)
    act = acts.demote_act(c) if name == "claim.demote" else acts.erase_act(c)
    expected = f"{name} of a row the lake does not hold: artifact {c.artifact_id} version 1"
    assert fold.refused(act) == expected


# --- reassign ----------------------------------------------------------------------------------


def test_reassign_moves_the_row_and_held_keeps_its_body(fold):
    c = claim(1)
    fold.state.bodies[(c.artifact_id, 1)] = b"body"
    fold.ok(acts.promote_act(c))
    fold.ok(acts.reassign_act(c, B, False, at(1)))
    row = fold.row(c)
    assert (row["workarea_id"], row["state"], row["workarea_path_at_write"]) == (
        B,
        "promoted",
        "u.a",
    )
    fold.ok(acts.reassign_act(c, A, True, at(2)))
    row = fold.row(c)
    assert (row["workarea_id"], row["state"], row["body_ciphertext"]) == (A, "held", b"body")
    assert row["retracted_at"] is None


def test_reassign_refusals(fold):
    c, frozen = claim(1), claim(2)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.promote_act(frozen))
    assert "which gold.areas does not hold" in fold.refused(acts.reassign_act(c, uid(77), False))
    assert "does not hold" in fold.refused(acts.reassign_act(claim(3), B, False))
    fold.ok(acts.reassign_act(c, B, False, at(1)))
    fold.ok(acts.validate_area_act(A, at(2)))
    assert f"out of validated workarea {A} is refused by freeze" in fold.refused(
        acts.reassign_act(frozen, B, False)
    )
    assert "into held inside validated workarea" in fold.refused(acts.reassign_act(frozen, A, True))


def test_reassign_into_a_validated_area_is_refused(fold):
    c = claim(1, area=B)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.validate_area_act(A, at(1)))
    reason = fold.refused(acts.reassign_act(c, A, False))
    assert reason == f"claim.reassign into validated workarea {A} is refused by freeze"


# --- repair and fold_seq -----------------------------------------------------------------------


def test_repair_replaces_the_row_and_refuses_ops_not_newer_than_its_fold_seq(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.repair_act(c, 20, "demoted"))
    row = fold.row(c)
    assert (row["state"], row["fold_seq"]) == ("demoted", 20)
    reason = fold.refused(acts.erase_act(c, at(1)), journal_seq=20)
    assert "at journal_seq 20 is not newer than the row's fold_seq 20" in reason
    assert "is lower than the row's fold_seq 20" in fold.refused(acts.repair_act(c, 19, "erased"))
    fold.ok(acts.erase_act(c, at(2)), journal_seq=21)
    assert fold.row(c)["state"] == "erased"


def test_repair_inserts_a_missing_row_but_never_a_held_one(fold):
    c = claim(1)
    fold.ok(acts.repair_act(c, 5, "promoted"))
    assert fold.row(c)["fold_seq"] == 5
    assert "would admit a held body" in fold.refused(acts.repair_act(claim(2), 5, "held"))


def test_repair_inside_a_validated_area_keeps_the_freeze(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.validate_area_act(A, at(1)))
    fold.ok(acts.repair_act(c, 30, "demoted"))
    curated = fold.state.curated_for(A).get((c.artifact_id, 1))
    assert (curated["state"], curated["fold_seq"]) == ("demoted", 30)  # silver and curated agree
    assert "from demoted to promoted inside validated" in fold.refused(
        acts.repair_act(c, 31, "promoted")
    )
    sim = tainted(1)
    assert "would put a simulation-tainted row" in fold.refused(acts.repair_act(sim, 32, "demoted"))


# --- simulation end ----------------------------------------------------------------------------


def test_simulation_end_demotes_its_rows_and_edges_and_the_closure_only_when_asked(fold):
    own, derived, other = tainted(1), claim(2, sim_derived_ids=[SIM]), tainted(3, sim=SIM2)
    for c in (own, derived, other):
        fold.ok(acts.promote_act(c))
    edge = acts.Edge(uid(60), own.artifact_id, derived.artifact_id, simulation_id=SIM)
    fold.ok(acts.ratify_act(edge))
    fold.ok(acts.simulation_end_act(SIM, False, at(3)))
    states = [fold.row(c)["state"] for c in (own, derived, other)]
    assert states == ["demoted", "promoted", "promoted"]
    assert fold.row(own)["retracted_at"] == at(3)
    assert fold.state.lineage.get((edge.edge_id,))["state"] == "demoted"
    fold.ok(acts.simulation_end_act(SIM, True, at(4)))
    assert [fold.row(c)["state"] for c in (own, derived, other)] == [
        "demoted",
        "demoted",
        "promoted",
    ]


def test_simulation_end_leaves_rows_a_newer_repair_owns(fold):
    c = tainted(1)
    fold.ok(acts.promote_act(c))
    fold.ok(acts.repair_act(c, 50, "promoted"))
    fold.ok(acts.simulation_end_act(SIM, True, at(1)), journal_seq=40)
    assert fold.row(c)["state"] == "promoted"


# --- edges -------------------------------------------------------------------------------------


def test_supersede_a_new_version_with_a_ratified_edge(fold):
    v1, v2 = claim(1), claim(1, version=2)
    fold.ok(acts.promote_act(v1))
    fold.ok(acts.promote_act(v2))
    edge = acts.Edge(
        uid(61), v2.artifact_id, v1.artifact_id, edge_label="supersedes", src_version=2
    )
    fold.ok(acts.ratify_act(edge))
    fold.ok(acts.demote_act(v1, at(1)))
    row = fold.state.lineage.get((edge.edge_id,))
    assert (row["state"], row["edge_label"], row["src_version"], row["dst_version"]) == (
        "ratified",
        "supersedes",
        2,
        1,
    )
    assert [fold.row(v)["state"] for v in (v1, v2)] == ["demoted", "promoted"]


def test_edge_ratify_and_demote(fold):
    a, b = claim(1), claim(2)
    fold.ok(acts.promote_act(a))
    fold.ok(acts.promote_act(b))
    edge = acts.Edge(uid(62), a.artifact_id, b.artifact_id)
    fold.ok(acts.ratify_act(edge))
    before = snapshot(fold.state)
    fold.ok(acts.ratify_act(edge))  # a replay of the same edge
    assert snapshot(fold.state) == before
    changed = acts.Edge(uid(62), a.artifact_id, b.artifact_id, edge_label="supersedes")
    assert "that the lake holds otherwise" in fold.refused(acts.ratify_act(changed))
    fold.ok(acts.demote_edge_act(edge.edge_id, at(1)))
    assert fold.state.lineage.get((edge.edge_id,))["state"] == "demoted"
    fold.ok(acts.demote_edge_act(edge.edge_id, at(2)))
    assert "of an edge the lake does not hold" in fold.refused(acts.demote_edge_act(uid(63)))


def test_edge_refusals(fold):
    a = claim(1)
    fold.ok(acts.promote_act(a))
    same = acts.Edge(uid(64), a.artifact_id, a.artifact_id, proposer="k", ratifier="k")
    assert "ratifier equals the proposer ('k'); R2 forbids it" in fold.refused(
        acts.ratify_act(same)
    )
    missing = acts.Edge(uid(65), a.artifact_id, uid(300))
    assert "endpoint dst" in fold.refused(acts.ratify_act(missing))
    area_label = acts.Edge(uid(66), a.artifact_id, a.artifact_id, edge_label="mirrors")
    assert "is not a claim edge label" in fold.refused(acts.ratify_act(area_label))
    versioned = acts.Edge(uid(67), A, B, graph="workarea", edge_label="mirrors")
    assert "must be null for a workarea edge" in fold.refused(acts.ratify_act(versioned))
    areas = acts.Edge(
        uid(68), A, B, graph="workarea", edge_label="mirrors", src_version=None, dst_version=None
    )
    fold.ok(acts.ratify_act(areas))


# --- areas -------------------------------------------------------------------------------------


def test_area_create_requires_a_known_parent_and_a_path_under_it():
    fold = Fold()
    assert "lacks path, status" in fold.refused(acts.upsert_area_act(ROOT, T0))
    assert "has a one-label path" in fold.refused(
        acts.upsert_area_act(ROOT, T0, parent_id=None, path="u.v", status="committed")
    )
    tree(fold)
    assert "the tenant's root is" in fold.refused(
        acts.upsert_area_act(uid(10), T0, parent_id=None, path="v", status="committed")
    )
    assert "under an unknown parent" in fold.refused(
        acts.upsert_area_act(uid(10), T0, parent_id=uid(11), path="u.x", status="committed")
    )
    assert "as its own parent" in fold.refused(
        acts.upsert_area_act(uid(10), T0, parent_id=uid(10), path="u.x", status="committed")
    )
    assert "does not extend its parent's path" in fold.refused(
        acts.upsert_area_act(uid(10), T0, parent_id=A, path="u.b.x", status="committed")
    )
    area = fold.area(A1)
    assert (area["parent_id"], area["path"], area["status"], area["created_at"]) == (
        A,
        "u.a.a1",
        "development",
        T0,
    )


def test_area_status_climbs_the_ladder_only(fold):
    fold.ok(acts.upsert_area_act(A1, at(1), status="committed", crew_name="crew-1"))
    area = fold.area(A1)
    assert (area["status"], area["crew_name"], area["updated_at"]) == ("committed", "crew-1", at(1))
    assert "cannot move down the ladder" in fold.refused(
        acts.upsert_area_act(A1, at(2), status="development")
    )
    assert "validated is set by area.validate" in fold.refused(
        acts.upsert_area_act(A1, at(2), status="validated")
    )
    assert "area.reparent moves a workarea" in fold.refused(
        acts.upsert_area_act(A1, at(2), path="u.b.a1")
    )
    before = snapshot(fold.state)
    fold.ok(acts.upsert_area_act(A1, at(3), status="committed"))  # nothing new: no change
    assert snapshot(fold.state) == before


def test_area_move_rewrites_the_subtree_paths(fold):
    leaf = uid(5)
    fold.ok(acts.upsert_area_act(leaf, T0, parent_id=A1, path="u.a.a1.leaf", status="committed"))
    fold.ok(acts.reparent_area_act(A, B, "u.b.a", at(1)))
    paths = {w: fold.area(w)["path"] for w in (A, A1, leaf)}
    assert paths == {A: "u.b.a", A1: "u.b.a.a1", leaf: "u.b.a.a1.leaf"}
    assert fold.area(A)["parent_id"] == B and fold.area(leaf)["updated_at"] == at(1)
    assert "makes a cycle" in fold.refused(acts.reparent_area_act(A, leaf, "u.b.a.a1.leaf.a"))
    assert "the root has no parent" in fold.refused(acts.reparent_area_act(ROOT, B, "u.b.u"))
    assert "under an unknown parent" in fold.refused(acts.reparent_area_act(A, uid(77), "x.a"))
    assert "does not extend its parent's path" in fold.refused(
        acts.reparent_area_act(A1, ROOT, "u.b.a1")
    )


def test_validate_creates_curated_from_promoted_rows_and_freezes_the_area(fold):
    promoted, demoted, held = claim(1), claim(2), claim(3, area=B)
    for c in (promoted, demoted, held):
        fold.ok(acts.promote_act(c))
    fold.ok(acts.demote_act(demoted, at(1)))
    fold.ok(acts.reassign_act(held, A, True, at(2)))
    fold.ok(acts.validate_area_act(A, at(3)))
    assert fold.area(A)["status"] == "validated"
    curated = fold.state.curated_for(A)
    assert set(curated.rows) == {(promoted.artifact_id, 1)}
    assert curated.get((promoted.artifact_id, 1))["curated_at"] == at(3)
    before = snapshot(fold.state)
    fold.ok(acts.validate_area_act(A, at(4)))  # validating again changes nothing
    assert snapshot(fold.state) == before
    assert "its status is frozen" in fold.refused(
        acts.upsert_area_act(A, at(5), status="committed")
    )
    assert "refused by freeze" in fold.refused(acts.promote_act(claim(4)))
    assert "refused by freeze" in fold.refused(acts.repromote_act(held))
    # Demote and erase reach the curated table under the same op.
    fold.ok(acts.erase_act(promoted, at(6)))
    row = curated.get((promoted.artifact_id, 1))
    assert (row["state"], row["body_ciphertext"]) == ("erased", None)
    assert row["applied_seq"] == fold.row(promoted)["applied_seq"] == fold.seq


def test_validate_refusals(fold):
    assert "only a committed area is validated" in fold.refused(acts.validate_area_act(A1))
    assert "of an unknown workarea" in fold.refused(acts.validate_area_act(uid(77)))
    fold.ok(acts.promote_act(tainted(1)))
    reason = fold.refused(acts.validate_area_act(A))
    assert "simulation-tainted rows cannot enter a validated area" in reason


# --- journal.event -----------------------------------------------------------------------------


def event_payload(journal_seq: int, signer: TenantKeys = KEYS, event_n: int = 0) -> dict:
    payload, _ = journal_entry(
        signer,
        TENANT,
        journal_seq,
        GENESIS_HASH,
        Event("claim.demoted", {"n": event_n}),
        at(journal_seq),
        uid(700 + 10 * journal_seq + event_n),
    )
    return payload


def test_journal_event_appends_bronze_once_per_journal_seq():
    fold = Fold()
    assert fold.run("journal.event", event_payload(1), journal_seq=1) is None
    assert fold.run("journal.event", event_payload(1), journal_seq=1) is None  # a replay
    (row,) = fold.state.bronze.rows
    assert (row["journal_seq"], row["event_id"], row["outbox_seq"]) == (1, uid(710), 1)
    assert row["event_date"] == at(1).date() and row["tenant_id"] == TENANT
    reason = fold.run("journal.event", event_payload(1, event_n=1), journal_seq=1)
    assert "journal_seq 1 is already held by event" in reason
    assert len(fold.state.bronze.rows) == 1


def test_journal_event_refusals():
    fold = Fold()
    wrong_seq = fold.run("journal.event", event_payload(2), journal_seq=3)
    assert "is not the outbox row's journal_seq 3" in wrong_seq
    foreign = fold.run("journal.event", event_payload(4, FOREIGN), journal_seq=4)
    assert f"wrong tenant: api key 'key-2' belongs to {OTHER_TENANT}" in foreign
    unknown = dict(event_payload(5), api_key_id="key-9")
    assert "unknown key 'key-9'" in fold.run("journal.event", unknown, journal_seq=5)
    assert fold.state.bronze.rows == [] and fold.state.events == {}


# --- parse refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "payload", "reason"),
    [
        ("claim.archive", {}, "unknown op 'claim.archive'"),
        ("claim.demote", [], "claim.demote: payload is not a JSON object"),
        ("claim.demote", {"artifact_id": uid(1), "at": instant(T0)}, "'version' is missing"),
        (
            "claim.demote",
            {"artifact_id": uid(1), "version": "1", "at": instant(T0)},
            "expected an integer",
        ),
        (
            "claim.demote",
            {"artifact_id": uid(1), "version": 1, "at": "20261101T120000Z"},
            "RFC 3339",
        ),
        (
            "claim.demote",
            {"artifact_id": uid(1), "version": 1, "at": instant(T0), "tenant_id": OTHER_TENANT},
            "wrong tenant: payload tenant_id",
        ),
    ],
)
def test_parse_refuses_bad_input(name, payload, reason):
    with pytest.raises(RefusedOp) as refused:
        catalog.parse(name, payload, seq=1, journal_seq=1, tenant_id=TENANT)
    assert reason in refused.value.reason


def test_unknown_fields_are_refused_after_the_ops_own_rules(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    payload = {"artifact_id": c.artifact_id, "version": 1, "at": instant(T0), "why": "x"}
    assert fold.run("claim.demote", payload) == "claim.demote: unknown field(s) 'why'"
    missing = {"artifact_id": uid(300), "version": 1, "at": instant(T0), "why": "x"}
    assert "of a row the lake does not hold" in fold.run("claim.demote", missing)
    assert fold.row(c)["state"] == "promoted"


def test_an_op_at_or_below_a_tables_txn_changes_nothing(fold):
    """A table whose txn covers an op's seq committed that op's batch before a crash: the op
    is folded again (for the tables that did not commit) but this table does not take it."""
    c = claim(1)
    fold.ok(acts.promote_act(c))
    fold.state.silver.txn = fold.seq + 1
    before = snapshot(fold.state)["silver"]
    fold.ok(acts.demote_act(c, at(1)))  # seq == txn
    assert snapshot(fold.state)["silver"] == before
    fold.ok(acts.demote_act(c, at(2)))  # seq above txn
    assert fold.row(c)["state"] == "demoted"


# --- properties over op sequences --------------------------------------------------------------

ARTIFACTS = [(n, v) for n in range(3) for v in (1, 2)]
AREAS = [ROOT, A, B, A1]
# Mostly the areas that start committed, so validations find rows to freeze.
HOMES = [A, A, B, B, ROOT, A1]
PROMOTE = st.tuples(
    st.just("promote"),
    st.sampled_from(ARTIFACTS),
    st.sampled_from(HOMES),
    st.sampled_from([None, None, None, SIM, SIM2]),  # mostly clean: tainted rows block validation
    st.booleans(),
)
STEP = st.one_of(
    PROMOTE,
    PROMOTE,  # twice as likely: most other ops need a row to act on
    st.tuples(st.sampled_from(["demote", "erase", "repromote"]), st.sampled_from(ARTIFACTS)),
    st.tuples(
        st.just("reassign"), st.sampled_from(ARTIFACTS), st.sampled_from(AREAS), st.booleans()
    ),
    st.tuples(
        st.just("repair"),
        st.sampled_from(ARTIFACTS),
        st.sampled_from(["promoted", "demoted", "erased", "held"]),
        st.integers(-2, 3),
        st.sampled_from(AREAS),
    ),
    st.tuples(st.just("sim_end"), st.sampled_from([SIM, SIM2]), st.booleans()),
    st.tuples(
        st.just("ratify"),
        st.integers(0, 1),
        st.sampled_from(ARTIFACTS),
        st.sampled_from(ARTIFACTS),
        st.sampled_from([None, SIM]),
    ),
    st.tuples(st.just("edge_demote"), st.integers(0, 1)),
    st.tuples(st.just("commit"), st.sampled_from([A, B, A1])),
    st.tuples(st.just("validate"), st.sampled_from([A, B, A1])),
    st.tuples(st.sampled_from(["demote", "erase", "repromote"]), st.sampled_from(ARTIFACTS)),
    st.tuples(st.just("reparent"), st.sampled_from([A, B, A1]), st.sampled_from(AREAS)),
)


def step_act(fold: Fold, step: tuple) -> acts.Act:
    """The act a generated step stands for, shaped against the tables as they are now."""
    kind, *args = step
    when = at(fold.seq)
    if kind == "promote":
        (n, version), area, sim, derived = args
        c = claim(n, area, version)
        if sim is not None and not derived:
            c.simulation_id, c.provenance = sim, "simulation"
        elif sim is not None:
            c.sim_derived_ids = [sim]
        return acts.promote_act(c)
    if kind in ("demote", "erase", "repromote"):
        n, version = args[0]
        c = claim(n, version=version)
        builders = {"demote": acts.demote_act, "erase": acts.erase_act}
        return acts.repromote_act(c) if kind == "repromote" else builders[kind](c, when)
    if kind == "reassign":
        (n, version), area, held = args
        return acts.reassign_act(claim(n, version=version), area, held, when)
    if kind == "repair":
        (n, version), state, ahead, area = args
        return acts.repair_act(claim(n, area, version), fold.journal_seq + 1 + ahead, state)
    if kind == "sim_end":
        return acts.simulation_end_act(args[0], args[1], when)
    if kind == "ratify":
        e, (s, sv), (d, dv), sim = args
        src, dst = claim(s, version=sv), claim(d, version=dv)
        edge = acts.Edge(
            uid(60 + e), src.artifact_id, dst.artifact_id, src_version=sv, dst_version=dv
        )
        edge.simulation_id, edge.proposed_at, edge.ratified_at = sim, T0, T0
        return acts.ratify_act(edge)
    if kind == "edge_demote":
        return acts.demote_edge_act(uid(60 + args[0]), when)
    if kind == "commit":
        return acts.upsert_area_act(args[0], when, status="committed")
    if kind == "validate":
        return acts.validate_area_act(args[0], when)
    node, parent = args
    parent_area = fold.area(parent)
    label = fold.area(node)["path"].rsplit(".", 1)[-1]
    return acts.reparent_area_act(node, parent, f"{parent_area['path']}.{label}", when)


# Every move the claim state ladder admits (DESIGN §2); staying put is always allowed.
LADDER = {
    ("promoted", "demoted"),
    ("promoted", "erased"),
    ("promoted", "held"),
    ("held", "promoted"),
    ("held", "demoted"),
    ("held", "erased"),
    ("demoted", "erased"),
}


def seeded(fold: Fold | None = None) -> Fold:
    """The tree with a clean promoted row in each committed area, so that short generated
    sequences already validate, move and retract rows that matter."""
    fold = tree(fold or Fold())
    for n, home in ((0, A), (1, B), (2, A)):
        fold.ok(acts.promote_act(claim(n, home)))
    return fold


def _tainted(row: dict) -> bool:
    return bool(row["simulation_id"] or row["sim_derived_ids"])


@settings(max_examples=400, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60))
def test_fold_rules_hold_for_every_op_sequence(steps):
    """After every op: checks never change a table, and a refused op changes nothing; state moves
    only along the ladder (but for a repair) and never leaves erased (all of an erased row is
    frozen, repairs included); no row
    repaired before is changed by an op not newer than its fold_seq; a validated area holds no
    tainted promoted or held row, and every promoted row of a validated area is in its curated
    table, in the same state as in silver."""
    fold = seeded()
    for step in steps:
        act = step_act(fold, step)
        before = snapshot(fold.state)
        ((name, payload),) = act.ops
        try:
            op = fold.op(name, payload)
            catalog.check(op, fold.state)
        except RefusedOp:
            assert snapshot(fold.state) == before
            continue
        assert snapshot(fold.state) == before  # check only reads
        catalog.apply(op, fold.state)
        after = snapshot(fold.state)
        for key, old in before["silver"].items():
            new = after["silver"][key]
            if old["state"] == "erased":
                assert new == old
            elif name != "claim.repair":  # a repair writes the journal-folded row as it is
                assert old["state"] == new["state"] or (old["state"], new["state"]) in LADDER
            if old["fold_seq"] is not None and op.journal_seq <= old["fold_seq"]:
                assert name == "claim.repair" or new == old
        status = {w: a["status"] for w, a in after["areas"].items()}
        for row in after["silver"].values():
            if status.get((row["workarea_id"],)) == "validated":
                assert not (_tainted(row) and row["state"] in ("promoted", "held")), row
        for workarea_id, rows in after["curated"].items():
            for key, row in rows.items():
                silver = after["silver"][key]
                assert row["state"] == silver["state"], (workarea_id, row, silver)
            promoted = {
                key
                for key, row in after["silver"].items()
                if row["workarea_id"] == workarea_id and row["state"] == "promoted"
            }
            assert promoted <= set(rows), workarea_id  # nothing enters promoted after the freeze


@settings(max_examples=100, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=30))
def test_applying_an_op_twice_is_applying_it_once(steps):
    """`apply` is harmless on a table that already holds the op's effect: a fold that applies
    every admitted op twice ends with the same tables as one that applies it once."""
    once, twice = seeded(), seeded()
    for step in steps:
        for fold in (once, twice):
            act = step_act(fold, step)
            ((name, payload),) = act.ops
            try:
                op = fold.op(name, payload)
                catalog.check(op, fold.state)
            except RefusedOp:
                continue
            catalog.apply(op, fold.state)
            if fold is twice:
                catalog.apply(op, fold.state)
        assert snapshot(twice.state) == snapshot(once.state)


# --- one fold: the writer's batches and the reconciler's pass ----------------------------------
# `catalog.fold` is the writer's fold (a batch at a time, its decided frontier, the refusals
# recorded so far) and the reconciler's (the whole outbox, every op decided, read-only). These
# tests fold the same outbox rows both ways, as `TenantBatch.fold` and
# `reconcile.fold_outbox` call it, and compare the rows.


class Recording(Fold):
    """A `Fold` that keeps every outbox row it was given, (seq, journal_seq, op, payload)."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, int, str, dict]] = []

    def op(self, name: str, payload: dict, journal_seq: int | None = None) -> catalog.Op:
        try:
            return super().op(name, payload, journal_seq)
        finally:
            self.rows.append((self.seq, self.journal_seq, name, payload))


def blank() -> TenantState:
    return Fold().state


def tables(state: TenantState) -> dict:
    rows = snapshot(state)
    return {name: rows[name] for name in ("silver", "lineage", "areas", "curated")}


def writer_folds(rows: list[tuple], cuts: list[int]) -> tuple[TenantState, dict[int, str], dict]:
    """The writer's way: the rows in batches of the sizes `cuts` cycles through, each folded with
    the decided frontier and the refusals recorded before it, its new refusals recorded after.
    Each batch is also folded again from the state before it, its verdicts now decided (a run
    that crashed before its commits), and must leave the same tables. Returns the state, the
    refusals, and the tables after each batch by the batch's end."""
    state, recorded, after = blank(), {}, {}
    decided, start, n = 0, 0, 0
    while start < len(rows):
        batch = rows[start : start + cuts[n % len(cuts)]]
        start, n = start + len(batch), n + 1
        ops = [
            (r[0], catalog.parsed(r[2], r[3], seq=r[0], journal_seq=r[1], tenant_id=TENANT))
            for r in batch
        ]
        before = copy.deepcopy(state)
        verdicts = catalog.fold(ops, state, decided=decided, recorded=recorded)
        assert verdicts.unparsable == {}  # nothing below the frontier in a first fold
        recorded.update(verdicts.refused)
        decided = batch[-1][0]
        replay = catalog.fold(ops, before, decided=decided, recorded=recorded)
        assert replay.refused == {} and replay.unparsable == {}
        assert tables(before) == tables(state)
        after[decided] = tables(state)
    return state, recorded, after


def reconciler_fold(
    rows: list[tuple], recorded: dict[int, str], through: list[int]
) -> tuple[TenantState, catalog.Verdicts, dict]:
    """The reconciler's way: every row parsed lazily from the stream, every op decided, the
    recorded refusals skipped, the tables taken as the fold passes each txn in `through`."""
    state, pending, taken = blank(), sorted(through), {}

    def take_through(seq: int, _op: object = None) -> None:
        while pending and pending[0] < seq:
            taken[pending.pop(0)] = tables(state)

    stream = (
        (r[0], catalog.parsed(r[2], r[3], seq=r[0], journal_seq=r[1], tenant_id=TENANT))
        for r in rows
    )
    last = rows[-1][0] if rows else 0
    verdicts = catalog.fold(stream, state, decided=last, recorded=recorded, on_op=take_through)
    take_through(2**63)
    return state, verdicts, taken


UNPARSABLE = st.just(("unparsable",))


def outbox(steps: list[tuple]) -> tuple[list[tuple], Recording]:
    """The outbox rows of the seeded tree and `steps`, each folded by parse, check and apply as
    it was written (so that a step is shaped against the tables of its time)."""
    ref = seeded(Recording())
    for step in steps:
        if step[0] == "unparsable":
            ref.run("claim.demote", {"artifact_id": "not-a-uuid", "version": 1, "at": instant(T0)})
        else:
            ref.act(step_act(ref, step))
    return ref.rows, ref


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(STEP, UNPARSABLE), min_size=1, max_size=40),
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_the_writer_and_the_reconciler_fold_the_same_rows(steps, cuts):
    """Whatever the op sequence and however it is cut into batches, the reconciler's fold of the
    outbox gives the tables the writer's batches committed, at every batch's end and at the
    last; it finds no op the writer applied that does not parse; and both equal parse, check and
    apply op by op."""
    rows, ref = outbox(steps)
    written, recorded, after = writer_folds(rows, cuts)
    assert tables(written) == tables(ref.state)
    read, verdicts, taken = reconciler_fold(rows, recorded, list(after))
    assert verdicts == catalog.Verdicts()
    assert tables(read) == tables(written)
    assert taken == after


def test_an_op_refused_by_parse_is_refused_once_then_skipped(fold):
    c = claim(1)
    fold.ok(acts.promote_act(c))
    start = copy.deepcopy(fold.state)
    bad = (
        7,
        catalog.parsed(
            "claim.demote", {"artifact_id": c.artifact_id}, seq=7, journal_seq=7, tenant_id=TENANT
        ),
    )
    good = (
        8,
        catalog.parsed(
            "claim.demote",
            acts.demote_act(c, at(1)).ops[0][1],
            seq=8,
            journal_seq=8,
            tenant_id=TENANT,
        ),
    )
    assert isinstance(bad[1], RefusedOp) and isinstance(good[1], catalog.Op)
    verdicts = catalog.fold([bad, good], fold.state, decided=6, recorded={})
    assert verdicts.refused == {7: "claim.demote: field 'version' is missing"}
    assert fold.row(c)["state"] == "demoted"
    # Decided and recorded: skipped, and not reported.
    replay = copy.deepcopy(start)
    verdicts = catalog.fold([bad, good], replay, decided=8, recorded={7})
    assert verdicts == catalog.Verdicts()
    assert tables(replay) == tables(fold.state)


def test_an_applied_op_that_no_longer_parses_is_reported_and_skipped(fold):
    """An op at or below the frontier with no recorded refusal was applied when it was decided;
    if today's catalog refuses to parse it, the fold says so (the reconciler's finding) and
    applies nothing for it."""
    c = claim(1)
    fold.ok(acts.promote_act(c))
    before = tables(fold.state)
    bad = (
        9,
        catalog.parsed(
            "claim.demote", {"artifact_id": c.artifact_id}, seq=9, journal_seq=9, tenant_id=TENANT
        ),
    )
    verdicts = catalog.fold([bad], fold.state, decided=9, recorded=set())
    assert verdicts == catalog.Verdicts(unparsable={9: "claim.demote: field 'version' is missing"})
    assert tables(fold.state) == before


def test_a_decided_op_is_applied_unchecked(fold, monkeypatch):
    """Only an op past the frontier is checked: at or below it the verdict is the recorded one
    (the reconciler checks nothing, the writer's replay of a decided batch neither)."""
    c = claim(1)
    fold.ok(acts.promote_act(c))
    op = fold.op("claim.demote", acts.demote_act(c, at(1)).ops[0][1])
    start = copy.deepcopy(fold.state)

    def refuse(op, state):
        raise RefusedOp("checked")

    monkeypatch.setattr(catalog, "check", refuse)
    seen = []
    verdicts = catalog.fold(
        [(op.seq, op)],
        fold.state,
        decided=op.seq,
        recorded=set(),
        on_op=lambda seq, o: seen.append((seq, o.name)),
    )
    assert verdicts == catalog.Verdicts() and seen == [(op.seq, "claim.demote")]
    assert fold.row(c)["state"] == "demoted"
    verdicts = catalog.fold([(op.seq, op)], start, decided=op.seq - 1, recorded=set())
    assert verdicts.refused == {op.seq: "checked"}
    assert start.silver.get((c.artifact_id, 1))["state"] == "promoted"
