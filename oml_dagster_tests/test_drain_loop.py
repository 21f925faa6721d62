"""The drain loop that `oml-lake drain --until-idle` and each lake-writer run share: it stops when
its own tenants are idle, whatever other tenants do, and at its time cap."""

from __future__ import annotations

import errno
import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pyarrow as pa
import pytest

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.faults import RetryPolicy
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.fetch import Fetcher
from oml_dagster.lake.model.catalog import Op
from oml_dagster.lake.write import drain as drain_loop
from oml_dagster.lake.write.drain import (
    DrainObserver,
    DrainPass,
    DrainPolicy,
    drain,
    drain_riding_through,
)
from oml_dagster.lake.write.memory import release_memory
from oml_dagster.lake.write.writer import TenantBatch, WriterConfig
from oml_dagster.simulate import acts, producer

from .dagster_support import more_acts, seed_tenant
from .helpers import dead_letters, recorded_fetches

SMALL = WriterConfig(max_batch=8, txn_lag_limit=4)


def test_a_named_tenant_drain_ends_when_it_is_idle_while_others_flow(conn, lake):
    mine, busy = seed_tenant(conn, bad=False), seed_tenant(conn, bad=False)

    class Flow(DrainObserver):
        def pass_ended(self, _: DrainPass) -> None:
            more_acts(conn, busy, 1)  # every pass, the other tenant has new rows to sequence

    passes = drain(
        conn,
        lake,
        [mine.tenant_id],
        policy=DrainPolicy(until_idle=True, config=SMALL, max_passes=50),
        observer=Flow(),
    )

    assert len(passes) < 50  # without the scope, the other tenant's rows would be progress
    assert not passes[-1].progressed
    assert passes[-1].sequenced_here == 0 and passes[-1].sequenced.sequenced > 0
    assert {b.tenant_id for p in passes for b in p.batches} == {mine.tenant_id}
    assert sequencer.pending_tenants(conn, [mine.tenant_id]) == []


def test_the_time_cap_ends_the_loop_after_the_pass_under_way(conn, lake):
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 20)

    capped = drain(
        conn,
        lake,
        [work.tenant_id],
        policy=DrainPolicy(until_idle=True, config=SMALL, max_seconds=0),
    )
    assert len(capped) == 1 and capped[0].progressed
    assert sequencer.pending_tenants(conn, [work.tenant_id]) != []

    rest = drain(
        conn,
        lake,
        [work.tenant_id],
        policy=DrainPolicy(until_idle=True, config=SMALL, max_seconds=600),
    )
    assert len(rest) > 2
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []

    with pytest.raises(ValueError, match="max_seconds"):
        drain(conn, lake, [work.tenant_id], policy=DrainPolicy(max_seconds=-1))


def test_a_polling_drain_waits_for_work_until_its_cap(conn, lake):
    """A standing shard run's drain (ADR 0032): an idle pass does not end it; ops that arrive
    while it polls are sequenced and drained by it; it ends at its cap, not before, and keeps
    only the passes that did something."""
    work = seed_tenant(conn, bad=False)
    idle: list[float] = []

    class Arrive(DrainObserver):
        def pass_ended(self, p: DrainPass) -> None:
            if not p.progressed:
                idle.append(time.monotonic())
                if len(idle) == 2:
                    more_acts(conn, work, 3)

    started = time.monotonic()
    passes = drain(
        conn,
        lake,
        policy=DrainPolicy(
            until_idle=True,
            config=SMALL,
            owns=lambda t: t == work.tenant_id,
            max_seconds=3.0,
            poll_seconds=0.2,
        ),
        observer=Arrive(),
    )
    took = time.monotonic() - started

    assert took >= 3.0
    assert len(idle) > 3  # it kept polling after the late ops were drained
    assert len(passes) + len(idle) <= 3.0 / 0.2 + 2  # at most one pass per poll interval
    assert all(p.progressed for p in passes)
    late = [p for p in passes if p.batches and p.batches[0].ops and p.sequenced_here]
    assert late and sum(p.sequenced_here for p in passes[1:]) >= 3
    assert sequencer.pending_tenants(conn, [work.tenant_id]) == []

    with pytest.raises(ValueError, match="poll_seconds"):
        drain(
            conn, lake, policy=DrainPolicy(until_idle=True, poll_seconds=0.5)
        )  # unbounded: refused
    with pytest.raises(ValueError, match="poll_seconds"):
        drain(conn, lake, policy=DrainPolicy(until_idle=True, max_seconds=1, poll_seconds=0))


