"""`lake_freshness_sensor` at scale: N tenants known, P of them lagging past the bound.

The database is shaped as in `sensor_bench.py` (N tenants by SQL, P with unsequenced outbox
rows), the P tenants' rows made an hour old. Dagster's storage is Postgres, as deployed. Timed:

- the first ticks, until every partition has been judged once (pages of NEW_PER_TICK), each with
  its one lake_freshness_job run, executed in process;
- a steady tick: P tenants past the bound, reported again (one run for all P);
- the tick after they recover (one run reporting P passes) and a quiet tick (no run).

    .venv/bin/python bench/freshness_bench.py --tenants 10000 --lagging 1000
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import psycopg
from dagster import build_sensor_context

try:
    from bench._support import fresh_database
    from bench.sensor_bench import dagster_instance, populate
except ImportError:  # run as a script
    from _support import fresh_database
    from sensor_bench import dagster_instance, populate

warnings.filterwarnings("ignore", message="Starting in dagster 1.11, get_sensor_def")


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def tick(defs, instance, resources, cursor):
    started = time.perf_counter()
    with build_sensor_context(
        instance_ref=instance.get_ref(), definitions=defs, resources=resources, cursor=cursor
    ) as context:
        data = defs.get_sensor_def("lake_freshness_sensor").evaluate_tick(context)
    evaluated = time.perf_counter()
    judged = 0
    for request in data.run_requests:
        judged += len(request.run_config["ops"]["report_freshness"]["config"]["tenants"])
        result = defs.resolve_job_def("lake_freshness_job").execute_in_process(
            run_config=request.run_config, instance=instance
        )
        assert result.success
    done = time.perf_counter()
    return data.cursor, {
        "sensor_s": round(evaluated - started, 3),
        "run_s": round(done - evaluated, 3),
        "runs": len(data.run_requests),
        "tenants_judged": judged,
        "load": _load(),
    }


def scenario(tenants: int, lagging: int) -> dict:
    from oml_dagster.definitions import defs
    from oml_dagster.defs import freshness
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
    from oml_dagster.defs.resources import build_resources

    out: dict = {"tenants": tenants, "lagging": lagging, "load_before": _load(), "ticks": []}
    with fresh_database("oml_fresh_bench") as dsn:
        os.environ["OML_PG_DSN"] = dsn
        populate(dsn, tenants, lagging)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE oml.outbox SET created_at = now() - interval '1 hour'")
            ids = [t for (t,) in conn.execute("SELECT tenant_id::text FROM oml.tenant_policy")]
        with (
            fresh_database("oml_fresh_bench_dagster") as dagster_dsn,
            dagster_instance("postgres", dagster_dsn) as instance,
        ):
            instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, ids)
            resources = build_resources()
            cursor = None
            pages = -(-tenants // freshness.NEW_PER_TICK)
            for phase in [f"first {i + 1}/{pages}" for i in range(pages)] + ["steady"]:
                cursor, row = tick(defs, instance, resources, cursor)
                out["ticks"].append({"phase": phase, **row})
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE oml.outbox SET created_at = now()")
            for phase in ("recovered", "quiet"):
                cursor, row = tick(defs, instance, resources, cursor)
                out["ticks"].append({"phase": phase, **row})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--lagging", type=int, default=1_000)
    args = parser.parse_args()
    for tenants, lagging in ((100, 10), (args.tenants, args.lagging)):
        print(json.dumps(scenario(tenants, lagging)))


if __name__ == "__main__":
    main()
