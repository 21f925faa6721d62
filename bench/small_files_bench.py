"""A shard run's cost per tenant batch as its tables fill with micro-batch files (ADR 0033).

Writes `--tenants` tenants' workloads (`--claims` each), then drains them in one drain call, as
a standing shard run does (tables kept open, one batch of `--batch` ops per tenant per pass),
and reports the wall time per tenant batch over windows of passes, with the writer's compaction
on the way and without it (the same workload, a fresh database and lake each), and the data
files each table holds at the end.

    .venv/bin/python bench/small_files_bench.py --tenants 10 --claims 600 --batch 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._support import fresh_database, machine  # noqa: E402
from oml_dagster.lake.policy import known_tenants  # noqa: E402
from oml_dagster.lake.store import rewrites  # noqa: E402
from oml_dagster.lake.store.layout import Lake  # noqa: E402
from oml_dagster.lake.store.reads import tenant_tables  # noqa: E402
from oml_dagster.lake.write.drain import DrainObserver, DrainPass, DrainPolicy, drain  # noqa: E402
from oml_dagster.lake.write.writer import WriterConfig  # noqa: E402
from oml_dagster.simulate.runner import RunConfig, run  # noqa: E402
from oml_dagster.simulate.workload import WorkloadConfig  # noqa: E402


def one(args, compaction: bool) -> dict:
    every = rewrites.SMALL_FILES_EVERY
    rewrites.SMALL_FILES_EVERY = every if compaction else 2**62
    try:
        with fresh_database("oml_small") as dsn, tempfile.TemporaryDirectory() as root:
            run(dsn, WorkloadConfig(tenants=args.tenants, claims=args.claims), RunConfig())
            lake = Lake(root)
            config = WriterConfig(max_batch=args.batch, txn_lag_limit=args.batch - 1)
            per_pass: list[tuple[int, float]] = []  # (tenant batches, seconds)
            last = time.perf_counter()

            class Timed(DrainObserver):
                def pass_ended(self, p: DrainPass) -> None:
                    nonlocal last
                    now = time.perf_counter()
                    if p.batches:
                        per_pass.append((len(p.batches), now - last))
                    last = now

            with psycopg.connect(dsn, autocommit=True) as conn:
                started = time.perf_counter()
                drain(
                    conn, lake, policy=DrainPolicy(until_idle=True, config=config), observer=Timed()
                )
                total = time.perf_counter() - started
                tenants = known_tenants(conn)
            files = {}
            for name, _, uri in tenant_tables(lake, tenants[0]):
                table = lake.open(uri)
                files[str(name)] = len(table.file_uris()) if table is not None else 0
    finally:
        rewrites.SMALL_FILES_EVERY = every
    windows = {}
    for start in range(0, len(per_pass), args.window):
        chunk = per_pass[start : start + args.window]
        windows[f"passes {start + 1}-{start + len(chunk)}"] = round(
            1000 * sum(s for _, s in chunk) / sum(n for n, _ in chunk), 1
        )
    batches = sum(n for n, _ in per_pass)
    return {
        "compaction": compaction,
        "passes": len(per_pass),
        "tenant_batches": batches,
        "seconds": round(total, 2),
        "ms_per_batch": round(1000 * total / max(batches, 1), 1),
        "ms_per_batch_by_window": windows,
        "last_window_over_first": round(list(windows.values())[-1] / list(windows.values())[0], 2),
        "files_of_one_tenant": files,
        "median_pass_s": round(statistics.median(s for _, s in per_pass), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--claims", type=int, default=600)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--window", type=int, default=15, help="passes per reported window")
    parser.add_argument("--json", help="write the figures to this path")
    args = parser.parse_args()
    print(machine(), flush=True)
    results = []
    for compaction in (False, True):
        r = one(args, compaction)
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
