"""When each cut, fetch and tenant batch of one in-process `drain --until-idle` starts and ends,
and on which thread: where a backlog drain waits (ADR 0055).

N journal.event ops of one tenant are COPYed into a fresh database's outbox, unsequenced (as
`idle_bench.py` does); then this checkout's `drain(..., DrainPolicy(until_idle=True))` drains
them into a fresh local lake, and every call of the sequencer's pass cut, the fetcher and
tenant batch phase (`TenantBatch.read`, `fold`, `commit`) prints one line: thread, what, start ->
end (seconds from the drain's start), and
the rows cut or the ops of the batch.

    .venv/bin/python bench/drain_timeline.py --events 200000
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import fresh_database, machine  # noqa: E402
from bronze_bench import write_events  # noqa: E402

from oml_dagster.lake.ingest import fetch, sequencer  # noqa: E402
from oml_dagster.lake.store.layout import Lake  # noqa: E402
from oml_dagster.lake.write import drain as drain_loop  # noqa: E402
from oml_dagster.lake.write import writer  # noqa: E402
from oml_dagster.simulate import producer  # noqa: E402


def timed(owner, name: str, label: str, started: list[float], what) -> None:
    """Replace `owner.name` by a wrapper printing each call's thread, times and `what(result)`."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.perf_counter() - started[0]
        result = original(*args, **kwargs)
        end = time.perf_counter() - started[0]
        thread = threading.current_thread().name
        print(
            f"{thread:12s} {label:6s} {start:6.2f} -> {end:6.2f} ({end - start:5.2f}) {what(result)}"
        )
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    print(machine())
    started = [0.0]
    timed(sequencer, "sequence_for_batches", "cut", started, lambda r: f"{r.sequenced} rows")
    timed(fetch.Fetcher, "fetch", "fetch", started, lambda b: f"{len(b)} rows")
    timed(writer.TenantBatch, "read", "read", started, lambda r: f"{len(r.seqs)} ops")
    timed(writer.TenantBatch, "fold", "fold", started, lambda f: f"{len(f.refused)} refused")
    timed(writer.TenantBatch, "commit", "commit", started, lambda r: f"{r.ops} ops")
    with fresh_database("oml_timeline") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            keys = producer.create_tenant(conn)
            write_events(conn, keys, args.events)
            conn.execute("VACUUM ANALYZE oml.outbox")  # as autovacuum leaves a COPY
        with tempfile.TemporaryDirectory() as tmp, psycopg.connect(dsn, autocommit=True) as conn:
            lake = Lake(os.path.join(tmp, "lake"))
            started[0] = time.perf_counter()
            passes = drain_loop.drain(conn, lake, policy=drain_loop.DrainPolicy(until_idle=True))
            total = time.perf_counter() - started[0]
    print(f"drained {args.events} events in {total:.2f} s, {len(passes)} passes")


if __name__ == "__main__":
    main()
