"""The generator's model of what the lake will hold for one tenant, and the journal every part
of the workload writes to: the parts (`areas`, `claims`, `simulations`, `faults`) share one
`Journal`, so they draw from one RNG in one order and stamp one sequence of acts."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import acts
from .acts import Claim, Edge
from .producer import Act


def new_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass(eq=False)
class Row:
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
class Lifecycle:
    artifact_id: str
    claim_key: str
    kind: str
    max_versions: int
    rows: list[Row] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)
    slot: int = -1  # position in the live list

    @property
    def latest(self) -> Row:
        return self.rows[-1]


@dataclass(eq=False)
class Area:
    workarea_id: str
    parent_id: str | None
    label: str
    path: str
    status: str
    rows: set[Row] = field(default_factory=set)

    @property
    def frozen(self) -> bool:
        return self.status == "validated"


class Journal:
    """One tenant's acts as they are generated: the RNG every choice draws from, the journal
    position each act is stamped with, the acts not taken yet, the identities that propose and
    ratify edges, and the state of every edge (edge_id -> ratified or demoted).

    `emit` rolls `bad_ratio` for each act and hands the unlucky ones to `inject`."""

    def __init__(self, rng: random.Random, bad_ratio: float, identities: list[str]):
        self.rng = rng
        self.bad_ratio = bad_ratio
        self.identities = identities
        self.journal_seq = 0
        self.pending: deque[Act] = deque()
        self.edges: dict[str, str] = {}
        self.inject: Callable[[Act], None] = lambda act: None

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def id(self) -> str:
        return new_id(self.rng)

    def reviewers(self) -> tuple[str, str, str]:
        """A new edge's id, its proposer and its ratifier (never the proposer: rule R2)."""
        proposer, ratifier = self.rng.sample(self.identities, 2)
        return self.id(), proposer, ratifier

    def ratify(self, edge: Edge) -> str:
        """Emit the ratification of `edge`; returns its id."""
        self.edges[edge.edge_id] = "ratified"
        self.emit(acts.ratify_act(edge))
        return edge.edge_id

    def emit(self, act: Act) -> Act:
        self.journal_seq += 1
        act.journal_seq = self.journal_seq
        act.event_id = self.id()
        if self.bad_ratio and self.rng.random() < self.bad_ratio:
            self.inject(act)
        self.pending.append(act)
        return act
