"""Issue 43's narrow cut, measured before it is built (ADR 0055, "The narrow cut is the next
step"; ADR 0079 records the figures).

Today the cut numbers a tenant's rows with one `UPDATE` of `oml.outbox.seq` (sequencer.py): a new
heap tuple per row, with its index entries and the full pages' images in the WAL. The narrow
form keeps the outbox as producers wrote it: a trigger on the outbox copies each new row's
(tenant_id, journal_seq, id) into a narrow queue, `oml.outbox_queue`, and the cut moves the rows
it numbers from the queue into a narrow table, `oml.outbox_seq(id, tenant_id, seq,
sequenced_at)`. Both tables, their row-level security and the trigger exist here only, on a
fresh database with the project's migrations applied (`_support.fresh_database`).

Measured in one run, each figure beside its baseline:

1. producers: N outbox rows COPYed as the simulator's producer writes them (signed, chained
   `journal.event` payloads of about 1.5 kB stored), without the trigger, with a row trigger and
   with a statement trigger (a transition table), in two shapes: one act per transaction (2 rows)
   and 100 rows per transaction; rows/s, the server process's CPU per row (from /proc: the
   server is local) and WAL bytes per row, the variants alternating in every round
   (`--producer-rounds`) on a truncated outbox after a checkpoint. Producers commit without waiting for the
   flush here (`synchronous_commit = off`, unless `--synchronous-commit`), so the trigger's
   share is the largest it can be;
2. the cut of `--rows` rows: the real `sequencer.sequence` against the same function with the
   narrow SQL in place of the outbox's (the very `SEQUENCE_ASSIGN`, its pending rows read from
   the queue and its `UPDATE` replaced by an `INSERT` into the seq table and the queue's
   `DELETE`, in one statement under the same lock): seconds, server CPU and WAL bytes per 100,000
   rows. Both
   run on a copy of the same backlog (a template), after a checkpoint; the numbering of both is
   checked equal;
3. the fetch: one tenant's sequenced rows in batches of 5,000 through the real `Fetcher`, its
   `BATCH_SQL` as it is, and with the one subquery that reads the outbox by seq replaced by the
   batch's seqs from the seq table, each joined to its outbox row by id (the outbox rows where
   producers left them, interleaved by tenant as `--interleave` says); rows/s (best of
   `--passes`) and rows per server CPU second, the two results checked equal;
4. finding unsequenced rows right after the cut (the `--rows` cut leaves 5 % of the backlog):
   the first call and the median of five of today's peek (`ANY_UNSEQUENCED`) and per-tenant count
   (`SEQUENCE_PENDING`) against the same on the queue.

WAL is counted two ways: the cluster's insert position before and after (`wal`, which takes
in whatever else the cluster writes meanwhile), and, with pg_walinspect, the records that touch
this database's relations or belong to its transactions (`own wal`, the figure quoted).

    .venv/bin/python bench/narrow_cut_bench.py --json out.json     # 100,000 rows: about 2 min
    .venv/bin/python bench/narrow_cut_bench.py --tenants 20 --interleave 1 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import Snapshot, fresh_database, machine, promoted_events  # noqa: E402

from oml_dagster.lake import queries  # noqa: E402
from oml_dagster.lake.ingest import fetch as fetch_module  # noqa: E402
from oml_dagster.lake.ingest import sequencer  # noqa: E402
from oml_dagster.lake.queries import cross_scope  # noqa: E402
from oml_dagster.simulate import producer  # noqa: E402

BATCH = 5_000
MAX_BATCH_BYTES = 64 * 2**20  # the writer's default (WriterConfig.max_batch_bytes)

# The narrow tables, with the row-level security migration 0004 gives the outbox, and the two
# forms of the queue's trigger. SECURITY DEFINER: a producer's role needs no grant on the queue.
NARROW_SCHEMA = """
CREATE TABLE oml.outbox_queue (
    tenant_id   uuid   NOT NULL,
    journal_seq bigint NOT NULL,
    id          bigint NOT NULL,
    PRIMARY KEY (tenant_id, journal_seq, id)
);
CREATE TABLE oml.outbox_seq (
    id           bigint      PRIMARY KEY,
    tenant_id    uuid        NOT NULL,
    seq          bigint      NOT NULL UNIQUE,
    sequenced_at timestamptz NOT NULL
);
CREATE INDEX outbox_seq_tenant ON oml.outbox_seq (tenant_id, seq) INCLUDE (id);
GRANT SELECT ON oml.outbox_seq TO oml_lake_tenant;
GRANT SELECT, INSERT ON oml.outbox_seq TO oml_lake_cross;
GRANT SELECT, DELETE ON oml.outbox_queue TO oml_lake_cross;
ALTER TABLE oml.outbox_seq ENABLE ROW LEVEL SECURITY;
ALTER TABLE oml.outbox_queue ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON oml.outbox_seq TO oml_lake_tenant
    USING (tenant_id = NULLIF(current_setting('oml.tenant_id', true), '')::uuid);
