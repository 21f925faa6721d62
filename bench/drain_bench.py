"""Drain throughput and memory: `oml-lake simulate` writes a seeded workload (every op, with
injected bad input) into a fresh database; then `drain --until-idle` into a fresh local lake is
timed.

    .venv/bin/python bench/drain_bench.py --tenants 10 --claims 2000 --max-batch 1000

Prints ops/s, batches, the median and worst batch time and peak RSS; results are kept in
bench/RESULTS.md with the machine and date."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
import uuid

import psycopg

from oml_dagster.lake import db
from oml_dagster.lake.drain import drain
from oml_dagster.lake.storage import Lake
from oml_dagster.lake.writer import WriterConfig
from oml_dagster.simulate import producer
from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

ADMIN = os.environ.get("OML_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--max-batch", type=int, default=5000)
    parser.add_argument("--bad-ratio", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    name = f"oml_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(ADMIN)
    info["dbname"] = name
    dsn = psycopg.conninfo.make_conninfo(**info)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn, tempfile.TemporaryDirectory() as tmp:
            db.upgrade(conn)
            producer.ensure_schema(conn)
            started = time.perf_counter()
            workload = WorkloadConfig(args.tenants, args.claims, args.seed, args.bad_ratio)
            run(dsn, workload, RunConfig(writers=2))
            ops = conn.execute("SELECT count(*) FROM oml.outbox").fetchone()[0]
            written = time.perf_counter() - started

            lake = Lake(os.path.join(tmp, "oml-lake"))
            times: list[float] = []
            last = [time.perf_counter()]

            def on_pass(current) -> None:
                now = time.perf_counter()
                if current.batches:
                    times.append((now - last[0]) / len(current.batches))
                last[0] = now

            config = WriterConfig(max_batch=args.max_batch, txn_lag_limit=args.max_batch // 2)
            started = time.perf_counter()
            passes = drain(conn, lake, until_idle=True, config=config, on_pass=on_pass)
            drained = time.perf_counter() - started
            batches = sum(len(p.batches) for p in passes)
            refused = conn.execute("SELECT count(*) FROM oml.lake_dead_letter").fetchone()[0]
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"workload: {args.tenants} tenants x {args.claims} claims = {ops} outbox rows"
                f" (simulate, seed {args.seed}, bad ratio {args.bad_ratio}), written in {written:.1f}s"
            )
            print(
                f"drain: {drained:.1f}s, {ops / drained:,.0f} ops/s, {batches} batches, {refused} dead letters"
            )
            print(f"batch time: median {statistics.median(times):.3f}s, worst {max(times):.3f}s")
            print(f"peak RSS: {rss:.0f} MiB")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
