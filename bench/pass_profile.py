"""Where a shard pass's time goes: many tenants, each with a small batch, on tables that exist.

Writes `--tenants` tenants' workloads (`--claims` each), drains them in batches of `--batch` ops
until `--warm` passes have run (so every table exists and has history), then profiles the next
`--passes` passes with cProfile and prints the mean wall time per tenant batch and the top
functions by cumulative time. This is the shape of a shard run at issue 11's target 2: ~25
tenants a shard, a few dozen ops each per visit.

    .venv/bin/python bench/pass_profile.py --tenants 25 --claims 60 --batch 40
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import fresh_database, machine  # noqa: E402

from oml_dagster.lake.store.layout import Lake  # noqa: E402
from oml_dagster.lake.write.drain import DrainPolicy, drain  # noqa: E402
from oml_dagster.lake.write.writer import WriterConfig  # noqa: E402
from oml_dagster.simulate.runner import RunConfig, run  # noqa: E402
from oml_dagster.simulate.workload import WorkloadConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=25)
    parser.add_argument("--claims", type=int, default=60)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--sort", default="cumulative", help="pstats order: cumulative, tottime")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time by the process's CPU (every thread's, delta-rs's runtime included), not wall",
    )
    parser.add_argument("--dump", help="also write the profile to this file (pstats format)")
    args = parser.parse_args()
    print(machine())
    with fresh_database("oml_pass") as dsn, tempfile.TemporaryDirectory() as root:
        run(dsn, WorkloadConfig(tenants=args.tenants, claims=args.claims), RunConfig())
        lake = Lake(root)
        # A small batch as a shard visit finds it, with the highest txn lag limit it allows.
        config = WriterConfig(max_batch=args.batch, txn_lag_limit=args.batch - 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(args.warm):
                drain(conn, lake, policy=DrainPolicy(config=config))
            profiler = cProfile.Profile(time.process_time) if args.cpu else cProfile.Profile()
            batches, started = 0, time.perf_counter()
            tally: Counter = Counter()
            profiler.enable()
            # One drain of several passes, as a shard run drains (tables kept open, the next
            # batch fetched while one commits).
            policy = DrainPolicy(until_idle=True, config=config, max_passes=args.passes)
            for one in drain(conn, lake, policy=policy):
                batches += len(one.batches)
                for batch in one.batches:
                    for t in batch.tables:
                        table = t.name.split("/")[0]  # every curated table as one
                        kind = t.action
                        if t.action == "committed":
                            kind += ", updated rows" if t.rows_updated else ", rows added only"
                        tally[table, kind] += 1
            profiler.disable()
            if args.dump:
                profiler.dump_stats(args.dump)
            elapsed = time.perf_counter() - started
    print(
        f"{batches} tenant batches in {elapsed:.2f} s: {1000 * elapsed / max(batches, 1):.0f} ms each"
    )
    print("what each tenant batch did to each table (MERGE: a commit that updated rows):")
    for (table, kind), n in sorted(tally.items()):
        print(f"  {table:<14} {kind:<28} {n:5d}  ({n / max(batches, 1):.2f} per batch)")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(args.sort).print_stats(args.top)
    print(text.getvalue())


if __name__ == "__main__":
    main()