CREATE POLICY every_tenant ON oml.outbox_seq TO oml_lake_cross USING (true) WITH CHECK (true);
CREATE POLICY every_tenant ON oml.outbox_queue TO oml_lake_cross USING (true) WITH CHECK (true);

CREATE FUNCTION oml.outbox_enqueue_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO oml.outbox_queue (tenant_id, journal_seq, id)
    VALUES (NEW.tenant_id, NEW.journal_seq, NEW.id);
    RETURN NULL;
END
$$;
CREATE FUNCTION oml.outbox_enqueue_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO oml.outbox_queue (tenant_id, journal_seq, id)
    SELECT tenant_id, journal_seq, id FROM added;
    RETURN NULL;
END
$$;
"""
TRIGGERS = {
    "none": None,
    "row trigger": (
        "CREATE TRIGGER outbox_enqueue AFTER INSERT ON oml.outbox"
        " FOR EACH ROW EXECUTE FUNCTION oml.outbox_enqueue_row()"
    ),
    "statement trigger": (
        "CREATE TRIGGER outbox_enqueue AFTER INSERT ON oml.outbox REFERENCING NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION oml.outbox_enqueue_rows()"
    ),
}
DROP_TRIGGER = "DROP TRIGGER IF EXISTS outbox_enqueue ON oml.outbox"


def _replaced(text: str, old: str, new: str) -> str:
    """`text` with its one `old` replaced: a change to the real statement fails here, loudly,
    instead of measuring something else."""
    if text.count(old) != 1:
        raise SystemExit(f"the statement changed: {old.strip()[:60]!r} not found once")
    return text.replace(old, new)


# The narrow cut: the real SEQUENCE_ASSIGN (its order rule and gap rule untouched), pending rows
# from the queue, the numbered rows inserted into the seq table and deleted from the queue.
NARROW_ASSIGN = _replaced(
    _replaced(
        queries.SEQUENCE_ASSIGN,
        "FROM oml.outbox\n        WHERE tenant_id = q.tenant_id AND seq IS NULL",
        "FROM oml.outbox_queue\n        WHERE tenant_id = q.tenant_id",
    ),
    """), assigned AS (
    UPDATE oml.outbox o SET seq = n.seq, sequenced_at = clock_timestamp()
    FROM numbered n WHERE o.id = n.id
    RETURNING n.tenant_id, n.journal_seq, n.seq
)
SELECT tenant_id::text, count(*), min(seq), max(seq), max(journal_seq)
FROM assigned GROUP BY tenant_id
""",
    """), assigned AS (
    INSERT INTO oml.outbox_seq (id, tenant_id, seq, sequenced_at)
    SELECT id, tenant_id, seq, clock_timestamp() FROM numbered
    RETURNING id
), dequeued AS (
    DELETE FROM oml.outbox_queue q USING numbered n
    WHERE q.tenant_id = n.tenant_id AND q.journal_seq = n.journal_seq AND q.id = n.id
    RETURNING q.id
)
SELECT tenant_id::text, count(*), min(seq), max(seq), max(journal_seq)
FROM numbered GROUP BY tenant_id
""",
)
NARROW_QUERIES = {
    "MAX_SEQ": "SELECT COALESCE(max(seq), 0) FROM oml.outbox_seq",
    "ANY_UNSEQUENCED": (
        "SELECT 1 FROM oml.outbox_queue ORDER BY tenant_id, journal_seq, id LIMIT 1"
    ),
    "SEQUENCE_PENDING": (
        "SELECT tenant_id::text, count(*) FROM oml.outbox_queue GROUP BY tenant_id"
    ),
    "SEQUENCE_ASSIGN": NARROW_ASSIGN,
    "UNSEQUENCED_BY_TENANT": """
