"""The drain's memory budget (ADR 0034): the batch cap it derives from each batch's measured peak,
and a drain that lowers its batches when the budget calls for it, losing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import oml_dagster
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import SILVER_CLAIMS
from oml_dagster.lake.write import memory
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.memory import MemoryGovernor, next_cap
from oml_dagster.lake.write.writer import WriterConfig

from .conftest import table_rows
from .dagster_support import more_acts, seed_tenant
from .helpers import recorded_fetches

mib = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(
    cap=st.integers(1_000, 10**6),
    ops=st.integers(1, 10**6),
    before=mib,
    peak=mib,
    budget=st.floats(1, 1e5),
)
def test_the_cap_shrinks_after_a_peak_over_the_budget_and_grows_only_well_under_it(
    cap, ops, before, peak, budget
):
    least = 1_000
    after = next_cap(cap, ops=ops, before_mib=before, peak_mib=peak, budget_mib=budget, least=least)
    assert after >= least
    if peak > budget:
        # the batch that went over is never repeated at its size, nor the cap kept
        assert after <= max(least, min(cap, ops) * 0.9)
    elif ops >= cap and peak < 0.85 * budget:
        assert after > cap
    else:
        assert after == cap


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


# A process of its own (jemalloc reads its configuration once): what a write and a MERGE left
# resident, `wait` seconds after their memory was freed.
_AFTER_A_MERGE = r"""
import gc, json, os, sys, tempfile, time
import oml_dagster  # sets delta-rs's allocator up, as in every process of ours
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from oml_dagster.lake.write.memory import resident_mib

n = 1_000_000
data = pa.table({"k": pa.array(range(n)), "b": pa.array([os.urandom(100) for _ in range(n)])})
keys = range(0, n, 7)
source = pa.table({"k": pa.array(keys), "b": pa.array([b"y"] * len(keys), pa.binary())})
before = resident_mib()
path = tempfile.mkdtemp()
write_deltalake(path, data)
table = DeltaTable(path)
merge = table.merge(source, "t.k = s.k", source_alias="s", target_alias="t")
merge.when_matched_update_all().when_not_matched_insert_all().execute()
del data, source, merge
gc.collect()
time.sleep(float(sys.argv[1]))
print(json.dumps({"conf": os.environ.get("_RJEM_MALLOC_CONF"), "kept": resident_mib() - before}))
"""


def _kept_after_a_merge(wait: float, conf: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if conf is not None:
        env["_RJEM_MALLOC_CONF"] = conf
    child = subprocess.run(
        [sys.executable, "-c", _AFTER_A_MERGE, str(wait)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(child.stdout)


def test_delta_rs_hands_a_merge_s_freed_memory_back_within_seconds():
    """ADR 0041: jemalloc's default keeps freed pages for ten seconds, so a drain's next batch
    began on top of the last one's commits. Ours hands them back after one. Fails if the
    setting stops reaching delta-rs's allocator (a deltalake release that renames it, or an
    import of deltalake ahead of ours)."""
    if memory.resident_mib() is None:
        pytest.skip("no /proc/self/status here")
    ours = _kept_after_a_merge(3, None)
    assert ours["conf"] == oml_dagster.JEMALLOC_CONF
    # jemalloc's own default, written out.
    default = _kept_after_a_merge(3, "dirty_decay_ms:10000,muzzy_decay_ms:0")
    assert default["conf"] == "dirty_decay_ms:10000,muzzy_decay_ms:0"  # an operator's wins
    assert ours["kept"] < default["kept"] - 100, (ours, default)


def test_without_a_budget_the_configured_cap_holds():
    governor = MemoryGovernor(None)
    assert governor.cap(5_000) == 5_000
    governor.observed(5_000)
    assert governor.cap(5_000) == 5_000 and governor.current is None


def _batch_sizes(conn, lake, governor: MemoryGovernor) -> tuple[list[int], str]:
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 100)
    config = WriterConfig(max_batch=40, txn_lag_limit=20)
    passes = drain(
        conn,
        lake,
        [work.tenant_id],
        policy=DrainPolicy(until_idle=True, config=config, governor=governor),
    )
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []
    silver = table_rows(lake, work.tenant_id, SILVER_CLAIMS)
    assert len(silver) == len({(r["artifact_id"], r["version"]) for r in silver})
    assert {c.artifact_id for c in work.claims} <= {r["artifact_id"] for r in silver}
    return [b.ops for p in passes for b in p.batches if b.ops], work.tenant_id


def test_a_spent_budget_drains_the_backlog_in_small_batches_losing_nothing(conn, lake):
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    # A budget below what the process already holds: the cap halves batch by batch from half
    # the configured cap (40) down to the governor's floor, and stays there.
    sizes, _ = _batch_sizes(conn, lake, MemoryGovernor(1, sample_ops=5, least=7))
    assert sizes[:2] == [10, 7] and len(sizes) > 9 and set(sizes[1:-1]) == {7}


def test_a_batch_read_ahead_under_a_larger_cap_is_cut_to_the_new_one_not_read_again(
    conn, lake, monkeypatch
):
    """The governor shrinks the cap between a batch read ahead and its turn: the batch's first
    ops are the smaller batch, so no op is fetched twice (each batch starts where the one
    before ended, read once)."""
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    fetched = recorded_fetches(monkeypatch)
    sizes, _ = _batch_sizes(conn, lake, MemoryGovernor(1, sample_ops=5, least=7))
    afters = [after for _, after, _ in fetched]
    assert sizes[:2] == [10, 7]  # the second batch was read ahead under a cap of 10
    assert len(afters) == len(set(afters)), "a batch was read again"
    assert len(afters) >= len(sizes)


def test_a_spent_budget_never_takes_batches_under_a_share_of_the_configured_cap():
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    governor = MemoryGovernor(1, sample_ops=1, least=2, floor_share=0.25)
    caps = []
    for _ in range(6):
        caps.append(governor.cap(40))
        governor.observed(caps[-1])  # each batch peaks over the budget of 1 MiB
    assert caps == [10, 10, 10, 10, 10, 10]
    # The floor follows the configured cap of the moment, and never exceeds it.
    assert governor.cap(400) == 100 and governor.cap(3) == 3
    default = MemoryGovernor(1)
    assert [default.cap(50_000) for _ in range(4)] == [12_500, 6_250, 5_000, 5_000]


def test_a_budget_with_room_starts_at_half_the_cap_and_grows_to_it(conn, lake):
    if not memory.reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    sizes, _ = _batch_sizes(conn, lake, MemoryGovernor(10**7, sample_ops=5, least=7))
    full = sizes[:-1]  # the backlog's tail aside
    assert full[0] == 20 and 40 in full
    assert full == sorted(full) and max(sizes) == 40
