"""The workload's claims: each new claim starts a lifecycle (promotion of versions 1..n, derives
and supersedes edges, demotes, erases, reassigns into and out of held, repairs) that runs while
it is live, interleaved with the other live claims."""

from __future__ import annotations

import hashlib

from . import acts
from .acts import Claim, Edge
from .areas import AreaTree
from .model import Journal, Lifecycle, Row
from .producer import Body, TenantKeys, seal
from .simulations import Simulations

_WORDS = [
    "ledger",
    "invoice",
    "contract",
    "renewal",
    "clause",
    "vendor",
    "budget",
    "forecast",
    "churn",
    "cohort",
    "latency",
    "incident",
    "runbook",
    "rollback",
    "migration",
    "schema",
    "index",
    "replica",
    "quorum",
    "lease",
    "backlog",
    "sprint",
    "roadmap",
    "customer",
    "region",
    "tariff",
    "shipment",
    "audit",
    "policy",
    "retention",
    "consent",
    "grant",
    "review",
]
_WRITERS = {
    "agent": ("agent:planner", "agent:researcher", "agent:summarizer"),
    "human": ("human:ana", "human:ben", "human:chen"),
    "connector": ("connector:drive", "connector:mail"),
    "simulation": ("agent:simulator",),
}
_KINDS = (("memory", 6), ("derived_fact", 3), ("steering", 1))