SELECT q.tenant_id::text, count(*), min(q.journal_seq), min(o.created_at),
       max(t.last_journal_seq)
FROM oml.outbox_queue q JOIN oml.outbox o ON o.id = q.id
LEFT JOIN oml.sequencer_tenant t ON t.tenant_id = q.tenant_id
GROUP BY q.tenant_id
""",
}

# The fetch through the seq table: BATCH_SQL with its one read of the outbox by seq replaced by
# the batch's seqs from the seq table's (tenant_id, seq) index, each joined to its outbox row by
# the primary key (a nested loop keeps the seq order: no sort of the payloads). Joined before
# the limit, the planner, which has no statistics of a seq table filled since the last ANALYZE,
# chose a bitmap scan of the seq table and sorted the payloads by seq (85 ms against 52 ms a
# batch of 5,000).
NARROW_BATCH_SQL = _replaced(
    queries.BATCH_SQL,
    """    SELECT o.id, o.seq, o.tenant_id, o.journal_seq, o.op, o.payload AS p
    FROM oml.outbox o
    WHERE o.tenant_id = $1::uuid AND o.seq > $2 AND o.seq IS NOT NULL
    ORDER BY o.seq""",
    """    SELECT o.id, s.seq, o.tenant_id, o.journal_seq, o.op, o.payload AS p
    FROM (
      SELECT s.id, s.seq FROM oml.outbox_seq s
      WHERE s.tenant_id = $1::uuid AND s.seq > $2
      ORDER BY s.seq
      LIMIT $3
    ) s
    CROSS JOIN LATERAL (SELECT * FROM oml.outbox o WHERE o.id = s.id) o
    ORDER BY s.seq""",
)

FORMS = ("today", "narrow")


@contextlib.contextmanager
def narrow_sql(form: str) -> Iterator[None]:
    """The sequencer's and the fetch's statements of `form`, for the block (module attributes,
    restored after it)."""
    if form == "today":
        yield
        return
    saved = {name: getattr(queries, name) for name in NARROW_QUERIES}
    saved_batch = fetch_module.BATCH_SQL
    try:
        for name, sql in NARROW_QUERIES.items():
            setattr(queries, name, sql)
        fetch_module.BATCH_SQL = NARROW_BATCH_SQL
        yield
    finally:
        for name, sql in saved.items():
            setattr(queries, name, sql)
        fetch_module.BATCH_SQL = saved_batch


# --- the rows -----------------------------------------------------------------------------------


def journal_rows(
    tenants: list[producer.TenantKeys], per_tenant: int, interleave: int
) -> list[tuple[str, int, str, str]]:
    """Each tenant's chain of signed `claim.promoted` journal events (as bronze_bench writes
    them), the tenants' rows taken `interleave` at a time in turn, as concurrent producers
    leave them in the heap."""
    chains = [
        [
            (keys.tenant_id, p["journal_seq"], "journal.event", json.dumps(p))
            for p in promoted_events(keys, per_tenant)
        ]
        for keys in tenants
    ]
    out: list[tuple[str, int, str, str]] = []
    for start in range(0, per_tenant, interleave):
        for rows in chains:
            out.extend(rows[start : start + interleave])
    return out


def copy_rows(cur: psycopg.Cursor[Any], rows: list[tuple[str, int, str, str]]) -> None:
    with cur.copy("COPY oml.outbox (tenant_id, journal_seq, op, payload) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


# --- WAL ------------------------------------------------------------------------------------------


def insert_lsn(conn: psycopg.Connection) -> str:
    return str(queries.scalar(conn.execute("SELECT pg_current_wal_insert_lsn()")))


@contextlib.contextmanager
def wal_kept(conn: psycopg.Connection, walinspect: bool) -> Iterator[None]:
    """The WAL written from here on kept until the block ends (a temporary physical slot of this
    session, gone with it at the latest), so a checkpoint elsewhere in the cluster cannot
    recycle it before pg_walinspect reads it."""
    if not walinspect:
        yield
        return
    name = f"narrow_cut_{uuid.uuid4().hex[:8]}"
    conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (name,))
    try:
        yield
    finally:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def wal_between(conn: psycopg.Connection, start: str, end: str, walinspect: bool) -> dict:
    """WAL bytes from `start` to `end`: the cluster's, and this database's own (records on its
    relations, and the other records of the transactions that wrote those), read before the
    next checkpoint may recycle it (None if one did)."""
    # pg_walinspect reads flushed WAL only: a commit that waits for the flush flushes it all.
    # (A transaction that wrote nothing but its commit record does not wait.)
    conn.execute("SET synchronous_commit = on")
    conn.execute("INSERT INTO flush_mark VALUES (clock_timestamp())")
    out: dict[str, int | None] = {
        "wal": int(queries.scalar(conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start))))
    }
    if walinspect:
        try:
            own = conn.execute(
                """
                WITH r AS (SELECT * FROM pg_get_wal_records_info(%(start)s, %(end)s)),
                mine AS (SELECT xid, record_length FROM r WHERE block_ref LIKE %(rel)s)
                SELECT COALESCE(sum(record_length), 0) FROM r
                WHERE block_ref LIKE %(rel)s
                   OR (COALESCE(block_ref, '') = ''
                       AND xid::text IN (SELECT DISTINCT xid::text FROM mine WHERE xid <> '0'))
                """,
                {"start": start, "end": end, "rel": f"%/{database_oid(conn)}/%"},
            ).fetchone()
            out["own_wal"] = int(own[0]) if own else 0
        except psycopg.errors.UndefinedFile:  # a checkpoint elsewhere in the cluster recycled it
            out["own_wal"] = None
    return out


def database_oid(conn: psycopg.Connection) -> int:
    return int(
        queries.scalar(
            conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        )
    )


# --- 1. producers ---------------------------------------------------------------------------------


def produce(conn: psycopg.Connection, rows: list, per_transaction: int) -> float:
    """COPY `rows` into the outbox, `per_transaction` to a transaction; seconds."""
    started = time.perf_counter()
    with conn.cursor() as cur:
        for i in range(0, len(rows), per_transaction):
            with conn.transaction():
                copy_rows(cur, rows[i : i + per_transaction])
    return time.perf_counter() - started


def producer_round(
    conn: psycopg.Connection,
    shapes: dict[str, tuple[int, list]],
    order: list[str],
    walinspect: bool,
    synchronous_commit: bool,
) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for shape, (per_transaction, rows) in shapes.items():
        out[shape] = {}
        for variant in order:
            conn.execute(DROP_TRIGGER)
            if TRIGGERS[variant]:
                conn.execute(TRIGGERS[variant])
            conn.execute("TRUNCATE oml.outbox, oml.outbox_queue RESTART IDENTITY")
            conn.execute("CHECKPOINT")
            with wal_kept(conn, walinspect):
                start = insert_lsn(conn)
                cpu = backend_cpu(conn.info.backend_pid)
                seconds = produce(conn, rows, per_transaction)
                cpu = backend_cpu(conn.info.backend_pid) - cpu
                end = insert_lsn(conn)
                wal = wal_between(conn, start, end, walinspect)
            if not synchronous_commit:
                conn.execute("SET synchronous_commit = off")
            queued = queries.scalar(conn.execute("SELECT count(*) FROM oml.outbox_queue"))
            assert queued == (0 if variant == "none" else len(rows)), (variant, queued)
            out[shape][variant] = {
                "rows": len(rows),
                "seconds": round(seconds, 3),
                "rows_per_s": round(len(rows) / seconds),
                "server_cpu_us_per_row": round(cpu * 1e6 / len(rows), 1),
                **{
                    f"{k}_per_row": v / len(rows) if v is not None else None for k, v in wal.items()
                },
            }
    conn.execute(DROP_TRIGGER)
    return out


# --- 2-4. the cut, the fetch, the peek ----------------------------------------------------------


def backend_cpu(pid: int) -> float:
    """CPU seconds (user and system) the server process `pid` has used: what a statement costs
    the server, less sensitive than wall time to the other work on the machine (the server is
    local)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def peeks(conn: psycopg.Connection, repeats: int = 5) -> dict[str, float]:
    """Today's statements that find unsequenced rows (the queue's in the narrow form, as
    `narrow_sql` set them): the first call after the cut and the median of `repeats`, in ms."""
    out = {}
    for name in ("ANY_UNSEQUENCED", "SEQUENCE_PENDING"):
        sql = getattr(queries, name)

        def run(sql: str = sql) -> None:
            with cross_scope(conn):
                conn.execute(sql).fetchall()

        first = timed(run)
        later = [timed(run) for _ in range(repeats)]
        out[f"{name.lower()}_first_ms"] = round(first * 1000, 2)
        out[f"{name.lower()}_ms"] = round(statistics.median(later) * 1000, 2)
    return out


