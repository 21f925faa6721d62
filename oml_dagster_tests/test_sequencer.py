"""The stable-prefix cut: a tenant's rows are sequenced in journal order whatever the commit,
xid or insert order; gaps hold back only their tenant and are reported; seq is gap-free."""

from __future__ import annotations

import random
import threading
import time

import psycopg
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from oml_dagster.lake import queries
from oml_dagster.lake.ingest import sequencer
from oml_dagster.simulate import producer
from oml_dagster.simulate.producer import Act, Event, commit_acts


def _act(conn, keys, **kw) -> int:
    """One act; with `before_lock` its transaction takes its xid before waiting for the lock."""
    act = Act(Event("test.act", {"n": 1}), [("area.upsert", {"x": 1})])
    (journal_seq,) = commit_acts(conn, keys, [act], early_xid="before_lock" in kw, **kw)
    return journal_seq


def _sequenced(conn) -> list[tuple]:
    return conn.execute(
        "SELECT tenant_id::text, journal_seq, id, seq FROM oml.outbox WHERE seq IS NOT NULL ORDER BY seq"
    ).fetchall()


def _assert_cut_invariants(conn) -> None:
    rows = _sequenced(conn)
    assert [r[3] for r in rows] == list(range(1, len(rows) + 1)), "seq is gap-free and unique"
    by_tenant: dict[str, list[tuple]] = {}
    for row in rows:
        by_tenant.setdefault(row[0], []).append(row)
    for tenant_rows in by_tenant.values():
        order = [(r[1], r[2]) for r in tenant_rows]
        assert order == sorted(order), "a tenant's rows follow (journal_seq, id)"
        journal = sorted({r[1] for r in tenant_rows})
        assert journal == list(range(1, len(journal) + 1)), "a tenant's run has no holes"


def test_transactions_of_different_tenants_commit_out_of_order(conn, dsn):
    a, b = producer.create_tenant(conn), producer.create_tenant(conn)
    _act(conn, a)
    in_flight, release = threading.Event(), threading.Event()

    def slow_act():
        with psycopg.connect(dsn, autocommit=True) as own:
            _act(own, a, before_commit=lambda c: (in_flight.set(), release.wait(30)))

    thread = threading.Thread(target=slow_act)
    thread.start()
    assert in_flight.wait(30)
    for _ in range(3):
        _act(conn, b)  # commits while a's second act is still open
    report = sequencer.sequence(conn)
    assert report.tenants[b.tenant_id].sequenced == 6
    assert report.tenants[a.tenant_id].sequenced == 2
    release.set()
    thread.join(30)
    report = sequencer.sequence(conn)
    assert report.tenants[a.tenant_id].sequenced == 2 and b.tenant_id not in report.tenants
    _assert_cut_invariants(conn)


def test_a_next_act_that_took_its_xid_before_the_previous_committed(conn, dsn):
    keys = producer.create_tenant(conn)
    first_locked, second_has_xid, release = threading.Event(), threading.Event(), threading.Event()

    def second():  # takes its xid first, then waits for the chain head lock
        with psycopg.connect(dsn, autocommit=True) as own:
            _act(own, keys, before_lock=lambda c: (second_has_xid.set(), first_locked.wait(30)))

    def first():
        with psycopg.connect(dsn, autocommit=True) as own:
            assert second_has_xid.wait(30)
            _act(own, keys, before_commit=lambda c: (first_locked.set(), release.wait(30)))

    threads = [threading.Thread(target=second), threading.Thread(target=first)]
    for t in threads:
        t.start()
    assert first_locked.wait(30)
    time.sleep(0.2)
    assert sequencer.sequence(conn).sequenced == 0  # neither act committed yet
    release.set()
    for t in threads:
        t.join(30)
    # xmin before the cut (the cut's UPDATE writes new row versions).
    xids = dict(conn.execute("SELECT journal_seq, xmin::text::bigint FROM oml.outbox").fetchall())
    assert xids[2] < xids[1], "act 2's transaction took its xid before act 1's"
    sequencer.sequence(conn)
    seqs = conn.execute("SELECT seq FROM oml.outbox ORDER BY journal_seq, id").fetchall()
    assert [s for (s,) in seqs] == [1, 2, 3, 4]
    _assert_cut_invariants(conn)


