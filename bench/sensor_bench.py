"""`outbox_sensor` tick time at scale (issue 11, target 3: a tick takes at most 1 s with 10,000
tenants known and 1,000 of them pending).

A fresh database gets N tenants by SQL (policy rows; every tenant not pending also has a
sequencer row and drained frontier rows, as a tenant drained before would), and P of them a few
unsequenced outbox rows each, shaped like the producer's (`journal.event` ops, contiguous
journal_seqs). Nothing drains them, so they stay pending. The sensor is evaluated as in the tests,
against a temporary Dagster instance, with its partition requests applied as the daemon applies
them:

- first tick: sequences the P tenants' rows and adds N partitions;
- steady ticks: N partitions known, P tenants pending (P run requests per tick, nothing new).

The same is run first at a small scale (default 100 tenants / 10 pending) as a baseline.

    .venv/bin/python bench/sensor_bench.py --tenants 10000 --pending 1000 --json out.json
    .venv/bin/python bench/sensor_bench.py --tenants 10000 --pending 1000 --profile

`--profile` prints a cProfile of one more steady tick (top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import time
import warnings
from collections.abc import Iterator

import psycopg
from dagster import DagsterInstance, build_sensor_context, instance_for_test

try:
    from bench._support import fresh_database, machine
except ImportError:  # run as a script
    from _support import fresh_database, machine

warnings.filterwarnings("ignore", message="Starting in dagster 1.11, get_sensor_def")

TARGET_SECONDS = 1.0
OPS_PER_PENDING_TENANT = 3
DRAINED_TABLES = ("bronze.events", "silver.claims", "gold.lineage", "gold.areas")


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def populate(dsn: str, tenants: int, pending: int) -> None:
    """N tenants, P of them with unsequenced outbox rows, the rest drained up to their last seq."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TEMP TABLE bench_tenant AS SELECT n, gen_random_uuid() AS tenant_id"
            " FROM generate_series(1, %s) AS n",
            (tenants,),
        )
        conn.execute("INSERT INTO oml.tenant_policy (tenant_id) SELECT tenant_id FROM bench_tenant")
        # Tenants drained before: a sequencer row and each table's frontier at its last seq.
        conn.execute(
            "INSERT INTO oml.sequencer_tenant (tenant_id, last_journal_seq, last_seq)"
            " SELECT tenant_id, 1, n FROM bench_tenant WHERE n > %s",
            (pending,),
        )
        conn.execute(
            "INSERT INTO oml.lake_frontier (tenant_id, table_name, batch_end, txn_version,"
            " table_version) SELECT s.tenant_id, t.name, s.last_seq, s.last_seq, 1"
            " FROM oml.sequencer_tenant s CROSS JOIN unnest(%s::text[]) AS t(name)",
            (list(DRAINED_TABLES),),
        )
        # Pending tenants: a few acts each, journal_seq 1.., one journal.event op per act.
        conn.execute(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
            " SELECT b.tenant_id, j, 'journal.event',"
            " jsonb_build_object('tenant_id', b.tenant_id, 'journal_seq', j,"
            " 'event_id', gen_random_uuid(), 'type', 'claim.created',"
            " 'payload', jsonb_build_object('claim_id', gen_random_uuid()))"
            " FROM bench_tenant b CROSS JOIN generate_series(1, %s) AS j"
            " WHERE b.n <= %s ORDER BY b.tenant_id, j",
            (OPS_PER_PENDING_TENANT, pending),
        )
        conn.execute("ANALYZE")


def tick(defs, sensor, instance, resources) -> dict:
    """One sensor evaluation, then its partition requests applied; each part timed."""
    started = time.perf_counter()
    with build_sensor_context(
        instance_ref=instance.get_ref(), definitions=defs, resources=resources
    ) as context:
        data = sensor.evaluate_tick(context)
    evaluated = time.perf_counter()
    added = 0
    for request in data.dynamic_partitions_requests or []:
        keys = list(request.partition_keys)
        instance.add_dynamic_partitions(request.partitions_def_name, keys)
        added += len(keys)
    done = time.perf_counter()
    return {
        "evaluate_s": evaluated - started,
        "apply_partitions_s": done - evaluated,
        "total_s": done - started,
        "run_requests": len(data.run_requests),
        "partitions_added": added,
        "load_after": _load(),
    }