def numbering(conn: psycopg.Connection, form: str) -> str:
    table = "oml.outbox WHERE seq IS NOT NULL" if form == "today" else "oml.outbox_seq"
    return str(
        queries.scalar(
            conn.execute(f"SELECT md5(string_agg(id || ':' || seq, ',' ORDER BY seq)) FROM {table}")
        )
    )


def fetch_tenant(
    conn: psycopg.Connection, tenant_id: str, passes: int
) -> tuple[list[float], list[float], str]:
    """Every sequenced row of `tenant_id` in batches of BATCH through the real Fetcher, `passes`
    times: each pass's seconds, and a digest of what the last read (seq and payload)."""
    times, cpus, digest, rows = [], [], "", 0
    with fetch_module.Fetcher(conn) as fetcher:
        fetcher.fetch(tenant_id, after=0, max_ops=1, max_bytes=MAX_BATCH_BYTES)  # connect
        with fetcher._adbc.cursor() as cur:  # the server process of the fetcher's connection
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        for _ in range(passes):
            batches, after = [], 0
            cpu = backend_cpu(pid)
            started = time.perf_counter()
            while True:
                batch = fetcher.fetch(
                    tenant_id, after=after, max_ops=BATCH, max_bytes=MAX_BATCH_BYTES
                )
                if not len(batch):
                    break
                batches.append(batch)
                after = batch.seqs[-1]
                if not batch.more:
                    break
            times.append(time.perf_counter() - started)
            cpus.append(backend_cpu(pid) - cpu)
            hashed = hashlib.sha256()
            rows = 0
            for batch in batches:
                rows += len(batch)
                for column in ("seq", "payload_json"):
                    hashed.update(repr(batch.columns.column(column).to_pylist()).encode())
            digest = hashed.hexdigest()
    return [rows / t for t in times], [rows / c if c else float("inf") for c in cpus], digest