def test_a_gap_holds_back_only_its_tenant_and_is_reported(conn):
    a, b = producer.create_tenant(conn), producer.create_tenant(conn)
    _act(conn, a)
    _act(conn, b)
    sequencer.sequence(conn)
    # An act of tenant a at journal_seq 3 while 2 is not visible (as a stalled producer would leave).
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, 3, 'x', %s)",
        (a.tenant_id, Jsonb({})),
    )
    _act(conn, b)
    report = sequencer.sequence(conn)
    assert report.tenants.keys() == {b.tenant_id}
    (gap,) = report.gaps
    assert (gap.tenant_id, gap.waiting_rows, gap.missing_journal_seq) == (a.tenant_id, 1, 2)
    assert sequencer.sequence(conn).gaps, "a persisting gap is reported again, never skipped"
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, 2, 'x', %s)",
        (a.tenant_id, Jsonb({})),
    )
    report = sequencer.sequence(conn)
    assert report.tenants[a.tenant_id].sequenced == 2 and not report.gaps
    _assert_cut_invariants(conn)


def test_a_reenqueued_row_at_the_last_position_is_sequenced_after_everything(conn):
    keys = producer.create_tenant(conn)
    for _ in range(3):
        _act(conn, keys)
    sequencer.sequence(conn)
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, 3, 'again', %s)",
        (keys.tenant_id, Jsonb({})),
    )
    report = sequencer.sequence(conn)
    assert report.tenants[keys.tenant_id].sequenced == 1
    assert conn.execute("SELECT seq FROM oml.outbox WHERE op = 'again'").fetchone()[0] == 7


def test_the_per_pass_limit_keeps_runs_contiguous(conn):
    tenants = [producer.create_tenant(conn) for _ in range(3)]
    for keys in tenants:
        for _ in range(4):
            _act(conn, keys)
    passes = 0
    while True:
        report = sequencer.sequence(conn, limit=5)
        passes += 1
        _assert_cut_invariants(conn)
        if not report.sequenced:
            break
    assert passes >= 5
    assert conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0] == 0


def test_many_interleavings_never_skip_duplicate_or_reorder(conn, dsn):
    rng = random.Random(7)
    tenants = [producer.create_tenant(conn) for _ in range(4)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer_thread(seed: int) -> None:
        local = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                for _ in range(25):
                    keys = local.choice(tenants)
                    hooks = {}
                    if local.random() < 0.3:
                        hooks["before_lock"] = lambda c: time.sleep(local.random() * 0.01)
                    if local.random() < 0.3:
                        hooks["before_commit"] = lambda c: time.sleep(local.random() * 0.02)
                    if local.random() < 0.05:  # an occasional long-open transaction
                        hooks["before_commit"] = lambda c: time.sleep(0.2)
                    _act(own, keys, **hooks)
        except BaseException as error:
            errors.append(error)

    def sequencer_thread() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                while not stop.is_set():
                    sequencer.sequence(own, limit=rng.choice([3, 10, 1000]))
                    _assert_cut_invariants(own)
        except BaseException as error:
            errors.append(error)

    producers = [threading.Thread(target=producer_thread, args=(i,)) for i in range(6)]
    sequencers = [threading.Thread(target=sequencer_thread) for _ in range(2)]
    for t in producers + sequencers:
        t.start()
    for t in producers:
        t.join(120)
    stop.set()
    for t in sequencers:
        t.join(60)
    assert not errors, errors
    while sequencer.sequence(conn).sequenced:
        pass
    total = conn.execute("SELECT count(*) FROM oml.outbox").fetchone()[0]
    assert total == 6 * 25 * 2
    assert conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0] == 0
    _assert_cut_invariants(conn)


def test_pending_tenants_is_one_query_over_the_cache(conn):
    a, b = producer.create_tenant(conn), producer.create_tenant(conn)
    _act(conn, a)
    _act(conn, b)
    sequencer.sequence(conn)
    assert {t for t, _, _ in sequencer.pending_tenants(conn)} == {a.tenant_id, b.tenant_id}
    conn.execute(
        "INSERT INTO oml.lake_frontier (tenant_id, table_name, batch_end, txn_version)"
        " SELECT %s, name, 1000, 0 FROM unnest(ARRAY['bronze.events','silver.claims',"
        " 'gold.lineage','gold.areas']) AS name",
        (a.tenant_id,),
    )
    assert [t for t, _, _ in sequencer.pending_tenants(conn)] == [b.tenant_id]
    assert sequencer.pending_tenants(conn, [a.tenant_id]) == []


