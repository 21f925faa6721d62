"""Benchmark `oml-lake simulate`: write a workload at a given scale into a fresh PostgreSQL
database and print its throughput in outbox ops (rows) per second.

    .venv/bin/python bench/simulate_bench.py --tenants 20 --claims 2000 --writers 4
    .venv/bin/python bench/simulate_bench.py ... --append bench/RESULTS.md

The admin DSN (a database to create the fresh one from) comes from --admin-dsn, else
OML_BENCH_PG_DSN, else postgres@127.0.0.1:5432. The database is dropped afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
import uuid

import psycopg

from oml_dagster.lake import db
from oml_dagster.simulate import producer, verify
from oml_dagster.simulate.runner import RunConfig, RunReport, run
from oml_dagster.simulate.workload import WorkloadConfig

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _dsn_for(admin_dsn: str, database: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo(**info)


def machine() -> dict[str, str]:
    """nproc, RAM and CPU model of this host (Linux /proc; 'unknown' elsewhere)."""
    info = {
        "nproc": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"),
        "ram": "unknown",
        "cpu": platform.processor() or "unknown",
        "python": platform.python_version(),
    }
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    info["ram"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


HISTORY = "## History"


def add_to_history(path: str, section: str) -> None:
    """`section` into the results file at `path` as its newest dated section: at the top of its
    History (bench/RESULTS.md runs newest first), one heading level down; at the end of a file
    with no History; a new file when there is none."""
    if not os.path.exists(path):
        with open(path, "w") as out:
            out.write(f"# Benchmark results\n\n{section}\n")
        return
    with open(path) as f:
        text = f.read()
    at = text.find(f"\n{HISTORY}")
    if at < 0:
        with open(path, "a") as out:
            out.write(section + "\n")
        return
    first = text.find("\n### ", at + 1)
    cut = len(text) if first < 0 else first + 1
    nested = "\n".join(
        "#" + line if line.startswith("## ") else line for line in section.split("\n")
    )
    with open(path, "w") as out:
        out.write(text[:cut] + nested.rstrip("\n") + "\n\n" + text[cut:])


def markdown(
    report: RunReport,
    workload: WorkloadConfig,
    config: RunConfig,
    host: dict[str, str],
    server: str,
    db_bytes: int,
    verified: str,
) -> str:
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ops = ", ".join(f"{op} {n}" for op, n in sorted(report.ops.items()))
    return "\n".join(
        [
            f"## simulate — {today}",
            "",
            f"- machine: {host['nproc']} CPUs ({host['cpu']}), {host['ram']} RAM; "
            f"Python {host['python']}; {server}",
            f"- command: `bench/simulate_bench.py --tenants {workload.tenants} --claims "
            f"{workload.claims} --writers {config.writers} --batch {config.chunk} --seed "
            f"{workload.seed} --bad-ratio {workload.bad_ratio:g}`",
            f"- wrote {report.rows:,} outbox ops ({report.acts:,} acts, {report.claims:,} "
            f"claims) in {report.transactions:,} transactions, {report.elapsed:.1f} s",
            f"- **{report.ops_per_second:,.0f} ops/s** "
            f"({report.acts / report.elapsed:,.0f} acts/s); database size after: "
            f"{db_bytes / 2**20:,.0f} MiB",
            f"- concurrency: {report.early_xid} xid-before-lock pairs, {report.long_open} "
            f"long-open transactions, {report.late_commits} commits after a higher xid",
            f"- op mix: {ops}",
            f"- verification: {verified}",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--claims", type=int, default=2000, help="per tenant")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="acts per transaction")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bad-ratio", type=float, default=0.0)
    parser.add_argument("--admin-dsn", default=os.environ.get("OML_BENCH_PG_DSN"))
    parser.add_argument("--verify", action="store_true", help="verify every tenant afterwards")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--progress", action="store_true", help="progress bar on stderr")
    parser.add_argument(
        "--append", help="add a markdown results section to this file's history, newest first"
    )
    args = parser.parse_args(argv)

    admin_dsn = args.admin_dsn or DEFAULT_ADMIN_DSN
    name = f"oml_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = _dsn_for(admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            db.upgrade(conn)
            producer.ensure_schema(conn)
            server = conn.execute("SELECT version()").fetchone()[0].split(" on ")[0]
        workload = WorkloadConfig(args.tenants, args.claims, args.seed, args.bad_ratio)
        config = RunConfig(writers=args.writers, acts_per_tx=args.batch, progress=args.progress)
        report = run(dsn, workload, config)
        print(
            f"{report.rows:,} ops ({report.acts:,} acts) in {report.elapsed:.2f} s: "
            f"{report.ops_per_second:,.0f} ops/s, {report.acts / report.elapsed:,.0f} acts/s "
            f"({args.tenants} tenants x {args.claims} claims, {args.writers} writers, "
            f"batch {config.chunk})",
            flush=True,
        )
        verified = "not run"
        with psycopg.connect(dsn, autocommit=True) as conn:
            db_bytes = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            if args.verify:
                started = time.monotonic()
                results = verify.verify(conn, report.tenants)
                failed = [r for r in results if not r.ok]
                verified = (
                    f"{len(results) - len(failed)}/{len(results)} tenants ok "
                    f"({sum(r.events for r in results):,} chained events) in "
                    f"{time.monotonic() - started:.1f} s"
                )
                print(f"verify: {verified}")
                for result in failed:
                    print(result.summary(), *result.errors[:5], sep="\n  ")
        host = machine()
        section = markdown(report, workload, config, host, server, db_bytes, verified)
        print(section)
        if args.append:
            add_to_history(args.append, section)
    finally:
        if not args.keep:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            print(f"kept database {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