class Claims:
    """The live lifecycles (`live`) and how many claims have started."""

    def __init__(
        self, journal: Journal, keys: TenantKeys, areas: AreaTree, simulations: Simulations
    ):
        self.journal = journal
        self.rng = journal.rng
        self.keys = keys
        self.areas = areas
        self.simulations = simulations
        self.live: list[Lifecycle] = []
        self.started = 0  # claims promoted for the first time

    def _seal(self, claim: Claim) -> Body:
        rng = self.rng
        words = " ".join(rng.choices(_WORDS, k=rng.randrange(8, 48)))
        plaintext = f"{claim.kind} {claim.claim_key[:8]} v{claim.version}: {words}".encode()
        return seal(
            claim.artifact_id, claim.version, plaintext, rng.randbytes(32), rng.randbytes(12)
        )

    def _attachments(self) -> list[dict]:
        rng = self.rng
        return [
            {
                "plaintext_digest": hashlib.sha256(rng.randbytes(16)).hexdigest(),
                "ciphertext_digest": hashlib.sha256(rng.randbytes(16)).hexdigest(),
                "media_type": rng.choice(("application/pdf", "image/png", "text/csv")),
                "size_bytes": rng.randrange(1_000, 5_000_000),
            }
            for _ in range(rng.randrange(1, 3))
        ]

    def _promote(self, claim: Claim, lifecycle: Lifecycle) -> Row:
        body = self._seal(claim)
        act = acts.promote_act(claim, body)
        if claim.body_ref == "object":
            act.keep_deks = [body]
        self.journal.emit(act)
        row = Row(claim)
        lifecycle.rows.append(row)
        self.areas[claim.workarea_id].rows.add(row)
        self.simulations.track(row)
        return row

    def new_claim(self) -> None:
        rng, journal = self.rng, self.journal
        self.started += 1
        area = self.areas.open_area()
        provenance = rng.choices(("agent", "human", "connector"), (6, 2, 1))[0]
        simulation_id, derived, source = None, None, None
        if self.simulations.open and rng.random() < 0.25:
            simulation_id, provenance = rng.choice(self.simulations.open), "simulation"
        elif self.live and rng.random() < 0.25:
            source = self.live[rng.randrange(len(self.live))].latest
            if source.decided_live and source.state == "promoted":
                taint = set(source.claim.sim_derived_ids or ())
                if source.claim.simulation_id:
                    taint.add(source.claim.simulation_id)
                derived = sorted(taint) or None
            else:
                source = None
        kind = rng.choices([k for k, _ in _KINDS], [w for _, w in _KINDS])[0]
        body_ref = "object" if rng.random() < 0.1 else "lake"
        now = journal.now()
        lifecycle = Lifecycle(
            journal.id(), journal.id(), kind, rng.choices((1, 2, 3), (6, 3, 2))[0]
        )
        claim = Claim(
            lifecycle.artifact_id,
            1,
            area.workarea_id,
            area.path,
            claim_key=lifecycle.claim_key,
            kind=kind,
            writer_identity=rng.choice(_WRITERS[provenance]),
            principal=self.keys.principal,
            producer=rng.choice((None, f"crew-{rng.randrange(100):02d}")),
            provenance=provenance,
            simulation_id=simulation_id,
            sim_derived_ids=derived,
            body_ref=body_ref,
            attachments=self._attachments() if body_ref == "object" else None,
            created_at=now,
            promoted_at=now,
        )
        row = self._promote(claim, lifecycle)
        lifecycle.slot = len(self.live)
        self.live.append(lifecycle)
        if source is not None:
            self._ratify(row, source, "derives_from", lifecycle)

    def any_live(self) -> Lifecycle:
        return self.live[self.rng.randrange(len(self.live))]

    def _retire(self, lifecycle: Lifecycle) -> None:
        last = self.live.pop()
        if last is not lifecycle:
            self.live[lifecycle.slot] = last
            last.slot = lifecycle.slot
        lifecycle.slot = -1

    def _ratify(self, src: Row, dst: Row, label: str, lifecycle: Lifecycle) -> None:
        journal = self.journal
        sim = (
            src.claim.simulation_id
            or dst.claim.simulation_id
            or next(iter(src.claim.sim_derived_ids or dst.claim.sim_derived_ids or ()), None)
        )
        edge_id, proposer, ratifier = journal.reviewers()
        now = journal.now()
        edge = Edge(
            edge_id,
            src.claim.artifact_id,
            dst.claim.artifact_id,
            graph="claim",
            edge_label=label,
            src_version=src.claim.version,
            dst_version=dst.claim.version,
            proposer=proposer,
            ratifier=ratifier,
            simulation_id=sim,
            proposed_at=now,
            ratified_at=now,
        )
        lifecycle.edges.append(edge.edge_id)
        self.simulations.track_edge(sim, edge.edge_id)
        journal.ratify(edge)

    def demote(self, row: Row) -> None:
        self.journal.emit(acts.demote_act(row.claim))
        row.state, row.undecided = "demoted", False

    def step(self, lifecycle: Lifecycle) -> None:
        """One act of `lifecycle`, chosen among those lawful in its latest row's state."""
        rng, journal = self.rng, self.journal
        row = lifecycle.latest
        frozen = self.areas[row.claim.workarea_id].frozen
        options: list[tuple[str, float]] = []
        if row.undecided:
            options = [("demote", 1.0), ("erase", 0.6)]
        elif row.state == "promoted":
            options = [("demote", 0.7), ("erase", 0.35), ("finish", 0.8), ("derive", 0.4)]
            if not frozen:
                options.append(("reassign", 0.6))
                if len(lifecycle.rows) < lifecycle.max_versions:
                    options.append(("version", 1.4))
        elif row.state == "held":
            options = [("demote", 0.5), ("erase", 0.3)]
            options += [("repromote", 2.0), ("reassign", 0.3)] if not frozen else [("finish", 0.5)]
        elif row.state == "demoted":
            options = [("erase", 0.4), ("finish", 1.0)]
        else:
            options = [("finish", 1.0)]
        if any(journal.edges[e] == "ratified" for e in lifecycle.edges):
            options.append(("edge_demote", 0.15))
        if row.decided_live:
            options.append(("repair", 0.02))
        choice = rng.choices([o for o, _ in options], [w for _, w in options])[0]

        if choice == "finish":
            self._retire(lifecycle)
        elif choice == "demote":
            self.demote(row)
        elif choice == "erase":
            alive = [r for r in lifecycle.rows if r.state != "erased"]
            target = row if rng.random() < 0.7 else rng.choice(alive)
            journal.emit(acts.erase_act(target.claim))
            target.state, target.undecided = "erased", False
            if target is row:
                self._retire(lifecycle)
        elif choice == "reassign":
            self._reassign(row)
        elif choice == "repromote":
            journal.emit(acts.repromote_act(row.claim))
            row.state = "promoted"
        elif choice == "version":
            self._new_version(lifecycle)
        elif choice == "derive":
            other = self.any_live().latest
            if other is not row and other.decided_live:
                self._ratify(row, other, "derives_from", lifecycle)
        elif choice == "edge_demote":
            edge_id = rng.choice([e for e in lifecycle.edges if journal.edges[e] == "ratified"])
            journal.edges[edge_id] = "demoted"
            journal.emit(acts.demote_edge_act(edge_id))
        elif choice == "repair":
            journal.emit(acts.repair_act(row.claim, journal.journal_seq + 1, row.state))

    def _reassign(self, row: Row) -> None:
        rng = self.rng
        source = self.areas[row.claim.workarea_id]
        target = self.areas.open_area()
        if target is source:
            targets = [a for a in self.areas.area_list if not a.frozen and a is not source]
            if not targets:
                return
            target = rng.choice(targets)
        held = rng.random() < 0.35
        self.journal.emit(acts.reassign_act(row.claim, target.workarea_id, held))
        source.rows.discard(row)
        target.rows.add(row)
        row.claim.workarea_id = target.workarea_id
        if held and row.state == "promoted":
            row.state = "held"

    def _new_version(self, lifecycle: Lifecycle) -> None:
        rng = self.rng
        prev = lifecycle.latest
        area = self.areas[prev.claim.workarea_id]
        now = self.journal.now()
        base = prev.claim
        claim = Claim(
            lifecycle.artifact_id,
            base.version + 1,
            area.workarea_id,
            area.path,
            claim_key=lifecycle.claim_key,
            kind=lifecycle.kind,
            writer_identity=base.writer_identity,
            principal=base.principal,
            producer=base.producer,
            provenance=base.provenance,
            simulation_id=base.simulation_id,
            sim_derived_ids=base.sim_derived_ids,
            body_ref=base.body_ref,
            attachments=self._attachments() if base.body_ref == "object" else None,
            created_at=now,
            promoted_at=now,
        )
        row = self._promote(claim, lifecycle)
        if rng.random() < 0.6:
            self._ratify(row, prev, "supersedes", lifecycle)
        if rng.random() < 0.5 and prev.decided_live:
            self.demote(prev)