@given(
    st.dictionaries(st.uuids().map(str), st.integers(1, 10_000), max_size=40),
    st.integers(1, 50_000),
)
def test_quotas_share_a_cut_fairly_and_fill_it(pending, limit):
    shares = sequencer.quotas(pending, limit)
    assert set(shares) <= set(pending)
    assert all(0 < shares[t] <= pending[t] for t in shares)
    assert sum(shares.values()) == min(limit, sum(pending.values()))
    # Max-min fair: a tenant cut short of its backlog got at least as much as any other but one.
    for t, share in shares.items():
        if share < pending[t]:
            assert all(other <= share + 1 for other in shares.values())
    if set(pending) - set(shares):  # a tenant is left out only when the limit ran out
        assert sum(shares.values()) == limit


def test_a_cut_takes_a_fair_share_of_each_backlog_in_order(conn):
    """With one tenant far behind, a small limit still cuts every tenant's run in journal order:
    the small backlog whole, the large one up to the rest of the limit."""
    big, small = producer.create_tenant(conn), producer.create_tenant(conn)
    for _ in range(12):
        _act(conn, big)
    for _ in range(2):
        _act(conn, small)
    rows_of = {
        k.tenant_id: conn.execute(
            "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s", (k.tenant_id,)
        ).fetchone()[0]
        for k in (big, small)
    }
    report = sequencer.sequence(conn, limit=10)
    assert report.tenants[small.tenant_id].sequenced == rows_of[small.tenant_id]
    assert report.tenants[big.tenant_id].sequenced == 10 - rows_of[small.tenant_id]
    assert report.deferred_rows == rows_of[big.tenant_id] - (10 - rows_of[small.tenant_id])
    _assert_cut_invariants(conn)


def test_a_drain_pass_cuts_until_each_tenant_has_a_full_batch(conn):
    """Many small cuts add up to a batch per tenant in one pass (and one report); a pass stops
    cutting once the batches are full, leaving the rest deferred."""
    tenants = [producer.create_tenant(conn) for _ in range(3)]
    for keys in tenants:
        for _ in range(6):
            _act(conn, keys)
    pending = conn.execute("SELECT count(*) FROM oml.outbox").fetchone()[0]
    report = sequencer.sequence_for_batches(conn, max_batch=8, limit=5)
    _assert_cut_invariants(conn)
    assert set(report.tenants) == {k.tenant_id for k in tenants}
    assert 3 * 8 <= report.sequenced < 3 * 8 + 5  # stopped at the cut that filled the batches
    assert report.deferred_rows == pending - report.sequenced
    seqs = conn.execute(
        "SELECT tenant_id::text, min(seq), max(seq), count(seq) FROM oml.outbox GROUP BY 1"
    ).fetchall()
    for tenant_id, first, last, count in seqs:
        cut = report.tenants[tenant_id]
        assert (cut.first_seq, cut.last_seq, cut.sequenced) == (first, last, count)
    # Nothing deferred: one cut is enough.
    rest = sequencer.sequence_for_batches(conn, max_batch=1000, limit=1000)
    assert rest.sequenced == pending - report.sequenced and rest.deferred_rows == 0


def test_a_pass_counts_the_backlog_once_and_what_it_leaves_once(conn, monkeypatch):
    """Both counts read every unsequenced row: a pass of many cuts counts each tenant's pending
    rows before its first cut and the rows left waiting after its last, not at every cut; rows
    committed between its cuts wait for the next pass."""
    tenants = [producer.create_tenant(conn) for _ in range(3)]
    for keys in tenants:
        for _ in range(6):
            _act(conn, keys)
    statements: list[str] = []
    execute = conn.execute

    def recorded(query, *args, **kwargs):
        statements.append(query)
        if query == queries.SEQUENCE_ASSIGN and statements.count(query) == 2:
            with psycopg.connect(conn.info.dsn, autocommit=True) as other:
                _act(other, tenants[0])  # committed between two cuts of the pass
        return execute(query, *args, **kwargs)

    monkeypatch.setattr(conn, "execute", recorded)
    report = sequencer.sequence_for_batches(conn, max_batch=8, limit=5)
    monkeypatch.undo()

    assert statements.count(queries.SEQUENCE_ASSIGN) >= 5  # 3 x 8 rows, 5 a cut
    assert statements.count(queries.SEQUENCE_PENDING) == 1
    assert statements.count(queries.UNSEQUENCED_BY_TENANT) == 1
    _assert_cut_invariants(conn)
    unsequenced = conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0]
    assert report.deferred_rows == unsequenced  # the late act's rows among them
    assert (
        report.sequenced
        == conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NOT NULL").fetchone()[0]
    )


