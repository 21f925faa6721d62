"""The columnar path is conservative: an event the fetch's SQL checks and the bronze module clear
as a bronze row is one the op catalog accepts, and the row is the one the catalog would write. Random event payloads — valid ones and
ones broken in each way a producer can break them — are fetched and compared with the catalog's
verdict (Hypothesis)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.bronze import checked_events, cleared_events
from oml_dagster.lake.ingest.fetch import Fetcher
from oml_dagster.lake.model import catalog, tables
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.writer import TenantBatch, WriterConfig
from oml_dagster.simulate import producer

B32 = base64.b64encode(bytes(range(32))).decode()
MUTATIONS = {
    "at": st.sampled_from(
        [
            "2026-11-01T12:00:00Z",
            "2026-11-01T12:00:00.123456Z",
            "2026-11-01T12:00:00.123456789Z",
            "2026-11-01T12:00:00+00:00",
            "2026-11-01T14:00:00+02:00",
            "2026-11-01t12:00:00z",
            "2024-02-29T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-12-31T23:59:59.999999Z",
            "2026-11-01T24:00:00Z",
            "2026-11-01T12:00:60Z",
            "0000-01-01T00:00:00Z",
            "2026-W44-1T12:00Z",
            "20261101T120000Z",
            "2026-11-01 12:00:00Z",
            "2026-11-01T12:00:00Z\n",
            "2026-11-01T12:00:00",
            "",
            5,
        ]
    ),
    "journal_seq": st.sampled_from([1, 2, 0, -1, 1.5, "1", True, None, 10**19]),
    "event_id": st.sampled_from(
        [str(uuid.uuid4()), str(uuid.uuid4()).upper(), "not-a-uuid", "", 7, None]
    ),
    "event_type": st.sampled_from(["x.y", "", 3, None]),
    "hash": st.sampled_from([B32, B32[:-1], B32 + "\n", "", "@@@@", None, B32[:-4] + "AAA="]),
    "prev_hash": st.sampled_from([B32, base64.b64encode(bytes(31)).decode(), "", None]),
    "sig": st.sampled_from([base64.b64encode(bytes(64)).decode(), B32, "", None]),
    "signed_bytes": st.sampled_from(["e30=", "", "e30", "e3==", None, "AAAA"]),
    "payload": st.sampled_from(['{"a":1}', "{nope", "", "[]", '"x"', 1, None]),
    "principal": st.sampled_from(["agent:x", "", None, 1]),
    "api_key_id": st.sampled_from(["KEY", "unknown-key", "", None, "OTHER"]),
    "artifact_id": st.sampled_from([str(uuid.uuid4()), "ABC", None, 1]),
    "version": st.sampled_from([1, 7, 0, -3, 2.0, "1", True, None]),
    "workarea_id": st.sampled_from([str(uuid.uuid4()), "x", None]),
    "simulation_id": st.sampled_from([str(uuid.uuid4()), "", None]),
    "provenance": st.sampled_from(["agent", "simulation", "robot", "", None, 1]),
    "extra_field": st.sampled_from(["x", None]),
    "tenant_id": st.sampled_from(["OWN", "OTHER"]),
}
DROP = object()


def _values(strategy) -> list:
    return list(strategy.elements)


@st.composite
def payload_edits(draw) -> dict:
    names = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3, unique=True))
    chosen = {}
    for name in names:
        chosen[name] = (
            DROP if draw(st.booleans()) and name != "tenant_id" else draw(MUTATIONS[name])
        )
    return chosen


def _state(tenant_id: str, keys: dict[str, str]) -> tables.TenantState:
    return tables.TenantState(
        tenant_id=tenant_id,
        bronze=tables.AppendWork(txn=0),
        silver=tables.KeyedWork(tables.SILVER_CLAIMS, 0),
        lineage=tables.KeyedWork(tables.GOLD_LINEAGE, 0),
        areas=tables.KeyedWork(tables.GOLD_AREAS, 0),
        curated={},
        bodies={},
        api_keys=keys,
    )


def _catalog_verdict(seq, journal_seq, payload, state: tables.TenantState):
    try:
        op = catalog.parse(
            "journal.event", payload, seq=seq, journal_seq=journal_seq, tenant_id=state.tenant_id
        )
        catalog.check(op, state)
    except RefusedOp:
        return None
    return op


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(payload_edits(), min_size=1, max_size=25))
# Every mutation on its own, whatever the search draws.
@example(batch=[{name: value} for name, values in MUTATIONS.items() for value in _values(values)])
@example(batch=[{name: DROP} for name in MUTATIONS if name != "tenant_id"])
def test_every_event_the_sql_clears_the_catalog_accepts_with_the_same_values(conn, batch):
    keys = producer.create_tenant(conn)
    other = producer.create_tenant(conn)
    api_keys = {keys.api_key_id: keys.tenant_id, other.api_key_id: other.tenant_id}
    rows = []
    for journal_seq, chosen in enumerate(batch, start=1):
        event = producer.Event("x.y", {"a": journal_seq}, artifact_id=str(uuid.uuid4()), version=1)
        payload, _ = producer.journal_entry(
            keys,
            keys.tenant_id,
            journal_seq,
            bytes(32),
            event,
            dt.datetime.now(dt.UTC),
            str(uuid.uuid4()),
        )
        for name, value in chosen.items():
            if value is DROP:
                payload.pop(name, None)
            elif name == "api_key_id":
                payload[name] = {"KEY": keys.api_key_id, "OTHER": other.api_key_id}.get(
                    value, value
                )
            elif name == "tenant_id":
                payload[name] = keys.tenant_id if value == "OWN" else other.tenant_id
            elif value is not None or name != "extra_field":
                payload[name] = value
        rows.append((keys.tenant_id, journal_seq, "journal.event", json.dumps(payload)))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
            rows,
        )
    sequencer.sequence(conn)
    with Fetcher(conn) as fetcher:
        columns = fetcher.fetch(keys.tenant_id, after=0, max_ops=1000, max_bytes=2**30).columns
    assert columns.num_rows == len(rows)
    texts = columns["payload_json"].to_pylist()

    def canonical(text: str) -> str:
        return json.dumps(json.loads(text), sort_keys=True)

    assert sorted(map(canonical, texts)) == sorted(canonical(row[3]) for row in rows), (
        "every row carries its whole payload"
    )
    cleared = cleared_events(
        columns,
        checked_events(columns),
        bronze_txn=0,
        refused=set(),
        held_journal_seqs=set(),
        catalog_journal_seqs=[],
    )
    for row in cleared.rows.to_pylist():
        payload = json.loads(rows[row["journal_seq"] - 1][3])
        state = _state(keys.tenant_id, api_keys)
        op = _catalog_verdict(row["outbox_seq"], row["journal_seq"], payload, state)
        assert op is not None, ("the columns cleared what the catalog refuses", payload)
        catalog.apply(op, state)
        assert state.bronze.output(0).to_pylist() == [row], payload


def test_canonical_events_are_cleared(conn):
    """The producers' canonical events all take the columnar path (else it would be useless)."""
    keys = producer.create_tenant(conn)
    for i in range(5):
        producer.commit_acts(conn, keys, [producer.Act(producer.Event("x.y", {"i": i}), [])])
    sequencer.sequence(conn)
    with Fetcher(conn) as fetcher:
        batch = fetcher.fetch(keys.tenant_id, after=0, max_ops=100, max_bytes=2**30)
    assert checked_events(batch.columns)[0].to_pylist() == [True] * 5
    assert not batch.more