class _Watching(DrainObserver):
    """Records what the drain tells it; names `busy` as busy and lets a failed tenant go when
    `tolerant`."""

    def __init__(self, busy: frozenset[str] = frozenset(), tolerant: bool = False):
        self.busy, self.tolerant = busy, tolerant
        self.heard: list[tuple] = []

    def busy_tenants(self) -> frozenset[str]:
        self.heard.append(("busy?",))
        return self.busy

    def batch_ended(self, result) -> None:
        self.heard.append(("batch", result.tenant_id))

    def pass_ended(self, drained: DrainPass) -> None:
        self.heard.append(("pass", len(drained.batches)))

    def tenant_failed(self, tenant_id: str, error: Exception) -> bool:
        self.heard.append(("failed", tenant_id, str(error)))
        return self.tolerant


def _failing_for(monkeypatch, tenant_id: str, error: Exception) -> list[str]:
    """Every tenant batch the drain starts, in order; `tenant_id`'s raise `error`."""
    started: list[str] = []

    class FailingBatch(TenantBatch):
        def read(self, conn, **options):
            started.append(self.tenant_id)
            if self.tenant_id == tenant_id:
                raise error
            return super().read(conn, **options)

    monkeypatch.setattr(drain_loop, "TenantBatch", FailingBatch)
    return started


def test_the_observer_hears_each_batch_before_its_pass_and_names_the_busy_tenants(conn, lake):
    """`busy_tenants` is asked once per pass and the tenants it names are left alone; each
    batch is told as it ends, before its pass."""
    mine, held = sorted((seed_tenant(conn, bad=False) for _ in range(2)), key=lambda w: w.tenant_id)
    more_acts(conn, mine, 10)
    watching = _Watching(busy=frozenset({held.tenant_id}))

    passes = drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL), observer=watching)

    expected: list[tuple] = []
    for p in passes:
        expected += [("busy?",), *(("batch", b.tenant_id) for b in p.batches)]
        expected.append(("pass", len(p.batches)))
    assert watching.heard == expected and len(passes) > 2
    assert {b.tenant_id for p in passes for b in p.batches} == {mine.tenant_id}
    assert [t for t, _, _ in sequencer.pending_tenants(conn)] == [held.tenant_id]


def test_a_failed_tenant_stops_the_drain_unless_the_observer_lets_it_go_on(conn, lake, monkeypatch):
    """`tenant_failed` decides: False (the default) and the error propagates; True and the
    tenant is left alone for the rest of the drain while the others are drained."""
    works = sorted((seed_tenant(conn, bad=False) for _ in range(3)), key=lambda w: w.tenant_id)
    broken = works[0].tenant_id
    for work in works[1:]:
        more_acts(conn, work, 10)
    started = _failing_for(monkeypatch, broken, RuntimeError("tenant broken"))

    with pytest.raises(RuntimeError, match="tenant broken"):
        drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL))
    strict = _Watching()
    with pytest.raises(RuntimeError, match="tenant broken"):
        drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL), observer=strict)
    assert ("failed", broken, "tenant broken") in strict.heard

    started.clear()
    tolerant = _Watching(tolerant=True)
    passes = drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL), observer=tolerant)

    assert [h for h in tolerant.heard if h[0] == "failed"] == [("failed", broken, "tenant broken")]
    assert started.count(broken) == 1 and len(passes) > 2  # left alone after its failure
    assert [t for t, _, _ in sequencer.pending_tenants(conn)] == [broken]


