"""Bronze throughput against its own library: N journal.event ops of one tenant (signed,
hash-chained, as the producer writes them) are sequenced, then

- baseline: `write_deltalake` of the very same bronze rows, already in memory as Arrow;
- drain: `drain` until idle of the sequenced backlog into a fresh lake (fetch, checks,
  dedup, commit), the product's end-to-end path;

both into fresh local directories, in the same run. Prints the rates and their ratio.

    .venv/bin/python bench/bronze_bench.py --events 200000
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import datetime as dt
import json
import os
import tempfile
import time

import psycopg
import pyarrow as pa
from deltalake import write_deltalake

from oml_dagster import from_settings
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import BRONZE_EVENTS, writer_properties
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.memory import release_memory, resident_mib
from oml_dagster.simulate import producer

try:
    from bench._support import fresh_database, machine, promoted_events
except ImportError:  # run as a script
    from _support import fresh_database, machine, promoted_events


def write_events(conn: psycopg.Connection, keys: producer.TenantKeys, n: int) -> list[dict]:
    """COPY `n` chained journal events of one tenant into the outbox; returns their payloads."""
    payloads = promoted_events(keys, n)
    with (
        conn.cursor() as cur,
        cur.copy("COPY oml.outbox (tenant_id, journal_seq, op, payload) FROM STDIN") as copy,
    ):
        for payload in payloads:
            copy.write_row(
                (keys.tenant_id, payload["journal_seq"], "journal.event", json.dumps(payload))
            )
    return payloads


def bronze_rows(tenant_id: str, payloads: list[dict]) -> pa.Table:
    import base64

    rows = []
    for seq, p in enumerate(payloads, start=1):
        row = {c: p.get(c) for c in BRONZE_EVENTS.columns}
        at = dt.datetime.fromisoformat(p["at"])
        for c in ("prev_hash", "hash", "sig", "signed_bytes"):
            row[c] = base64.b64decode(p[c])
        row.update(tenant_id=tenant_id, at=at, event_date=at.date(), outbox_seq=seq)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=BRONZE_EVENTS.schema)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument(
        "--max-batch", type=int, default=None, help="fixed batch (default: adaptive)"
    )
    args = parser.parse_args()
    with fresh_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        keys = producer.create_tenant(conn)
        payloads = write_events(conn, keys, args.events)
        started = time.perf_counter()
        sequencer.sequence(conn)
        sequencing = time.perf_counter() - started
        # What autovacuum does after a cut this large: without it the planner keeps the
        # statistics of the COPY (every seq NULL) and each sequencer pass inside the drain scans
        # the whole outbox (2.2 s a pass at 200,000 ops; bench/RESULTS.md, target 1).
        conn.execute("VACUUM ANALYZE oml.outbox")
        # The first sequencer pass after a cut this large takes seconds with nothing to sequence
        # (6-12 s at 200,000 ops, the later ones 0.1-0.4 s; RESULTS, target 1): it is the cut's
        # aftermath, reported here and kept off the drain's clock.
        started = time.perf_counter()
        sequencer.sequence(conn)
        after_cut = time.perf_counter() - started
        data = bronze_rows(keys.tenant_id, payloads)
        # The drain runs in this process, and its memory governor counts what the process
        # holds. The payload dicts go before it (~500 MiB); the baseline runs after it, because
        # delta-rs keeps what a write allocated (write_deltalake of these rows took the process
        # from ~410 to ~940 MiB, and freeing the rows gave none of it back): run first, it put
        # the drain at its budget before every batch, in batches of 5,000-12,500 ops.
        del payloads
        release_memory()
        resident = resident_mib()
        # Both sides start with their libraries loaded: the fetcher imports the ADBC driver (and
        # with it pyarrow.dataset) on first use, 2.7 s of a profiled drain on a cold host.
        import adbc_driver_postgresql.dbapi  # noqa: F401

        with tempfile.TemporaryDirectory() as tmp:
            # The writer's settings read as the product reads them (ADR 0052), the cap over them.
            config = (
                from_settings.writer_config()
                if args.max_batch is None
                else from_settings.writer_config(args.max_batch, args.max_batch // 2)
            )
            lake = Lake(os.path.join(tmp, "oml-lake"))
            started = time.perf_counter()
            passes = drain(
                conn, lake, [keys.tenant_id], policy=DrainPolicy(until_idle=True, config=config)
            )
            drained = time.perf_counter() - started
            sizes = [b.ops for p in passes for b in p.batches if b.ops]
            table = lake.open(lake.table_uri(keys.tenant_id, BRONZE_EVENTS))
            assert table.to_pyarrow_table(columns=["journal_seq"]).num_rows == args.events

            started = time.perf_counter()
            write_deltalake(
                os.path.join(tmp, "baseline"),
                data,
                partition_by=list(BRONZE_EVENTS.partition_by),
                writer_properties=writer_properties(BRONZE_EVENTS),
            )
            baseline = time.perf_counter() - started

        n = args.events
        print(machine())
        print(f"events: {n:,} journal.event ops of one tenant; sequencing {sequencing:.2f} s")
        print(f"first sequencer pass after the cut (nothing to sequence): {after_cut:.2f} s")
        print(f"baseline write_deltalake: {baseline:.2f} s = {n / baseline:,.0f} rows/s")
        print(f"drain --until-idle:       {drained:.2f} s = {n / drained:,.0f} events/s")
        print(f"ratio drain / baseline:   {baseline / drained:.2f}x")
        print(f"batches: {len(sizes)} of {', '.join(f'{n:,}' for n in sizes)} ops")
        print(f"resident before the drain: {resident or 0:,.0f} MiB (the baseline's rows held)")


if __name__ == "__main__":
    main()