def explain_batch(conn: psycopg.Connection, tenant_id: str, after: int) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one batch of the fetch (the statement `narrow_sql` set), in
    the tenant's scope as the Fetcher runs it."""
    with queries.tenant_scope(conn, tenant_id):
        conn.execute("PREPARE batch (uuid, bigint, bigint, bigint) AS " + fetch_module.BATCH_SQL)
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)"
            f" EXECUTE batch ('{tenant_id}', {after}, {BATCH}, {MAX_BATCH_BYTES})"
        ).fetchall()
        conn.execute("DEALLOCATE batch")
    return "\n".join(line for (line,) in plan)


def cut_round(
    dsn: str,
    snapshot: Snapshot,
    form: str,
    limit: int,
    tenant_id: str,
    passes: int,
    walinspect: bool,
    explain: bool,
) -> dict:
    snapshot.restore()
    with psycopg.connect(dsn, autocommit=True) as conn, narrow_sql(form):
        conn.execute("CHECKPOINT")
        with wal_kept(conn, walinspect):
            start = insert_lsn(conn)
            cpu = backend_cpu(conn.info.backend_pid)
            started = time.perf_counter()
            report = sequencer.sequence(conn, limit)
            seconds = time.perf_counter() - started
            cpu = backend_cpu(conn.info.backend_pid) - cpu
            end = insert_lsn(conn)
            wal = wal_between(conn, start, end, walinspect)
        found = peeks(conn)
        rates, cpu_rates, digest = fetch_tenant(conn, tenant_id, passes)
        if explain:
            first = queries.scalar(
                conn.execute(
                    "SELECT min(seq) FROM oml.outbox_seq WHERE tenant_id = %s"
                    if form == "narrow"
                    else "SELECT min(seq) FROM oml.outbox WHERE tenant_id = %s",
                    (tenant_id,),
                )
            )
            print(
                f"--- {form}: one batch of the fetch\n{explain_batch(conn, tenant_id, first + BATCH)}"
            )
        return {
            "sequenced": report.sequenced,
            "deferred": report.deferred_rows,
            "cut_s": round(seconds, 3),
            "cut_s_per_100k": round(seconds * 100_000 / report.sequenced, 3),
            "cut_cpu_s_per_100k": round(cpu * 100_000 / report.sequenced, 3),
            **{
                f"{k}_per_100k": round(v * 100_000 / report.sequenced) if v is not None else None
                for k, v in wal.items()
            },
            **found,
            "fetch_rows_per_s": [round(r) for r in rates],
            "fetch_best_rows_per_s": round(max(rates)),
            "fetch_rows_per_server_cpu_s": round(statistics.median(cpu_rates)),
            "numbering": numbering(conn, form),
            "fetched": digest,
        }


