"""The drain's memory budget (ADR 0034): the batch cap it derives from a batch's measured peak,
and a drain that lowers its batches when the budget calls for it, losing nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oml_dagster.lake import memory, sequencer
from oml_dagster.lake.drain import drain
from oml_dagster.lake.memory import MemoryGovernor, batch_cap
from oml_dagster.lake.tables import SILVER_CLAIMS
from oml_dagster.lake.writer import WriterConfig

from .conftest import table_rows
from .dagster_support import more_acts, seed_tenant

mib = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(budget=mib, baseline=mib, cost=st.floats(1e-6, 10), most=st.integers(2, 10**6))
def test_a_cap_stays_within_its_bounds_and_the_budget(budget, baseline, cost, most):
    least = min(1_000, most)
    cap = batch_cap(budget, baseline, cost, most, least)
    assert least <= cap <= most
    if baseline >= budget:
        assert cap == least
    elif least < cap < most:
        assert baseline + cap * cost <= budget
        assert baseline + (cap + 1) * cost > budget  # and the largest such
    more = batch_cap(budget + 100, baseline, cost, most, least)
    assert more >= cap  # a larger budget never lowers the cap


def test_the_peak_reading_follows_an_allocation_and_resets():
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    start = memory.peak_mib()
    block = bytearray(200 * memory.MIB)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert memory.peak_mib() >= start + 190
    del block
    assert memory.resident_mib() < memory.peak_mib() - 150
    assert memory.reset_peak()
    assert memory.peak_mib() < memory.resident_mib() + 20


def test_without_a_budget_the_configured_cap_holds():
    governor = MemoryGovernor(None)
    assert governor.cap(5_000) == 5_000
    governor.observed(5_000)
    assert governor.cap(5_000) == 5_000 and not governor.costs


def test_a_spent_budget_drains_the_backlog_in_small_batches_losing_nothing(conn, lake):
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 60)
    # A budget below what the process already holds: after the first measured batch, every
    # batch takes the governor's least.
    governor = MemoryGovernor(1, sample_ops=20, least=7)
    config = WriterConfig(max_batch=40, txn_lag_limit=20)
    passes = drain(conn, lake, [work.tenant_id], until_idle=True, config=config, governor=governor)

    sizes = [b.ops for p in passes for b in p.batches if b.ops]
    assert sizes[0] == 40 and governor.costs  # measured on the full first batch
    assert sizes[1:] and max(sizes[1:]) <= 7
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []
    silver = table_rows(lake, work.tenant_id, SILVER_CLAIMS)
    assert len(silver) == len({(r["artifact_id"], r["version"]) for r in silver})
    assert {c.artifact_id for c in work.claims} <= {r["artifact_id"] for r in silver}


def test_a_budget_with_room_keeps_the_configured_cap(conn, lake):
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 60)
    governor = MemoryGovernor(10**7, sample_ops=20, least=7)
    config = WriterConfig(max_batch=40, txn_lag_limit=20)
    passes = drain(conn, lake, [work.tenant_id], until_idle=True, config=config, governor=governor)
    sizes = [b.ops for p in passes for b in p.batches if b.ops]
    assert sizes.count(40) == len(sizes) - 1  # every batch full but the backlog's tail
