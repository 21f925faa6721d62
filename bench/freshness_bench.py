"""`lake_freshness_sensor` at scale: N tenants known, P of them lagging past the bound.

The database is shaped as in `sensor_bench.py` (N tenants by SQL, P with unsequenced outbox
rows), the P tenants' rows made an hour old. Dagster's storage is Postgres, as deployed. Timed:

- the first two ticks (the P lagging tenants and a page of never-judged partitions, then the
  next page), each with its one lake_freshness_job run, executed in process;
- a tick after the P tenants' lag has doubled (each reported again, one run);
- a tick with nothing to report (no page: every partition taken as judged), no run.

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
            # The first ticks: the lagging tenants and a page of never-judged partitions each.
            for phase in ("first", "second"):
                cursor, row = tick(defs, instance, resources, cursor)
                out["ticks"].append({"phase": phase, **row})
            # The lagging tenants' lag doubles: each is reported again (plus the next page).
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE oml.outbox SET created_at = created_at - interval '2 hours'")
            cursor, row = tick(defs, instance, resources, cursor)
            out["ticks"].append({"phase": "doubled", **row})
            # Every partition judged once (the pages skipped): a tick with nothing to say.
            cursor = json.dumps({**json.loads(cursor), "partitions": None})
            freshness.NEW_PER_TICK, pages = 0, freshness.NEW_PER_TICK
            cursor, row = tick(defs, instance, resources, cursor)
            out["ticks"].append({"phase": "quiet (no page)", **row})
            freshness.NEW_PER_TICK = pages
        for row in out["ticks"]:
            if row["tenants_judged"]:
                row["run_ms_per_tenant"] = round(1000 * row["run_s"] / row["tenants_judged"], 1)
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