# --- the run --------------------------------------------------------------------------------------


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def summarize(result: dict) -> dict:
    out: dict = {"producer": {}, "cut": {}}
    for shape, by_variant in result["producer_rounds"][0].items():
        out["producer"][shape] = {
            variant: {
                key: median_of([r[shape][variant][key] for r in result["producer_rounds"]])
                for key in by_variant[variant]
                if key not in ("rows",)
            }
            for variant in by_variant
        }
    for form in FORMS:
        rounds = [r[form] for r in result["cut_rounds"]]
        out["cut"][form] = {
            key: median_of([r[key] for r in rounds])
            for key in rounds[0]
            if isinstance(rounds[0][key], (int, float)) or rounds[0][key] is None
        }
    return out


def print_table(summary: dict, walinspect: bool) -> None:
    wal_key = "own_wal" if walinspect else "wal"
    print("\n1. producers (median of rounds)")
    print(
        f"  {'shape':<22}{'variant':<20}{'rows/s':>9}{'vs none':>8}"
        f"{'server CPU us/row':>19}{'vs none':>8}{'WAL B/row':>10}{'vs none':>8}"
    )
    for shape, by_variant in summary["producer"].items():
        base = by_variant["none"]
        for variant, v in by_variant.items():
            line = f"  {shape:<22}{variant:<20}"
            for key, fmt in (
                ("rows_per_s", "{:>9,.0f}"),
                ("server_cpu_us_per_row", "{:>19.1f}"),
                (f"{wal_key}_per_row", "{:>10,.0f}"),
            ):
                ratio = v[key] / base[key] if v[key] is not None and base[key] else float("nan")
                line += (
                    fmt.format(v[key]) if v[key] is not None else f"{'-':>10}"
                ) + f"{ratio:>8.2f}"
            print(line)
    today, narrow = summary["cut"]["today"], summary["cut"]["narrow"]
    rows = [
        ("2. cut, s per 100k rows", "cut_s_per_100k", "{:.3f}"),
        ("   cut, WAL MB per 100k rows", f"{wal_key}_per_100k", "MB"),
        ("   cut, cluster WAL MB per 100k", "wal_per_100k", "MB"),
        ("   cut, server CPU s per 100k", "cut_cpu_s_per_100k", "{:.3f}"),
        ("3. fetch, rows/s (best pass)", "fetch_best_rows_per_s", "{:,.0f}"),
        ("   fetch, rows per server CPU s", "fetch_rows_per_server_cpu_s", "{:,.0f}"),
        ("4. peek after cut, first, ms", "any_unsequenced_first_ms", "{:.2f}"),
        ("   peek after cut, ms", "any_unsequenced_ms", "{:.2f}"),
        ("   count after cut, first, ms", "sequence_pending_first_ms", "{:.2f}"),
        ("   count after cut, ms", "sequence_pending_ms", "{:.2f}"),
    ]
    print("\n2-4. the cut, the fetch, finding unsequenced rows (median of rounds)")
    print(f"  {'':<32}{'today':>14}{'narrow':>14}{'narrow/today':>14}")
    for label, key, fmt in rows:
        a, b = today[key], narrow[key]
        if a is None or b is None:  # WAL recycled before it was read: the cluster's figure
            key = key.replace("own_wal", "wal")
            label += " (cluster)"
            a, b = today[key], narrow[key]
        if fmt == "MB":
            text_a, text_b = f"{a / 2**20:.1f}", f"{b / 2**20:.1f}"
        else:
            text_a, text_b = fmt.format(a), fmt.format(b)
        print(f"  {label:<32}{text_a:>14}{text_b:>14}{(b / a if a else float('nan')):>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows the cut numbers")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the cut and the fetch")
    parser.add_argument("--producer-rounds", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument(
        "--interleave", type=int, default=10, help="a tenant's rows in a row in the heap"
    )
    parser.add_argument(
        "--producer-rows", type=int, default=None, help="rows per producer run (default rows/5)"
    )
    parser.add_argument("--passes", type=int, default=3, help="fetch passes per round")
    parser.add_argument("--synchronous-commit", action="store_true")
    parser.add_argument(
        "--explain", action="store_true", help="print a fetch batch's plan in the first round"
    )
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    started = time.perf_counter()
    backlog = args.rows + args.rows // 20  # the cut leaves 5 % of it unsequenced
    per_tenant = -(-backlog // args.tenants)
    producer_rows = args.producer_rows or args.rows // 5
    result: dict = {
        "machine": machine(),
        "args": vars(args),
        "started": dt.datetime.now(dt.UTC).isoformat(),
    }
    print(result["machine"])
    with fresh_database("oml_narrow") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                walinspect = True
            except psycopg.Error:
                walinspect = False
            conn.execute(NARROW_SCHEMA)
            conn.execute("CREATE TABLE flush_mark (at timestamptz)")
            tenants = [producer.create_tenant(conn) for _ in range(args.tenants)]
            rows = journal_rows(tenants, per_tenant, args.interleave)
            print(f"{len(rows):,} rows made in {time.perf_counter() - started:.1f} s")

            # 1. producers, the variants' order reversed every other round
            if not args.synchronous_commit:
                conn.execute("SET synchronous_commit = off")
            shapes = {
                "one act (2 rows/tx)": (2, rows[: max(producer_rows // 5, 200)]),
                "100 rows/tx": (100, rows[:producer_rows]),
            }
            # one unmeasured pass first: the first statements in a new database pay its caches
            warm = {shape: (k, r[:200]) for shape, (k, r) in shapes.items()}
            producer_round(conn, warm, list(TRIGGERS), False, args.synchronous_commit)
            result["producer_rounds"] = []
            variants = list(TRIGGERS)
            for n in range(args.producer_rounds):
                order = variants if n % 2 == 0 else variants[::-1]
                result["producer_rounds"].append(
                    producer_round(conn, shapes, order, walinspect, args.synchronous_commit)
                )
                print(f"producer round {n + 1}: {time.perf_counter() - started:.1f} s")
            conn.execute("RESET synchronous_commit")

            # the backlog: every row unsequenced and queued
            conn.execute("TRUNCATE oml.outbox, oml.outbox_queue RESTART IDENTITY")
            conn.execute(TRIGGERS["statement trigger"])
            with conn.cursor() as cur:
                copy_rows(cur, rows)
            conn.execute(DROP_TRIGGER)
            size = conn.execute(
                "SELECT avg(pg_column_size(payload))::int, pg_total_relation_size('oml.outbox'),"
                " pg_total_relation_size('oml.outbox_queue') FROM oml.outbox"
            ).fetchone()
            assert size is not None
            result["payload_bytes"], result["outbox_bytes"], result["queue_bytes"] = size
        snapshot = Snapshot(dsn)
        try:
            result["cut_rounds"] = []
            for n in range(args.rounds):
                order = list(FORMS) if n % 2 == 0 else list(FORMS)[::-1]
                one = {
                    form: cut_round(
                        dsn,
                        snapshot,
                        form,
                        args.rows,
                        tenants[0].tenant_id,
                        args.passes,
                        walinspect,
                        args.explain and n == 0,
                    )
                    for form in order
                }
                for key in ("numbering", "fetched"):
                    assert one["today"][key] == one["narrow"][key], f"{key} differs"
                result["cut_rounds"].append(one)
                print(f"cut round {n + 1}: {time.perf_counter() - started:.1f} s")
        finally:
            snapshot.drop()
    result["walinspect"] = walinspect
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["summary"] = summarize(result)
    print(
        f"\nbacklog {backlog:,} rows of {args.tenants} tenants (payload {result['payload_bytes']} B"
        f" stored; outbox {result['outbox_bytes'] / 2**20:.0f} MB, queue"
        f" {result['queue_bytes'] / 2**20:.1f} MB), cut {args.rows:,}; producers"
        f" {'with' if args.synchronous_commit else 'without'} synchronous commit;"
        f" WAL: {'own (pg_walinspect)' if walinspect else 'cluster'}"
    )
    print_table(result["summary"], walinspect)
    print(f"\n{result['seconds']} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
