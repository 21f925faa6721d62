"""The fault run (issue 30's targets, ADR 0045): `oml-lake drain --until-idle` as a user runs it,
under each fault production brings, many times, and what came of each try.

    python bench/fault_run.py [--tries 10] [--json bench/results/fault_run.json]

Scenarios, each on a fresh workload (3 tenants, a mixed lifecycle) and a fresh lake:
- `pg-immediate`, `pg-fast`: a private PostgreSQL cluster restarted twice mid-drain;
- `pg-terminate`: every session of the drain's database terminated 4 times mid-drain;
- `s3-10`, `s3-20`: moto behind the fault proxy failing 10 % / 20 % of requests (SlowDown, 500,
  resets before and after the request took effect, cut bodies, 2-5 s delays);
- `disk-full`: a lake on a 256 KiB tmpfs, then grown and drained again.
For each try: the exit code, seconds, whether the lake equals a fault-free drain's, and whether a
non-zero exit said exactly one line. Everything listens on 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg

import oml_dagster  # noqa: F401  (delta-rs's allocator set up as in the product)
from oml_dagster.lake import db
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import producer

if __package__ is None or __package__ == "":  # run as a script: the repository's root first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oml_testbed.fault_proxy import FaultProxy  # noqa: E402
from oml_testbed.pg_cluster import private_cluster  # noqa: E402
from oml_testbed.s3_server import lake_env, moto_server, new_bucket, store_options  # noqa: E402
from oml_testbed.workloads import lake_snapshot, mixed_workload  # noqa: E402

DRAIN = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle", "--max-batch", "100"]


def _database(cluster, tag: str) -> tuple[str, list]:
    dsn = cluster.create_database(f"oml_fault_{tag}_{uuid.uuid4().hex[:6]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        db.upgrade(conn)
        producer.ensure_schema(conn)
        tenants = [producer.create_tenant(conn) for _ in range(3)]
        for keys in tenants:
            mixed_workload(conn, keys, claims=30)
    return dsn, tenants


def _exact(dsn: str, lake: Lake, tenants) -> bool:
    reference = Lake(lake.root.rstrip("/") + "-reference", lake.storage_options)
    with psycopg.connect(dsn, autocommit=True) as conn:
        drain(conn, reference, [t.tenant_id for t in tenants], policy=DrainPolicy(until_idle=True))
    return all(
        lake_snapshot(lake, t.tenant_id) == lake_snapshot(reference, t.tenant_id) for t in tenants
    )


def _one_line(stderr: str) -> bool:
    lines = [x for x in stderr.splitlines() if "retrying in" not in x]
    return len(lines) == 1 and lines[0].startswith("oml-lake: ") and "Traceback" not in stderr


def _run(env: dict, during=None) -> tuple[int, float, str]:
    started = time.monotonic()
    proc = subprocess.Popen(
        DRAIN, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    fault = None
    if during is not None:
        fault = threading.Thread(target=during, args=(proc,), daemon=True)
        fault.start()
    _, err = proc.communicate(timeout=900)
    if fault is not None:
        # The fault ends with the drain: the check after it must not meet it (a session killed
        # under the reference drain is the benchmark's own fault, not the writer's).
        fault.join(60)
    return proc.returncode, time.monotonic() - started, err


def _env(dsn: str, **more: str) -> dict:
    return {**os.environ, "OML_PG_DSN": dsn, **more}


def scenario_pg(cluster, mode: str, root: Path) -> dict:
    dsn, tenants = _database(cluster, mode.replace("-", "_"))
    lake = Lake(str(root / "oml-lake"))

    def restart(proc):
        for pause in (0.8, 1.2):
            time.sleep(pause)
            if proc.poll() is not None:
                return
            if mode == "terminate":
                for _ in range(2):
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    time.sleep(0.3)
            else:
                cluster.restart(mode)

    code, seconds, err = _run(_env(dsn, OML_LAKE_URI=lake.root), restart)
    return _outcome(code, seconds, err, dsn, lake, tenants)


def scenario_s3(cluster, moto: str, rate: float, seed: int) -> dict:
    dsn, tenants = _database(cluster, f"s3_{int(rate * 100)}")
    bucket = new_bucket(moto, "oml-fault")
    rng = random.Random(seed)
    with FaultProxy(moto, rate=rate, seed=seed, delay_seconds=rng.uniform(2, 5)) as proxy:
        code, seconds, err = _run(_env(dsn, **lake_env(proxy.endpoint, bucket)))
        injected = dict(proxy.injected)
    lake = Lake(f"s3://{bucket}/oml-lake", store_options(moto))
    result = _outcome(code, seconds, err, dsn, lake, tenants)
    result["injected"] = injected
    return result


def scenario_disk_full(cluster, root: Path) -> dict:
    dsn, tenants = _database(cluster, "disk")
    volume = root / "volume"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256K", "tmpfs", str(volume)], check=True)
    try:
        lake = Lake(str(volume / "oml-lake"))
        code, seconds, err = _run(_env(dsn, OML_LAKE_URI=lake.root))
        subprocess.run(["mount", "-o", "remount,size=256M", str(volume)], check=True)
        again, more, err2 = _run(_env(dsn, OML_LAKE_URI=lake.root))
        result = _outcome(code, seconds, err, dsn, lake, tenants)
        result.update(after_space_exit=again, after_space_seconds=round(more, 1))
        result["exact"] = again == 0 and result["exact"]
        return result
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


def _outcome(code, seconds, err, dsn, lake, tenants) -> dict:
    return {
        "exit": code,
        "seconds": round(seconds, 1),
        "retries": err.count("retrying in"),
        "one_line": code == 0 or _one_line(err),
        "last_line": (err.strip().splitlines() or [""])[-1][:300],
        "exact": _exact(dsn, lake, tenants),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10, help="tries of each PostgreSQL scenario")
    parser.add_argument("--s3-tries", type=int, default=5, help="tries of each S3 scenario")
    parser.add_argument("--only", action="append", help="scenario names to run (repeatable)")
    parser.add_argument("--json", default="bench/results/fault_run.json")
    args = parser.parse_args()
    wanted = set(
        args.only or ["pg-immediate", "pg-fast", "pg-terminate", "s3-10", "s3-20", "disk-full"]
    )
    results: dict[str, list[dict]] = {}
    import tempfile

    with private_cluster() as cluster, moto_server() as moto:
        for name in ["pg-immediate", "pg-fast", "pg-terminate", "s3-10", "s3-20", "disk-full"]:
            if name not in wanted:
                continue
            tries = {"disk-full": 1, "s3-10": args.s3_tries, "s3-20": args.s3_tries}.get(
                name, args.tries
            )
            for k in range(tries):
                with tempfile.TemporaryDirectory() as tmp:
                    if name.startswith("pg-"):
                        outcome = scenario_pg(cluster, name[3:], Path(tmp))
                    elif name.startswith("s3-"):
                        outcome = scenario_s3(cluster, moto, int(name[3:]) / 100, seed=k)
                    else:
                        outcome = scenario_disk_full(cluster, Path(tmp))
                results.setdefault(name, []).append(outcome)
                print(name, k, json.dumps(outcome), flush=True)
    summary = {
        name: {
            "tries": len(runs),
            "finished_exit_0": sum(r["exit"] == 0 for r in runs),
            "exact": sum(r["exact"] for r in runs),
            "one_line_on_failure": sum(r["one_line"] for r in runs),
            "median_seconds": sorted(r["seconds"] for r in runs)[len(runs) // 2],
        }
        for name, runs in results.items()
    }
    report = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "summary": summary,
        "runs": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    for name, s in summary.items():
        print(f"{name}: {s}")


if __name__ == "__main__":
    main()