def test_a_transient_fault_is_no_tenant_s_failure(conn, lake, monkeypatch):
    """A lost connection in one tenant's batch propagates (the ride-through starts over)
    without reaching `tenant_failed`, even from an observer that would let the tenant go."""
    work = seed_tenant(conn, bad=False)
    _failing_for(monkeypatch, work.tenant_id, ConnectionResetError(errno.ECONNRESET, "reset"))
    tolerant = _Watching(tolerant=True)

    with pytest.raises(ConnectionResetError):
        drain(conn, lake, policy=DrainPolicy(until_idle=True), observer=tolerant)
    assert [h for h in tolerant.heard if h[0] == "failed"] == []


def test_a_drain_keeps_no_batch_it_has_folded(conn, lake, monkeypatch):
    """Each batch read ahead is dropped once folded: the passes a drain returns (and a shard
    run's `on_pass` sees) must not pin every batch of the backlog, or a drain's memory grows
    with the backlog instead of staying at about two batches (one folding, one read ahead)."""
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 20)
    fetched: list[weakref.ref] = []
    fetch = Fetcher.fetch

    def recorded(self, *args, **kwargs):
        batch = fetch(self, *args, **kwargs)
        fetched.append(weakref.ref(batch))
        return batch

    monkeypatch.setattr(Fetcher, "fetch", recorded)
    for until_idle in (True, False):
        passes = drain(
            conn, lake, [work.tenant_id], policy=DrainPolicy(until_idle=until_idle, config=SMALL)
        )
        gc.collect()
        assert sum(len(p.batches) for p in passes) >= (3 if until_idle else 1)
        if until_idle:
            assert len(fetched) >= 3
        else:  # a full batch, but one pass reads nothing ahead it would not use
            assert passes[0].batches[0].ops == SMALL.max_batch and len(fetched) == 1
        assert [ref for ref in fetched if ref() is not None] == []
        more_acts(conn, work, 20)
        fetched.clear()


def test_a_pass_reads_the_next_tenant_s_batch_while_the_current_one_commits(
    conn, lake, monkeypatch
):
    """One pass over three tenants, one batch each: the first batch is read by the drain, the
    next two on the fetcher's thread while the tenant before them commits, each once."""
    works = [seed_tenant(conn, bad=False) for _ in range(3)]
    fetched = recorded_fetches(monkeypatch)

    (one,) = drain(conn, lake)

    order = [b.tenant_id for b in one.batches]
    assert sorted(order) == sorted(w.tenant_id for w in works)
    assert [(t, after) for t, after, _ in fetched] == [(t, 0) for t in order]
    assert [thread.startswith("oml-fetch") for _, _, thread in fetched] == [False, True, True]
    assert sequencer.pending_tenants(conn) == []


def test_a_full_batch_reads_ahead_the_next_tenant_of_the_pass_before_its_own_next(
    conn, lake, monkeypatch
):
    """The batch the drain needs next is the next tenant's of the pass: a tenant whose batch
    is full reads its own next one ahead only when it is the pass's last tenant."""
    works = sorted((seed_tenant(conn, bad=False) for _ in range(2)), key=lambda w: w.tenant_id)
    fetched = recorded_fetches(monkeypatch)

    first = drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL))[0].batches

    assert [b.ops for b in first] == [SMALL.max_batch] * 2  # both full: more to come
    (a, b) = (w.tenant_id for w in works)
    assert [(t, after, thread.startswith("oml-fetch")) for t, after, thread in fetched[:3]] == [
        (a, 0, False),
        (b, 0, True),  # the next tenant, while a's batch commits
        (b, first[1].batch_end, True),  # the pass's last tenant: its own next batch
    ]
    assert sequencer.pending_tenants(conn) == []