def test_batches_are_cut_by_ops_and_bytes_and_say_whether_more_follows(conn):
    """The byte cap keeps whole ops while their stored payloads fit, always the first; `more`
    says whether the scan read an op past the cut (byte cap) or the batch is full (op cap)."""
    keys = producer.create_tenant(conn)
    for i in range(5):
        producer.commit_acts(conn, keys, [producer.Act(producer.Event("x.y", {"i": i}), [])])
    sequencer.sequence(conn)
    size = conn.execute(
        "SELECT max(pg_column_size(payload)) FROM oml.outbox WHERE tenant_id = %s",
        (keys.tenant_id,),
    ).fetchone()[0]
    with Fetcher(conn) as fetcher:
        first = fetcher.fetch(keys.tenant_id, after=0, max_ops=100, max_bytes=1)
        two = fetcher.fetch(keys.tenant_id, after=0, max_ops=100, max_bytes=2 * size + 1)
        full = fetcher.fetch(keys.tenant_id, after=0, max_ops=5, max_bytes=2**30)
        rest = fetcher.fetch(keys.tenant_id, after=two.seqs[-1], max_ops=100, max_bytes=2**30)
    assert (len(first), first.more) == (1, True)
    assert (len(two), two.more) == (2, True)
    assert (len(full), full.more) == (5, True)
    assert (len(rest), rest.more) == (3, False)
    assert rest.seqs == full.seqs[2:]


