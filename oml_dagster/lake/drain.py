"""Drain passes: sequence, then one batch per tenant with pending ops; the same loop serves
`oml-lake drain`, the benchmarks and the tests (the Dagster layer runs one batch per run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from . import sequencer
from .sequencer import SequencerReport
from .storage import Lake
from .writer import BatchResult, WriterConfig, drain_tenant


@dataclass
class DrainPass:
    sequenced: SequencerReport
    batches: list[BatchResult] = field(default_factory=list)

    @property
    def progressed(self) -> bool:
        return self.sequenced.sequenced > 0 or any(b.committed or b.refused for b in self.batches)


def drain(
    conn: psycopg.Connection,
    lake: Lake,
    tenants: list[str] | None = None,
    *,
    until_idle: bool = False,
    config: WriterConfig | None = None,
    on_pass: Callable[[DrainPass], None] | None = None,
    max_passes: int = 100_000,
) -> list[DrainPass]:
    """Run passes until one neither sequences nor applies anything (or just one pass).

    Named tenants are always visited (their Delta logs decide what is left); otherwise the
    tenants the frontier cache shows behind the sequencer are."""
    passes: list[DrainPass] = []
    for _ in range(max_passes):
        current = DrainPass(sequencer.sequence(conn))
        targets = tenants or [t for t, _, _ in sequencer.pending_tenants(conn)]
        for tenant_id in targets:
            current.batches.append(drain_tenant(conn, lake, tenant_id, config or WriterConfig()))
        passes.append(current)
        if on_pass is not None:
            on_pass(current)
        # A batch below the lag limit that changes nothing neither commits nor refuses anew, so
        # a drained tenant ends the loop; rows waiting behind a gap do not keep it running.
        if not until_idle or not current.progressed:
            break
    return passes
