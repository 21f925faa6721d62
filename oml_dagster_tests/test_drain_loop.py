"""The drain loop that `oml-lake drain --until-idle` and each lake-writer run share: it stops when
its own tenants are idle, whatever other tenants do, and at its time cap."""

from __future__ import annotations

import pytest

from oml_dagster.lake import sequencer
from oml_dagster.lake.drain import DrainPass, drain
from oml_dagster.lake.writer import WriterConfig

from .dagster_support import more_acts, seed_tenant

SMALL = WriterConfig(max_batch=8, txn_lag_limit=4)


def test_a_named_tenant_drain_ends_when_it_is_idle_while_others_flow(conn, lake):
    mine, busy = seed_tenant(conn, bad=False), seed_tenant(conn, bad=False)

    def flow(_: DrainPass) -> None:
        more_acts(conn, busy, 1)  # every pass, the other tenant has new rows to sequence

    passes = drain(
        conn, lake, [mine.tenant_id], until_idle=True, config=SMALL, on_pass=flow, max_passes=50
    )

    assert len(passes) < 50  # without the scope, the other tenant's rows would be progress
    assert not passes[-1].progressed
    assert passes[-1].sequenced_here == 0 and passes[-1].sequenced.sequenced > 0
    assert {b.tenant_id for p in passes for b in p.batches} == {mine.tenant_id}
    assert sequencer.pending_tenants(conn, [mine.tenant_id]) == []


def test_the_time_cap_ends_the_loop_after_the_pass_under_way(conn, lake):
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 20)

    capped = drain(conn, lake, [work.tenant_id], until_idle=True, config=SMALL, max_seconds=0)
    assert len(capped) == 1 and capped[0].progressed
    assert sequencer.pending_tenants(conn, [work.tenant_id]) != []

    rest = drain(conn, lake, [work.tenant_id], until_idle=True, config=SMALL, max_seconds=600)
    assert len(rest) > 2
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []

    with pytest.raises(ValueError, match="max_seconds"):
        drain(conn, lake, [work.tenant_id], max_seconds=-1)
