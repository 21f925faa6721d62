"""The workload `oml-lake simulate` writes: per tenant, a deterministic sequence of acts as the
OML service would commit them (DESIGN §2), generated lazily so a million ops never sit in memory.

A tenant gets an api key, a workarea tree, and a lifecycle per claim: promotion of versions
1..n, ratified edges (ratifier ≠ proposer), demotes, erases (crypto-shred), reassigns (some into
held, then promoted again), simulation runs ending with and without taint closure, area status
changes, crew updates, re-parents and validations. The generator keeps its own model of what the
lake will hold so that every act it writes is lawful:
- nothing is promoted or reassigned into a validated area, nor reassigned out of one;
- an area is validated only once no simulation-tainted row in it can still be promoted or held
  (the generator demotes such rows first, as a reviewer would);
- after `simulation.end` without taint closure the simulation's own rows are treated as
  undecided (promoted or demoted), so only demote and erase, which are lawful in either state,
  ever touch them again.

Bad input (`bad_ratio`): each class of DESIGN §2's bad input is written as an extra outbox row
inside an otherwise-normal act, never as an act of its own, so the chain is never broken. Every
such row carries `FAULT_KEY` naming its class (the journal event's extra field, outside the
signed envelope, for a forged event), so checks can tell injected faults from real refusals.
A journal event under another tenant's key needs a second tenant: with one tenant that class is
left out.

Determinism: everything but wall-clock instants derives from `seed` — tenant ids, keys, area
and claim ids (`uuid.UUID(int=rng.getrandbits(128), version=4)`), plaintexts, DEKs and nonces
(so ciphertexts and digests too), the structure and the faults. Each tenant has its own RNG, so
its sequence does not depend on how writers interleave tenants or batch acts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import acts
from .acts import Claim, Edge
from .producer import Act, Body, Forgery, TenantKeys, instant, seal

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
_AREA_LABELS = ("relates_to", "continues", "derived_from", "mirrors")


@dataclass(frozen=True)
class WorkloadConfig:
    """`claims` is per tenant; `bad_ratio` is the chance that an act carries one bad op."""

    tenants: int = 3
    claims: int = 100
    seed: int = 0
    bad_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.tenants < 1 or self.claims < 1:
            raise ValueError("need at least one tenant and one claim per tenant")
        if not 0.0 <= self.bad_ratio <= 1.0:
            raise ValueError("bad_ratio is a probability: 0 <= bad_ratio <= 1")


@dataclass(frozen=True)
class TenantSpec:
    index: int
    tenant_id: str
    key_seed: bytes
    principal: str


def new_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def tenant_specs(config: WorkloadConfig) -> list[TenantSpec]:
    """The tenants of a workload: ids and key seeds from the seed alone."""
    rng = random.Random(f"oml-sim/{config.seed}")
    specs = []
    for index in range(config.tenants):
        tenant_id = new_id(rng)
        specs.append(TenantSpec(index, tenant_id, rng.randbytes(32), "agent:writer"))
    return specs


# --- the generator's model of what the lake holds ----------------------------------------------


@dataclass(eq=False)
class _Row:
    """One claim version; `undecided` means the lake holds it promoted/held or demoted."""

    claim: Claim
    state: str = "promoted"
    undecided: bool = False

    @property
    def tainted(self) -> bool:
        return bool(self.claim.simulation_id or self.claim.sim_derived_ids)

    @property
    def may_be_live(self) -> bool:
        return self.undecided or self.state in ("promoted", "held")

    @property
    def decided_live(self) -> bool:
        return not self.undecided and self.state in ("promoted", "held")


@dataclass(eq=False)
class _Lifecycle:
    artifact_id: str
    claim_key: str
    kind: str
    max_versions: int
    rows: list[_Row] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)
    slot: int = -1  # position in the live list

    @property
    def latest(self) -> _Row:
        return self.rows[-1]


@dataclass(eq=False)
class _Area:
    workarea_id: str
    parent_id: str | None
    label: str
    path: str
    status: str
    rows: set[_Row] = field(default_factory=set)

    @property
    def frozen(self) -> bool:
        return self.status == "validated"


@dataclass(order=True)
class _Milestone:
    position: int
    phase: int
    order: int
    kind: str = field(compare=False)
    arg: int = field(default=0, compare=False)


class TenantWorkload:
    """One tenant's acts, in journal order. `take(n)` returns up to n next acts (each stamped
    with the journal_seq it must commit at), an empty list once the workload is done."""

    def __init__(
        self,
        spec: TenantSpec,
        config: WorkloadConfig,
        keys: TenantKeys,
        foreign: Sequence[TenantKeys] = (),
    ):
        self.spec = spec
        self.config = config
        self.keys = keys
        self.foreign = list(foreign)
        self.rng = random.Random(f"oml-sim/{config.seed}/{spec.tenant_id}")
        self.journal_seq = 0
        self.started = 0  # claims promoted for the first time
        self.faults: Counter[str] = Counter()  # generated so far, by class
        self._pending: deque[Act] = deque()
        self._areas: dict[str, _Area] = {}
        self._area_list: list[_Area] = []
        self._labels: set[str] = set()
        self._live: list[_Lifecycle] = []
        self._edges: dict[str, str] = {}  # edge_id -> state
        self._area_edges: list[str] = []
        self._open_sims: list[str] = []
        self._sim_ids: dict[int, str] = {}
        self._sim_rows: dict[str, list[_Row]] = {}
        self._derived_rows: dict[str, list[_Row]] = {}
        self._sim_edges: dict[str, list[str]] = {}
        self._want_stale = False
        fault_classes = [f for f in FAULTS if f != "wrong_tenant_key" or self.foreign]
        self._fault_classes = fault_classes
        self._fault_cycle: list[str] = []
        t8 = spec.tenant_id[:8]
        self._identities = [keys.api_key_id] + [
            f"key-{t8}-{who}" for who in ("reviewer-1", "reviewer-2", "agent-1")
        ]
        self._target_live = max(4, min(64, config.claims // 10))
        self._setup()
        self._milestones = self._plan()

    # --- public ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return not self._pending and self._finished()

    def take(self, n: int) -> list[Act]:
        out: list[Act] = []
        while len(out) < n:
            if self._pending:
                out.append(self._pending.popleft())
            elif self._finished():
                break
            else:
                self._step()
        return out

    # --- structure -----------------------------------------------------------------------------

    def _now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def _id(self) -> str:
        return new_id(self.rng)

    def _emit(self, act: Act) -> Act:
        self.journal_seq += 1
        act.journal_seq = self.journal_seq
        act.event_id = self._id()
        if self.config.bad_ratio and self.rng.random() < self.config.bad_ratio:
            self._inject(act)
        self._pending.append(act)
        return act

    def _setup(self) -> None:
        label = f"u{self.rng.getrandbits(24):06x}"
        self._labels.add(label)
        root = _Area(self._id(), None, label, label, "committed")
        self._areas[root.workarea_id] = root
        self._area_list.append(root)
        self.root = root
        self._emit(
            acts.upsert_area_act(
                root.workarea_id,
                parent_id=None,
                path=root.path,
                status=root.status,
                crew_name=None,
                created_at=self._now(),
            )
        )
        for _ in range(min(64, 3 + self.config.claims // 30)):
            self._new_area()

    def _plan(self) -> list[_Milestone]:
        """When tenant-level acts happen, as positions in the sequence of new claims."""
        rng, m = self.rng, self.config.claims
        plan: list[_Milestone] = []

        def at(fraction: float, phase: int, kind: str, arg: int = 0) -> None:
            plan.append(_Milestone(int(fraction * m), phase, len(plan), kind, arg))

        for k in range(max(2, m // 200)):
            start = rng.uniform(0.05, 0.75)
            at(start, 0, "sim_start", k)
            plan.append(
                _Milestone(min(m, int(start * m) + max(8, m // 12)), 1, len(plan), "sim_end", k)
            )
        for _ in range(max(1, m // 250)):
            at(rng.uniform(0.35, 1.0), 2, "validate")
        for kind in ("reparent", "status", "crew", "new_area", "area_edge"):
            for _ in range(1 + m // 100):
                at(rng.uniform(0.1, 0.95), 2, kind)
        plan.sort(reverse=True)  # popped from the end
        return plan

    def _finished(self) -> bool:
        return (
            self.started >= self.config.claims
            and not self._live
            and not self._milestones
            and not self._want_stale
        )

    def _step(self) -> None:
        if self._want_stale and self._stale_repair():
            return
        if self._milestones and self._milestones[-1].position <= self.started:
            self._milestone(self._milestones.pop())
            return
        if self.started < self.config.claims:
            p_new = 0.6 if len(self._live) < self._target_live else 0.2
            if not self._live or self.rng.random() < p_new:
                self._new_claim()
                return
        if self._live:
            self._claim_step(self._live[self.rng.randrange(len(self._live))])
            return
        # Only a stale-repair fault is left and no row can carry it: drop it.
        self._want_stale = False

    def _milestone(self, milestone: _Milestone) -> None:
        kind = milestone.kind
        if kind == "sim_start":
            sim = self._id()
            self._sim_ids[milestone.arg] = sim
            self._open_sims.append(sim)
        elif kind == "sim_end":
            sim = self._sim_ids.get(milestone.arg)
            if sim in self._open_sims:
                closure = milestone.arg % 2 == 0 if milestone.arg < 2 else self.rng.random() < 0.5
                self._end_simulation(sim, closure)
        elif kind == "validate":
            self._validate()
        elif kind == "reparent":
            self._reparent()
        elif kind == "status":
            self._status_change()
        elif kind == "crew":
            self._crew_update()
        elif kind == "new_area":
            self._new_area()
        elif kind == "area_edge":
            self._area_edge()

    # --- areas ---------------------------------------------------------------------------------

    def _new_area(self) -> None:
        rng = self.rng
        parent = rng.choice(self._area_list)
        label = f"a{rng.getrandbits(24):06x}"
        while label in self._labels:
            label = f"a{rng.getrandbits(24):06x}"
        self._labels.add(label)
        area = _Area(self._id(), parent.workarea_id, label, f"{parent.path}.{label}", "development")
        self._areas[area.workarea_id] = area
        self._area_list.append(area)
        self._emit(
            acts.upsert_area_act(
                area.workarea_id,
                parent_id=area.parent_id,
                path=area.path,
                status=area.status,
                **self._crew(),
                created_at=self._now(),
            )
        )

    def _crew(self) -> dict[str, str | None]:
        rng = self.rng
        if rng.random() < 0.3:
            return {"crew_name": None, "crew_charter_uri": None, "crew_external_manager": None}
        crew = f"crew-{rng.randrange(100):02d}"
        return {
            "crew_name": crew,
            "crew_charter_uri": f"https://charters.example/{crew}/v{rng.randrange(1, 9)}",
            "crew_external_manager": rng.choice((None, "jira:OPS", "linear:PLAT", "asana:DATA")),
        }

    def _children(self) -> dict[str, list[_Area]]:
        children: dict[str, list[_Area]] = {}
        for area in self._areas.values():
            if area.parent_id is not None:
                children.setdefault(area.parent_id, []).append(area)
        return children

    def _subtree(self, area: _Area, children: dict[str, list[_Area]]) -> list[_Area]:
        found, stack = [], list(children.get(area.workarea_id, ()))
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(children.get(node.workarea_id, ()))
        return found

    def _reparent(self) -> None:
        rng = self.rng
        nodes = [a for a in self._areas.values() if a is not self.root]
        if not nodes:
            return
        node = rng.choice(nodes)
        children = self._children()
        subtree = self._subtree(node, children)
        barred = {node.workarea_id, node.parent_id} | {a.workarea_id for a in subtree}
        parents = [a for a in self._areas.values() if a.workarea_id not in barred]
        if not parents:
            return
        parent = rng.choice(parents)
        node.parent_id = parent.workarea_id
        node.path = f"{parent.path}.{node.label}"
        self._emit(acts.reparent_area_act(node.workarea_id, parent.workarea_id, node.path))
        for child in subtree:  # parent-first, as the lake rewrites the subtree
            child.path = f"{self._areas[child.parent_id].path}.{child.label}"

    def _status_change(self) -> None:
        """An area moves up the ladder, development to committed (it never moves down)."""
        areas = [a for a in self._areas.values() if a.status == "development"]
        if areas:
            area = self.rng.choice(areas)
            area.status = "committed"
            self._emit(acts.upsert_area_act(area.workarea_id, status=area.status))

    def _crew_update(self) -> None:
        area = self.rng.choice(self._area_list)
        self._emit(acts.upsert_area_act(area.workarea_id, **self._crew()))

    def _area_edge(self) -> None:
        rng = self.rng
        if self._area_edges and rng.random() < 0.3:
            edge_id = self._area_edges.pop(rng.randrange(len(self._area_edges)))
            self._edges[edge_id] = "demoted"
            self._emit(acts.demote_edge_act(edge_id))
            return
        if len(self._areas) < 2:
            return
        src, dst = rng.sample(self._area_list, 2)
        proposer, ratifier = rng.sample(self._identities, 2)
        edge = Edge(
            self._id(),
            src.workarea_id,
            dst.workarea_id,
            graph="workarea",
            edge_label=rng.choice(_AREA_LABELS),
            src_version=None,
            dst_version=None,
            proposer=proposer,
            ratifier=ratifier,
        )
        self._edges[edge.edge_id] = "ratified"
        self._area_edges.append(edge.edge_id)
        self._emit(acts.ratify_act(edge))

    def _open_area(self) -> _Area:
        while True:  # the root is never validated, so this ends
            area = self.rng.choice(self._area_list)
            if not area.frozen:
                return area

    def _validate(self) -> None:
        """Validate an area: first demote every tainted row in it that may still be promoted or
        held, move it to committed, then validate."""
        rng = self.rng
        candidates = [a for a in self._areas.values() if a is not self.root and not a.frozen]
        if not candidates:
            return
        area = rng.choices(candidates, [1 + len(a.rows) for a in candidates])[0]
        for row in sorted(area.rows, key=lambda r: (r.claim.artifact_id, r.claim.version)):
            if row.tainted and row.may_be_live:
                self._demote(row)
        if area.status == "development":
            area.status = "committed"
            self._emit(acts.upsert_area_act(area.workarea_id, status="committed"))
        area.status = "validated"
        self._emit(acts.validate_area_act(area.workarea_id))

    # --- simulations ---------------------------------------------------------------------------

    def _end_simulation(self, sim: str, closure: bool) -> None:
        self._open_sims.remove(sim)
        self._emit(acts.simulation_end_act(sim, closure))
        for row in self._sim_rows.pop(sim, []):
            if row.state in ("promoted", "held"):
                if closure:
                    row.state, row.undecided = "demoted", False
                else:
                    row.undecided = True
        for row in self._derived_rows.pop(sim, []):
            if closure and row.may_be_live:
                row.state, row.undecided = "demoted", False
        for edge_id in self._sim_edges.pop(sim, []):
            self._edges[edge_id] = "demoted"

    # --- claims --------------------------------------------------------------------------------

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

    def _register(self, row: _Row, lifecycle: _Lifecycle) -> None:
        lifecycle.rows.append(row)
        self._areas[row.claim.workarea_id].rows.add(row)
        if row.claim.simulation_id:
            self._sim_rows.setdefault(row.claim.simulation_id, []).append(row)
        for sim in row.claim.sim_derived_ids or ():
            self._derived_rows.setdefault(sim, []).append(row)

    def _promote(self, claim: Claim, lifecycle: _Lifecycle) -> _Row:
        body = self._seal(claim)
        act = acts.promote_act(claim, body)
        if claim.body_ref == "object":
            act.keep_deks = [body]
        self._emit(act)
        row = _Row(claim)
        self._register(row, lifecycle)
        return row

    def _new_claim(self) -> None:
        rng = self.rng
        self.started += 1
        area = self._open_area()
        provenance = rng.choices(("agent", "human", "connector"), (6, 2, 1))[0]
        simulation_id, derived, source = None, None, None
        if self._open_sims and rng.random() < 0.25:
            simulation_id, provenance = rng.choice(self._open_sims), "simulation"
        elif self._live and rng.random() < 0.25:
            source = self._live[rng.randrange(len(self._live))].latest
            if source.decided_live and source.state == "promoted":
                taint = set(source.claim.sim_derived_ids or ())
                if source.claim.simulation_id:
                    taint.add(source.claim.simulation_id)
                derived = sorted(taint) or None
            else:
                source = None
        kind = rng.choices([k for k, _ in _KINDS], [w for _, w in _KINDS])[0]
        body_ref = "object" if rng.random() < 0.1 else "lake"
        now = self._now()
        lifecycle = _Lifecycle(self._id(), self._id(), kind, rng.choices((1, 2, 3), (6, 3, 2))[0])
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
        lifecycle.slot = len(self._live)
        self._live.append(lifecycle)
        if source is not None:
            self._ratify(row, source, "derives_from", lifecycle)

    def _retire(self, lifecycle: _Lifecycle) -> None:
        last = self._live.pop()
        if last is not lifecycle:
            self._live[lifecycle.slot] = last
            last.slot = lifecycle.slot
        lifecycle.slot = -1

    def _ratify(self, src: _Row, dst: _Row, label: str, lifecycle: _Lifecycle) -> None:
        rng = self.rng
        sim = (
            src.claim.simulation_id
            or dst.claim.simulation_id
            or next(iter(src.claim.sim_derived_ids or dst.claim.sim_derived_ids or ()), None)
        )
        proposer, ratifier = rng.sample(self._identities, 2)
        now = self._now()
        edge = Edge(
            self._id(),
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
        self._edges[edge.edge_id] = "ratified"
        lifecycle.edges.append(edge.edge_id)
        if sim in self._open_sims:
            self._sim_edges.setdefault(sim, []).append(edge.edge_id)
        self._emit(acts.ratify_act(edge))

    def _demote(self, row: _Row) -> None:
        self._emit(acts.demote_act(row.claim))
        row.state, row.undecided = "demoted", False

    def _claim_step(self, lifecycle: _Lifecycle) -> None:
        rng = self.rng
        row = lifecycle.latest
        frozen = self._areas[row.claim.workarea_id].frozen
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
        if any(self._edges[e] == "ratified" for e in lifecycle.edges):
            options.append(("edge_demote", 0.15))
        if row.decided_live:
            options.append(("repair", 0.02))
        choice = rng.choices([o for o, _ in options], [w for _, w in options])[0]

        if choice == "finish":
            self._retire(lifecycle)
        elif choice == "demote":
            self._demote(row)
        elif choice == "erase":
            alive = [r for r in lifecycle.rows if r.state != "erased"]
            target = row if rng.random() < 0.7 else rng.choice(alive)
            self._emit(acts.erase_act(target.claim))
            target.state, target.undecided = "erased", False
            if target is row:
                self._retire(lifecycle)
        elif choice == "reassign":
            self._reassign(row)
        elif choice == "repromote":
            self._emit(acts.repromote_act(row.claim))
            row.state = "promoted"
        elif choice == "version":
            self._new_version(lifecycle)
        elif choice == "derive":
            other = self._live[rng.randrange(len(self._live))].latest
            if other is not row and other.decided_live:
                self._ratify(row, other, "derives_from", lifecycle)
        elif choice == "edge_demote":
            edge_id = rng.choice([e for e in lifecycle.edges if self._edges[e] == "ratified"])
            self._edges[edge_id] = "demoted"
            self._emit(acts.demote_edge_act(edge_id))
        elif choice == "repair":
            self._emit(acts.repair_act(row.claim, self.journal_seq + 1, row.state))

    def _reassign(self, row: _Row) -> None:
        rng = self.rng
        source = self._areas[row.claim.workarea_id]
        target = self._open_area()
        if target is source:
            targets = [a for a in self._area_list if not a.frozen and a is not source]
            if not targets:
                return
            target = rng.choice(targets)
        held = rng.random() < 0.35
        self._emit(acts.reassign_act(row.claim, target.workarea_id, held))
        source.rows.discard(row)
        target.rows.add(row)
        row.claim.workarea_id = target.workarea_id
        if held and row.state == "promoted":
            row.state = "held"

    def _new_version(self, lifecycle: _Lifecycle) -> None:
        rng = self.rng
        prev = lifecycle.latest
        area = self._areas[prev.claim.workarea_id]
        now = self._now()
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
            self._demote(prev)

    # --- bad input -----------------------------------------------------------------------------

    def _next_fault(self) -> str:
        if not self._fault_cycle:
            self._fault_cycle = list(self._fault_classes)
            self.rng.shuffle(self._fault_cycle)
        return self._fault_cycle.pop()

    def _inject(self, act: Act) -> None:
        fault = self._next_fault()
        if fault == "stale_fold_seq":
            self._want_stale = True  # carried by the next reconciler repair act
            return
        rng = self.rng
        mark = {FAULT_KEY: fault}
        at = instant(self._now())
        if fault == "wrong_tenant_key":
            act.forgeries.append(Forgery(rng.choice(self.foreign), self._id(), mark))
        elif fault == "unknown_op":
            act.ops.append(("claim.archive", {"artifact_id": self._id(), "at": at, **mark}))
        elif fault == "missing_field":  # no `held`
            payload = {"artifact_id": self._id(), "version": 1, "at": at, **mark}
            act.ops.append(("claim.reassign", dict(payload, workarea_id=self.root.workarea_id)))
        elif fault == "mistyped_field":
            payload = {"artifact_id": self._id(), "version": "1", "at": at, **mark}
            act.ops.append(("claim.demote", payload))
        elif fault == "wrong_tenant_payload":
            other = rng.choice(self.foreign).tenant_id if self.foreign else self._id()
            op, payload = act.ops[0]
            act.ops.append((op, {**payload, "tenant_id": other, **mark}))
        elif fault == "self_signed":
            area = self._open_area()
            digest = hashlib.sha256(rng.randbytes(16)).hexdigest()
            claim = Claim(
                self._id(),
                1,
                area.workarea_id,
                area.path,
                claim_key=self._id(),
                plaintext_digest=digest,
                ciphertext_digest=hashlib.sha256(digest.encode()).hexdigest(),
            )
            act.ops.append(("claim.promote", {**claim.payload(self_signed=True), **mark}))
        elif fault == "ratifier_is_proposer":
            who = rng.choice(self._identities)
            edge = Edge(self._id(), self._id(), self._id(), proposer=who, ratifier=who)
            act.ops.append(("edge.ratify", {**edge.payload(), **mark}))
        elif fault == "retract_not_held":
            op = rng.choice(("claim.demote", "claim.erase"))
            act.ops.append((op, {"artifact_id": self._id(), "version": 1, "at": at, **mark}))
        self.faults[fault] += 1

    def _stale_repair(self) -> bool:
        """A reconciler repair (fold_seq = its own journal_seq) followed, in the same act, by an
        op on the repaired row that is not newer than that fold_seq."""
        rng = self.rng
        for _ in range(8):
            if not self._live:
                return False
            row = self._live[rng.randrange(len(self._live))].latest
            if row.decided_live:
                break
        else:
            return False
        self._want_stale = False
        act = acts.repair_act(row.claim, self.journal_seq + 1, row.state)
        stale = {
            "artifact_id": row.claim.artifact_id,
            "version": row.claim.version,
            "workarea_id": row.claim.workarea_id,
            "held": False,
            "at": instant(self._now()),
            FAULT_KEY: "stale_fold_seq",
        }
        act.ops.append(("claim.reassign", stale))
        self.faults["stale_fold_seq"] += 1
        self._emit(act)
        return True
