"""Bad input: each class DESIGN §2 says the lake-writer refuses, written as an extra outbox row
inside an otherwise-normal act (never as an act of its own, so the chain is never broken) and
marked with `FAULT_KEY` naming its class (for a forged journal event, an extra field outside the
signed envelope), so checks can tell injected faults from real refusals."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

from . import acts
from .acts import Claim, Edge
from .areas import AreaTree
from .claims import Claims
from .model import Journal
from .producer import Act, Forgery, TenantKeys, instant

FAULT_KEY = "sim_fault"
# Each class of bad input DESIGN §2 says the lake-writer refuses.
FAULTS = (
    "unknown_op",
    "missing_field",
    "mistyped_field",
    "wrong_tenant_payload",
    "wrong_tenant_key",
    "self_signed",
    "ratifier_is_proposer",
    "retract_not_held",
    "stale_fold_seq",
)


class FaultInjector:
    """Adds one fault to an act, the classes in shuffled rounds so each comes up as often. A
    journal event under another tenant's key needs a second tenant (`foreign`): with one tenant
    that class is left out. A stale fold_seq needs a repair of a live row, so it is carried by
    the next act `stale_repair` writes (`want_stale`)."""

    def __init__(
        self, journal: Journal, areas: AreaTree, claims: Claims, foreign: Sequence[TenantKeys]
    ):
        self.journal = journal
        self.rng = journal.rng
        self.areas = areas
        self.claims = claims
        self.foreign = list(foreign)
        self.faults: Counter[str] = Counter()  # generated so far, by class
        self.want_stale = False
        self._classes = [f for f in FAULTS if f != "wrong_tenant_key" or self.foreign]
        self._cycle: list[str] = []

    def _next(self) -> str:
        if not self._cycle:
            self._cycle = list(self._classes)
            self.rng.shuffle(self._cycle)
        return self._cycle.pop()

    def inject(self, act: Act) -> None:
        fault = self._next()
        if fault == "stale_fold_seq":
            self.want_stale = True  # carried by the next reconciler repair act
            return
        rng, journal = self.rng, self.journal
        mark = {FAULT_KEY: fault}
        at = instant(journal.now())
        if fault == "wrong_tenant_key":
            act.forgeries.append(Forgery(rng.choice(self.foreign), journal.id(), mark))
        elif fault == "unknown_op":
            act.ops.append(("claim.archive", {"artifact_id": journal.id(), "at": at, **mark}))
        elif fault == "missing_field":  # no `held`
            payload = {"artifact_id": journal.id(), "version": 1, "at": at, **mark}
            root = self.areas.root
            assert root is not None  # the tree is planted before any act
            act.ops.append(("claim.reassign", dict(payload, workarea_id=root.workarea_id)))
        elif fault == "mistyped_field":
            payload = {"artifact_id": journal.id(), "version": "1", "at": at, **mark}
            act.ops.append(("claim.demote", payload))
        elif fault == "wrong_tenant_payload":
            other = rng.choice(self.foreign).tenant_id if self.foreign else journal.id()
            op, payload = act.ops[0]
            act.ops.append((op, {**payload, "tenant_id": other, **mark}))
        elif fault == "self_signed":
            area = self.areas.open_area()
            digest = hashlib.sha256(rng.randbytes(16)).hexdigest()
            claim = Claim(
                journal.id(),
                1,
                area.workarea_id,
                area.path,
                claim_key=journal.id(),
                plaintext_digest=digest,
                ciphertext_digest=hashlib.sha256(digest.encode()).hexdigest(),
            )
            act.ops.append(("claim.promote", {**claim.payload(self_signed=True), **mark}))
        elif fault == "ratifier_is_proposer":
            who = rng.choice(journal.identities)
            edge = Edge(journal.id(), journal.id(), journal.id(), proposer=who, ratifier=who)
            act.ops.append(("edge.ratify", {**edge.payload(), **mark}))
        elif fault == "retract_not_held":
            op = rng.choice(("claim.demote", "claim.erase"))
            act.ops.append((op, {"artifact_id": journal.id(), "version": 1, "at": at, **mark}))
        self.faults[fault] += 1

    def stale_repair(self) -> bool:
        """A reconciler repair (fold_seq = its own journal_seq) followed, in the same act, by an
        op on the repaired row that is not newer than that fold_seq."""
        claims = self.claims
        for _ in range(8):
            if not claims.live:
                return False
            row = claims.any_live().latest
            if row.decided_live:
                break
        else:
            return False
        self.want_stale = False
        act = acts.repair_act(row.claim, self.journal.journal_seq + 1, row.state)
        stale = {
            "artifact_id": row.claim.artifact_id,
            "version": row.claim.version,
            "workarea_id": row.claim.workarea_id,
            "held": False,
            "at": instant(self.journal.now()),
            FAULT_KEY: "stale_fold_seq",
        }
        act.ops.append(("claim.reassign", stale))
        self.faults["stale_fold_seq"] += 1
        self.journal.emit(act)
        return True
