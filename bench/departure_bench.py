"""A tenant's departure, timed: one simulated tenant drained into a local lake (the baseline:
its drain), then its export (beside a plain copy of its prefix's files, the other baseline),
the export's verification, and its purge after departure.

    .venv/bin/python bench/departure_bench.py                  # 5,000 claims
    .venv/bin/python bench/departure_bench.py --claims 20000

Prints one JSON object (and writes it with `--out`): ops, lake objects and bytes, and the
seconds of each step.
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import json
import os
import shutil
import tempfile
import time

import psycopg

from oml_dagster.lake.audit import export, purge
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import acts, producer
from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

try:
    from bench._support import fresh_database, machine
except ImportError:  # run as a script
    from _support import fresh_database, machine


def tree_size(path: str) -> tuple[int, int]:
    files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
    return len(files), sum(os.path.getsize(f) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    figures: dict = {"machine": machine(), "claims": args.claims}
    with fresh_database("oml_bench_departure") as dsn, tempfile.TemporaryDirectory() as tmp:
        report = run(dsn, WorkloadConfig(1, args.claims, args.seed, 0.0), RunConfig(writers=2))
        (tenant_id,) = report.tenants
        figures["ops"] = sum(report.ops.values())
        lake = Lake(os.path.join(tmp, "oml-lake"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            drain(conn, lake, policy=DrainPolicy(until_idle=True))
            figures["drain_seconds"] = time.perf_counter() - started
            prefix = lake.tenant_uri(tenant_id)
            figures["lake_objects"], figures["lake_bytes"] = tree_size(prefix)

            started = time.perf_counter()
            shutil.copytree(prefix, os.path.join(tmp, "raw-copy"))
            figures["raw_copy_seconds"] = time.perf_counter() - started

            target = Lake(os.path.join(tmp, "export"))
            started = time.perf_counter()
            result = export.export_tenant(conn, lake, tenant_id, target)
            figures["export_seconds"] = time.perf_counter() - started
            figures["export_objects"], figures["export_bytes"] = tree_size(target.root)
            figures["export_rows"] = {t["name"]: t["rows"] for t in result.manifest["tables"]}

            started = time.perf_counter()
            check = export.verify_export(target)
            figures["verify_seconds"] = time.perf_counter() - started
            assert check.ok, check.findings

            acts.depart(conn, producer.load_tenant(conn, tenant_id))
            started = time.perf_counter()
            made = purge.purge_tenant(conn, lake, tenant_id, by="bench")
            figures["purge_seconds"] = time.perf_counter() - started
            figures["purged_objects"] = made["objects"]
            assert made["listing_after"] == []
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