def test_the_first_ops_of_a_batch_are_the_batch_a_smaller_cap_reads(conn):
    """What lets the drain cut a batch read ahead under a larger cap instead of reading it
    again: for every pair of op caps and every byte cap, the first ops of the larger batch are
    the smaller batch, and say the same of what follows."""
    keys = producer.create_tenant(conn)
    for i in range(8):
        event = producer.Event("x.y", {"i": i, "pad": "x" * (40 * (i % 3))})
        producer.commit_acts(conn, keys, [producer.Act(event, [("area.upsert", {"i": i})])])
    sequencer.sequence(conn)
    sizes = [
        s
        for (s,) in conn.execute(
            "SELECT pg_column_size(payload) FROM oml.outbox WHERE tenant_id = %s ORDER BY seq",
            (keys.tenant_id,),
        )
    ]
    byte_caps = sorted({1, sum(sizes[:3]), sum(sizes[:5]) + 1, sum(sizes[:9]), 2**30})
    with Fetcher(conn) as fetcher:
        for max_bytes in byte_caps:
            for after in (0, 5):
                read = {
                    n: fetcher.fetch(keys.tenant_id, after=after, max_ops=n, max_bytes=max_bytes)
                    for n in range(1, 18)
                }
                for larger in range(2, 18):
                    for smaller in range(1, larger):
                        cut, fresh = read[larger].head(smaller), read[smaller]
                        label = (max_bytes, after, larger, smaller)
                        assert cut.seqs == fresh.seqs, label
                        assert cut.more == fresh.more, label
                        assert cut.columns.drop_columns(["followed"]).equals(
                            fresh.columns.drop_columns(["followed"])
                        ), label


class _CountingStatements(psycopg.Connection):
    """A connection that records each statement run on it (each is a round trip)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.statements: list[str] = []

    def execute(self, query, params=None, **kwargs):
        self.statements.append(str(query))
        return super().execute(query, params, **kwargs)


class _CountingFetcher(Fetcher):
    """A fetcher that records the seqs of every batch it fetches."""

    def __init__(self, conn):
        super().__init__(conn)
        self.fetched: list[int] = []

    def fetch(self, tenant_id, *, after, max_ops, max_bytes):
        batch = super().fetch(tenant_id, after=after, max_ops=max_ops, max_bytes=max_bytes)
        self.fetched.extend(batch.seqs)
        return batch


def test_a_batch_read_fetches_each_op_once(conn, dsn, lake):
    """Events the columnar checks do not clear (an undeclared field) and cleared events the
    batch's order leaves to the catalog (a journal_seq twice) are folded from the payload text
    of the batch's one fetch: no statement of the read reads the outbox again, and every op of
    the batch is fetched and parsed once, to the payload PostgreSQL holds."""
    keys = producer.create_tenant(conn)
    for i in range(4):
        producer.commit_acts(conn, keys, [producer.Act(producer.Event("x.y", {"i": i}), [])])
    events = conn.execute(
        "SELECT journal_seq, payload FROM oml.outbox WHERE tenant_id = %s AND op = 'journal.event'"
        " ORDER BY journal_seq",
        (keys.tenant_id,),
    ).fetchall()
    (first_seq, first), (second_seq, _) = events[0], events[1]
    conn.execute(  # the same event twice: cleared by the checks, left to the catalog by order
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
        (keys.tenant_id, first_seq, "journal.event", Jsonb(first)),
    )
    conn.execute(  # an undeclared field: not cleared by the checks
        "UPDATE oml.outbox SET payload = payload || '{\"extra\": 123456789012345678901234567890}'"
        " WHERE tenant_id = %s AND journal_seq = %s",
        (keys.tenant_id, second_seq),
    )
    sequencer.sequence(conn)
    stored = dict(
        conn.execute(
            "SELECT seq, payload FROM oml.outbox WHERE tenant_id = %s", (keys.tenant_id,)
        ).fetchall()
    )

    with _CountingStatements.connect(dsn, autocommit=True) as w, _CountingFetcher(w) as fetcher:
        batch = TenantBatch(
            tables=OpenTables(lake), tenant_id=keys.tenant_id, config=WriterConfig()
        )
        read = batch.read(w, fetcher=fetcher, ahead=None)
    assert sorted(fetcher.fetched) == sorted(stored) == list(read.seqs)
    assert not [s for s in w.statements if "oml.outbox" in s], w.statements
    folded = [row[0] for row in read.rows]
    assert len(folded) == len(set(folded)) == len(read.ops)
    # The catalog folded the event with the undeclared field and both rows of the twice-seen
    # event; the checks cleared the rest into bronze's columns.
    twice = [seq for seq, payload in stored.items() if payload == first]
    changed = [seq for seq, payload in stored.items() if "extra" in payload]
    assert len(twice) == 2 and len(changed) == 1
    assert set(twice + changed) <= set(folded)
    assert read.cleared.num_rows == len(stored) - len(folded)
    for seq, _journal_seq, _op, payload, _origin in read.rows:
        assert payload == stored[seq], seq
    assert stored[changed[0]]["extra"] == 123456789012345678901234567890  # exact, not a float