def test_a_batch_read_ahead_from_a_stale_frontier_is_read_again(conn, lake, monkeypatch):
    """The next tenant's batch is read from where the frontier cache says it stands; where the
    cache is behind the tenant's tables, that batch is not used: the batch is read again from
    where the tables stand, so nothing they hold is folded again."""
    works = sorted((seed_tenant(conn, bad=False) for _ in range(2)), key=lambda w: w.tenant_id)
    (one,) = drain(conn, lake)
    drained = {b.tenant_id: b.batch_end for b in one.batches}
    conn.execute("TRUNCATE oml.lake_frontier")  # the cache forgets: every tenant at 0
    for work in works:
        more_acts(conn, work, 2)
    fetched = recorded_fetches(monkeypatch)

    (again,) = drain(conn, lake, [w.tenant_id for w in works])

    assert [(b.tenant_id, b.batch_start) for b in again.batches] == [
        (w.tenant_id, drained[w.tenant_id]) for w in works
    ]
    second = works[1].tenant_id
    assert [(t, after) for t, after, _ in fetched] == [
        (works[0].tenant_id, drained[works[0].tenant_id]),
        (second, 0),  # read ahead from the cache's word
        (second, drained[second]),  # and again from the tables'
    ]
    assert dead_letters(conn) == {}
    assert sequencer.pending_tenants(conn) == []


def test_a_batch_s_ops_are_freed_without_the_cyclic_collector(conn, lake):
    """An op refused while it is parsed is kept as a fresh exception. The caught one's
    traceback held the parse loop's frame, and with it the list of every op of the batch: a
    reference cycle only the cyclic collector freed (20,000 objects for a 12,000-op batch,
    40-90 ms per collection in a 20-tenant drain, bench/RESULTS.md)."""
    work = seed_tenant(conn, bad=False)
    act = acts.demote_act(work.claims[0])
    (name, payload), *rest = act.ops
    act.ops = [(name, {**payload, "at": "not an instant"}), *rest]
    producer.commit_acts(conn, work.keys, [act])
    gc.collect()
    gc.disable()
    try:
        drain(conn, lake, [work.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kept = [o for o in gc.garbage if isinstance(o, Op | RefusedOp)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert len(dead_letters(conn)) == 1
    assert kept == []


def test_release_memory_frees_arrow_buffers_held_by_reference_cycles():
    gc.disable()  # the test decides when the cyclic collector runs
    try:
        before = pa.total_allocated_bytes()
        holder: dict = {"column": pa.array(range(1_000_000), pa.int64())}
        holder["self"] = holder  # a cycle: refcounting alone never frees it
        del holder
        assert pa.total_allocated_bytes() - before >= 8_000_000
        release_memory()
        assert pa.total_allocated_bytes() - before < 1_000_000
    finally:
        gc.enable()


def _holding_the_cut_ahead(
    monkeypatch, until: threading.Event, ended: threading.Event | None = None
) -> list[bool]:
    """Every cut made on the drain's cut-ahead thread waits for `until` (30 s at most) before it
    runs, and sets `ended` when it has; returns, per such cut, whether `until` was set in time."""
    waited: list[bool] = []
    cut = sequencer.sequence_for_batches

    def held(conn, *args, **kwargs):
        if not threading.current_thread().name.startswith("oml-cut"):
            return cut(conn, *args, **kwargs)
        waited.append(until.wait(30))
        try:
            return cut(conn, *args, **kwargs)
        finally:
            if ended is not None:
                ended.set()

    monkeypatch.setattr(sequencer, "sequence_for_batches", held)
    return waited


def _unsequenced(conn) -> int:
    return conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0]


def test_a_drain_until_idle_drains_what_is_sequenced_while_its_next_cut_runs(
    conn, lake, monkeypatch
):
    """Over a backlog longer than a cut, the next cut runs on a connection of its own (ADR
    0055) and the drain does not wait for it while it has sequenced rows to drain: here the
    cut ahead is held until two batches have committed, which a drain waiting for it would
    never reach (it would wait the hold's 30 s out). Once the cut is in, the drain takes it
    and ends idle with everything drained and every row counted once in its passes."""
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 6)
    monkeypatch.setattr(sequencer, "CUT_LIMIT", 10)
    backlog = _unsequenced(conn)
    assert backlog > 3 * 10
    released = threading.Event()
    waited = _holding_the_cut_ahead(monkeypatch, released)

    class Counting(DrainObserver):
        committed = 0

        def batch_ended(self, result) -> None:
            self.committed += bool(result.committed)
            if self.committed == 2:
                released.set()

    passes = drain(
        conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL), observer=Counting()
    )

    assert waited and all(waited)  # every cut ahead was let go by the drain's second batch
    assert sum(p.sequenced.sequenced for p in passes) == backlog
    assert _unsequenced(conn) == 0 and sequencer.pending_tenants(conn) == []
    assert not passes[-1].progressed


