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

Bad input (`bad_ratio`): an act now and then carries one extra op of a class DESIGN §2 says
the lake-writer refuses, marked as injected (`faults`).

Determinism: everything but wall-clock instants derives from `seed` — tenant ids, keys, area
and claim ids (`uuid.UUID(int=rng.getrandbits(128), version=4)`), plaintexts, DEKs and nonces
(so ciphertexts and digests too), the structure and the faults. Each tenant has its own RNG, so
its sequence does not depend on how writers interleave tenants or batch acts.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .areas import AreaTree
from .claims import Claims
from .faults import FaultInjector
from .model import Journal, new_id
from .producer import Act, TenantKeys
from .simulations import Simulations


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


def tenant_specs(config: WorkloadConfig) -> list[TenantSpec]:
    """The tenants of a workload: ids and key seeds from the seed alone."""
    rng = random.Random(f"oml-sim/{config.seed}")
    specs = []
    for index in range(config.tenants):
        tenant_id = new_id(rng)
        specs.append(TenantSpec(index, tenant_id, rng.randbytes(32), "agent:writer"))
    return specs


@dataclass(order=True)
class _Milestone:
    position: int
    phase: int
    order: int
    kind: str = field(compare=False)
    arg: int = field(default=0, compare=False)


class TenantWorkload:
    """One tenant's acts, in journal order. `take(n)` returns up to n next acts (each stamped
    with the journal_seq it must commit at), an empty list once the workload is done.

    It composes the parts, which share one `Journal`: the area tree, the claims, the
    simulation runs and the fault injector. Tenant-level acts (simulation starts and ends,
    validations, area changes) come at planned positions in the sequence of new claims."""

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
        self.rng = random.Random(f"oml-sim/{config.seed}/{spec.tenant_id}")
        t8 = spec.tenant_id[:8]
        identities = [keys.api_key_id] + [
            f"key-{t8}-{who}" for who in ("reviewer-1", "reviewer-2", "agent-1")
        ]
        self.journal = Journal(self.rng, config.bad_ratio, identities)
        self.areas = AreaTree(self.journal)
        self.simulations = Simulations(self.journal)
        self.claims = Claims(self.journal, keys, self.areas, self.simulations)
        self.injector = FaultInjector(self.journal, self.areas, self.claims, foreign)
        self.journal.inject = self.injector.inject
        self._target_live = max(4, min(64, config.claims // 10))
        self.areas.plant(min(64, 3 + config.claims // 30))
        self._milestones = self._plan()

    @property
    def started(self) -> int:
        """Claims promoted for the first time so far."""
        return self.claims.started

    @property
    def faults(self) -> Counter[str]:
        """Faults generated so far, by class."""
        return self.injector.faults

    @property
    def done(self) -> bool:
        return not self.journal.pending and self._finished()

    def take(self, n: int) -> list[Act]:
        pending = self.journal.pending
        out: list[Act] = []
        while len(out) < n:
            if pending:
                out.append(pending.popleft())
            elif self._finished():
                break
            else:
                self._step()
        return out

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
            self.claims.started >= self.config.claims
            and not self.claims.live
            and not self._milestones
            and not self.injector.want_stale
        )

    def _step(self) -> None:
        claims = self.claims
        if self.injector.want_stale and self.injector.stale_repair():
            return
        if self._milestones and self._milestones[-1].position <= claims.started:
            milestone = self._milestones.pop()
            self._milestone_acts[milestone.kind](self, milestone.arg)
            return
        if claims.started < self.config.claims:
            p_new = 0.6 if len(claims.live) < self._target_live else 0.2
            if not claims.live or self.rng.random() < p_new:
                claims.new_claim()
                return
        if claims.live:
            claims.step(claims.any_live())
            return
        # Only a stale-repair fault is left and no row can carry it: drop it.
        self.injector.want_stale = False

    # What each planned milestone does (its `arg` is a simulation run's number).
    _milestone_acts = {
        "sim_start": lambda w, run: w.simulations.start(run),
        "sim_end": lambda w, run: w.simulations.finish(run),
        "validate": lambda w, _: w.areas.validate(w.claims.demote),
        "reparent": lambda w, _: w.areas.reparent(),
        "status": lambda w, _: w.areas.status_change(),
        "crew": lambda w, _: w.areas.crew_update(),
        "new_area": lambda w, _: w.areas.new_area(),
        "area_edge": lambda w, _: w.areas.area_edge(),
    }