def test_a_cut_finds_its_rows_by_key_not_by_scanning_the_outbox(conn):
    """A cut numbers a fraction of an outbox that keeps every sequenced row. The planner would
    hash the cut and scan the whole outbox for its ids, at a cost growing with the outbox; the
    cut's UPDATE finds each row by the primary key (the plan is read from auto_explain)."""
    tenants = [producer.create_tenant(conn).tenant_id for _ in range(2)]
    outbox = (
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
        " SELECT t, j, 'area.upsert', '{}' FROM unnest(%s::uuid[]) t,"
        " generate_series(%s::bigint, %s::bigint) j"
    )
    conn.execute(outbox, (tenants, 1, 5_000))
    sequencer.sequence(conn, limit=10_000)
    conn.execute(outbox, (tenants, 5_001, 6_000))
    conn.execute("VACUUM ANALYZE oml.outbox")
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET client_min_messages = log")
    conn.execute("SET random_page_cost = 100")  # probes priced as on an outbox larger than memory
    with conn.transaction():
        report, _ = sequencer.cut_in_transaction(conn, 1_000, None)
        settings = (
            conn.execute("SHOW enable_hashjoin").fetchone(),
            conn.execute("SHOW enable_mergejoin").fetchone(),
        )
    conn.execute("RESET client_min_messages; RESET random_page_cost")

    assert report.sequenced == 1_000
    (update,) = [p for p in plans if "Update on outbox" in p]
    assert "Index Scan using outbox_pkey on outbox o " in update
    assert "Seq Scan on outbox o " not in update
    # The settings end with the statement: the rest of the transaction plans freely.
    assert settings == (("on",), ("on",))
    # and a session's own setting outlives the cut's transaction.
    conn.execute("SET enable_mergejoin = off")
    sequencer.sequence(conn, limit=10)
    assert conn.execute("SHOW enable_mergejoin").fetchone() == ("off",)
    conn.execute("RESET enable_mergejoin")
    _assert_cut_invariants(conn)


def test_a_cut_counts_only_when_a_row_is_unsequenced(conn, monkeypatch):
    """Right after a large cut the statistics still count the rows it numbered as unsequenced,
    and the planner scanned the whole outbox for both counts of every cut that found nothing
    (a drain until idle makes one per pass). A cut first asks whether any row is unsequenced,
    reading outbox_unsequenced whatever the statistics say, and counts only when one is."""
    tenant = producer.create_tenant(conn).tenant_id
    outbox = (
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
        " SELECT %s, j, 'area.upsert', '{}' FROM generate_series(%s::bigint, %s::bigint) j"
    )
    conn.execute(outbox, (tenant, 1, 5_000))
    conn.execute("ANALYZE oml.outbox")  # every row unsequenced, as far as the planner knows
    assert sequencer.sequence(conn, limit=10_000).sequenced == 5_000
    statements: list[str] = []
    execute = conn.execute

    def recorded(query, *args, **kwargs):
        statements.append(query)
        return execute(query, *args, **kwargs)

    monkeypatch.setattr(conn, "execute", recorded)
    idle = sequencer.sequence_for_batches(conn, max_batch=1_000)
    counted_idle = [
        q for q in statements if q in (queries.SEQUENCE_PENDING, queries.UNSEQUENCED_BY_TENANT)
    ]
    execute(outbox, (tenant, 5_001, 5_001))
    execute(outbox, (tenant, 5_003, 5_003))  # behind a gap: still unsequenced after the cut
    statements.clear()
    one = sequencer.sequence_for_batches(conn, max_batch=1_000)
    counted_one = [
        q for q in statements if q in (queries.SEQUENCE_PENDING, queries.UNSEQUENCED_BY_TENANT)
    ]
    monkeypatch.undo()
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + queries.ANY_UNSEQUENCED))

    assert idle.sequenced == 0 and idle.deferred_rows == 0 and counted_idle == []
    assert one.sequenced == 1 and [g.waiting_rows for g in one.gaps] == [1]
    assert counted_one == [
        queries.SEQUENCE_PENDING,
        queries.UNSEQUENCED_BY_TENANT,
    ]
    assert "outbox_unsequenced" in plan and "Seq Scan" not in plan
    _assert_cut_invariants(conn)