def test_a_cut_ahead_that_loses_its_connection_is_ridden_through(conn, dsn, lake, monkeypatch):
    """The cut ahead's session is terminated mid-drain: the fault reaches the drain when it
    takes the cut, is transient (no tenant's failure), and the ride-through starts over and
    drains everything."""
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 6)
    monkeypatch.setattr(sequencer, "CUT_LIMIT", 10)
    cut = sequencer.sequence_for_batches
    killed: list[int] = []

    def lost(cut_conn, *args, **kwargs):
        if threading.current_thread().name.startswith("oml-cut") and not killed:
            killed.append(cut_conn.info.backend_pid)
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (killed[0],))
        return cut(cut_conn, *args, **kwargs)

    monkeypatch.setattr(sequencer, "sequence_for_batches", lost)
    retried: list[str] = []

    class Retrying(_Watching):
        def retrying(self, fault, failures, wait) -> None:
            retried.append(fault.cause)

    watching = Retrying(tolerant=True)
    drain_riding_through(
        lambda: psycopg.connect(dsn, autocommit=True),
        lake,
        retry=RetryPolicy(attempts=3, seconds=60, base_seconds=0.05, cap_seconds=0.1),
        policy=DrainPolicy(until_idle=True, config=SMALL),
        observer=watching,
    )

    assert killed and len(retried) == 1
    assert [h for h in watching.heard if h[0] == "failed"] == []
    assert _unsequenced(conn) == 0 and sequencer.pending_tenants(conn) == []


def test_a_cut_ahead_that_ends_during_a_pass_with_nothing_to_drain_is_taken(
    conn, lake, monkeypatch
):
    """A pass that found nothing to drain while the cut ahead ran is not idle, even when the
    cut has ended by the time the pass is judged: the next pass takes its rows. Here the cut
    ahead is held until such a pass has read that nothing is pending, then let end before the
    pass is judged."""
    work = seed_tenant(conn, bad=False)
    more_acts(conn, work, 6)
    monkeypatch.setattr(sequencer, "CUT_LIMIT", 10)
    backlog = _unsequenced(conn)
    released, cut_ended, cut_done = threading.Event(), threading.Event(), threading.Event()
    waited = _holding_the_cut_ahead(monkeypatch, released, cut_ended)
    pending = sequencer.pending_tenants

    class Watched(ThreadPoolExecutor):
        """The cut ahead's pool: each cut's future, once done, sets `cut_done`."""

        def submit(self, fn, /, *args, **kwargs):
            future = super().submit(fn, *args, **kwargs)
            future.add_done_callback(lambda _: cut_done.set())
            return future

    monkeypatch.setattr(drain_loop, "ThreadPoolExecutor", Watched)

    def nothing_pending_then_the_cut_ends(*args, **kwargs):
        found = pending(*args, **kwargs)
        if not found and not released.is_set():
            released.set()
            assert cut_done.wait(30)  # the cut ended and its future is done
        return found

    monkeypatch.setattr(sequencer, "pending_tenants", nothing_pending_then_the_cut_ends)

    passes = drain(conn, lake, policy=DrainPolicy(until_idle=True, config=SMALL))

    assert waited and all(waited) and cut_ended.is_set()
    assert sum(p.sequenced.sequenced for p in passes) == backlog
    assert _unsequenced(conn) == 0 and pending(conn) == []