@contextlib.contextmanager
def dagster_instance(storage: str, dsn: str) -> Iterator[DagsterInstance]:
    """A temporary instance: on SQLite files, or on Postgres storage as deployed (dagster.yaml),
    in its own fresh database."""
    overrides = None
    if storage == "postgres":
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        url = f"postgresql+psycopg2://{info.get('user', 'postgres')}"
        if info.get("password"):
            url += f":{info['password']}"
        url += f"@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info['dbname']}"
        overrides = {"storage": {"postgres": {"postgres_url": url}}}
    with instance_for_test(overrides=overrides) as instance:
        yield instance


def scenario(tenants: int, pending: int, steady: int, profile: bool, storage: str) -> dict:
    from oml_dagster.definitions import defs
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
    from oml_dagster.defs.resources import WriterResource, build_resources

    sensor = defs.get_sensor_def("outbox_sensor")
    result: dict = {
        "tenants": tenants,
        "pending": pending,
        "dagster_storage": storage,
        "load_before": _load(),
    }
    with fresh_database("oml_sensor_bench") as dsn:
        previous = os.environ.get("OML_PG_DSN")
        os.environ["OML_PG_DSN"] = dsn
        try:
            started = time.perf_counter()
            populate(dsn, tenants, pending)
            result["populate_s"] = time.perf_counter() - started
            with (
                fresh_database("oml_sensor_bench_dagster") as dagster_dsn,
                dagster_instance(storage, dagster_dsn) as instance,
            ):
                # The per-tenant mode (OML_DRAIN_SHARDS=0): one run request per pending tenant,
                # the tick's worst case; shard runs ask for at most one run per shard.
                resources = {**build_resources(), "writer": WriterResource(drain_shards=0)}
                first = tick(defs, sensor, instance, resources)
                known = len(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME))
                assert first["partitions_added"] == tenants == known, (first, known)
                assert first["run_requests"] == pending, first
                result["first"] = first
                ticks = [tick(defs, sensor, instance, resources) for _ in range(steady)]
                for t in ticks:
                    assert t["run_requests"] == pending and t["partitions_added"] == 0, t
                totals = [t["total_s"] for t in ticks]
                result["steady"] = ticks
                result["steady_median_s"] = statistics.median(totals)
                result["steady_worst_s"] = max(totals)
                if profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    tick(defs, sensor, instance, resources)
                    profiler.disable()
                    out = io.StringIO()
                    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
                    stats.print_stats(40)
                    result["profile"] = out.getvalue()
        finally:
            if previous is None:
                os.environ.pop("OML_PG_DSN", None)
            else:
                os.environ["OML_PG_DSN"] = previous
    result["load_after"] = _load()
    return result


def _line(r: dict) -> str:
    f = r["first"]
    return (
        f"{r['tenants']:>6} tenants / {r['pending']:>5} pending: first tick {f['total_s']:.3f} s"
        f" (evaluate {f['evaluate_s']:.3f} s + add {f['partitions_added']} partitions"
        f" {f['apply_partitions_s']:.3f} s); steady median {r['steady_median_s']:.3f} s, worst"
        f" {r['steady_worst_s']:.3f} s over {len(r['steady'])} ticks; load {r['load_before']}"
        f" -> {r['load_after']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=1_000)
    parser.add_argument("--baseline-tenants", type=int, default=100)
    parser.add_argument("--baseline-pending", type=int, default=10)
    parser.add_argument("--steady-ticks", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one more steady tick")
    parser.add_argument(
        "--dagster-storage",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="the Dagster instance's storage (postgres, as deployed, by default)",
    )
    parser.add_argument("--json", help="write the figures to this path")
    args = parser.parse_args()
    if args.pending > args.tenants or args.baseline_pending > args.baseline_tenants:
        parser.error("pending tenants must not outnumber tenants")

    print(machine())
    print(f"Dagster instance storage: {args.dagster_storage}")
    baseline = scenario(
        args.baseline_tenants, args.baseline_pending, args.steady_ticks, False, args.dagster_storage
    )
    print("baseline " + _line(baseline))
    target = scenario(
        args.tenants, args.pending, args.steady_ticks, args.profile, args.dagster_storage
    )
    print("target   " + _line(target))
    met = target["steady_worst_s"] <= TARGET_SECONDS
    print(
        f"target 3 (steady tick <= {TARGET_SECONDS:.0f} s at {args.tenants} tenants /"
        f" {args.pending} pending): {'met' if met else 'NOT met'}"
        f" (median {target['steady_median_s']:.3f} s, worst {target['steady_worst_s']:.3f} s)"
    )
    if target.get("profile"):
        print(target["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": machine(), "baseline": baseline, "target": target, "met": met},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
