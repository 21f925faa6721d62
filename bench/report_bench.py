"""What a shard run's report costs Dagster's PostgreSQL storage: one materialization per asset
and tenant partition, stored one by one (`context.log_event`) or as one batch per asset (the
events Dagster writes for a partitioned output: `DagsterEventBatchMetadata`, with
DAGSTER_EVENT_BATCH_SIZE set), as `oml_dagster.defs.shards` reports.

A Dagster instance on a fresh PostgreSQL database (dagster-postgres, as deployed); one in-process
run whose op reports `--tenants` partitions of the five lake assets `--rounds` times each way,
alternating. For each way: wall seconds, this process's CPU, and the sessions PostgreSQL opened
for the database (`pg_stat_database.sessions`: every one a backend forked, authenticated, ended).

    .venv/bin/python bench/report_bench.py --tenants 25 100 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg
from dagster import (
    AssetMaterialization,
    DagsterEvent,
    OpExecutionContext,
    instance_for_test,
    job,
    op,
)
from dagster._core.events import DagsterEventBatchMetadata, generate_event_batch_id

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import machine  # noqa: E402
from lag_bench import empty_database  # noqa: E402

from oml_dagster.defs.assets import TABLE_OF  # noqa: E402
from oml_dagster.defs.shards import EVENT_BATCH_SIZE  # noqa: E402

METADATA = {"rows_written": 10, "rows_added": 8, "rows_updated": 2, "action": "committed"}


def sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]


def one_by_one(context: OpExecutionContext, tenants: list[str]) -> None:
    for tenant in tenants:
        for key in TABLE_OF:
            context.log_event(
                AssetMaterialization(asset_key=key, partition=tenant, metadata=METADATA)
            )


def batched(context: OpExecutionContext, tenants: list[str]) -> None:
    step = context.get_step_execution_context()
    for key in TABLE_OF:
        batch = generate_event_batch_id()
        for i, tenant in enumerate(tenants):
            DagsterEvent.asset_materialization(
                step,
                AssetMaterialization(asset_key=key, partition=tenant, metadata=METADATA),
                DagsterEventBatchMetadata(batch, is_end=i == len(tenants) - 1),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    print(machine())
    os.environ["DAGSTER_EVENT_BATCH_SIZE"] = EVENT_BATCH_SIZE
    figures: dict[str, list[dict]] = {}
    with empty_database("oml_report_bench") as dsn:

        @op
        def report(context) -> None:  # noqa: ANN001 (Dagster reads the annotation)
            for n in args.tenants:
                tenants = [f"00000000-0000-4000-8000-{i:012d}" for i in range(n)]
                for _ in range(args.rounds):
                    for way, fn in (("one by one", one_by_one), ("batched", batched)):
                        before = sessions(dsn)
                        wall, cpu = time.perf_counter(), time.process_time()
                        fn(context, tenants)
                        row = {
                            "tenants": n,
                            "wall_s": time.perf_counter() - wall,
                            "cpu_s": time.process_time() - cpu,
                            # Less the one `sessions` itself opens.
                            "sessions": sessions(dsn) - before - 1,
                        }
                        figures.setdefault(f"{n} {way}", []).append(row)

        @job
        def reporting() -> None:
            report()

        info = psycopg.conninfo.conninfo_to_dict(dsn)
        db = {
            "scheme": "postgresql+psycopg2",
            "username": info.get("user", "postgres"),
            "password": info.get("password", ""),
            "hostname": info.get("host", "127.0.0.1"),
            "port": int(info.get("port", 5432)),
            "db_name": info["dbname"],
        }
        with instance_for_test(overrides={"storage": {"postgres": {"postgres_db": db}}}) as inst:
            reporting.execute_in_process(instance=inst)
    for name, rows in figures.items():
        print(
            f"{name}: {len(TABLE_OF)} assets x {rows[0]['tenants']} partitions, median of "
            f"{len(rows)}: wall {statistics.median(r['wall_s'] for r in rows) * 1000:.0f} ms, "
            f"this process's CPU {statistics.median(r['cpu_s'] for r in rows) * 1000:.0f} ms, "
            f"PostgreSQL sessions {statistics.median(r['sessions'] for r in rows):.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
