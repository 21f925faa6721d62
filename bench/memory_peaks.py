"""Peak memory of the heaviest operations, each in a process of its own, checked against the pinned
peaks (`bench/memory_peaks.json`): a delta-rs (or any) upgrade that grows one past its pin plus
the tolerance makes this benchmark exit 1, naming it. The run containers' memory limits
(compose, Helm) are set from these peaks plus a margin (deploy/README "Size").

    .venv/bin/python bench/memory_peaks.py                 # every operation, checked (~20 min)
    .venv/bin/python bench/memory_peaks.py --only drain_1m compact_1m
    .venv/bin/python bench/memory_peaks.py --pin           # write this run's peaks as the pins
    .venv/bin/python bench/memory_peaks.py --quick         # 100k-op backlog, 500k-row silver

Operations, each the real command in a child process, its peak the kernel's own count of the
child's highest resident memory (`wait4`'s ru_maxrss, which nothing sampled can miss):
  drain_1m    `oml-lake drain --until-idle` of one tenant's backlog of about 1M ops
              (`oml-lake simulate --tenants 1 --claims 160000`), the default batch settings and
              memory budget (OML_MEMORY_BUDGET_MIB 960);
  compact_1m  `oml-lake maintain compact` of that tenant's tables afterwards;
  zorder_5m   `oml-lake maintain zorder` of a tenant whose silver holds 5M claims (256-byte
              bodies, written unsorted in appends of 50,000, as bench/retract_bench.py builds it);
  demote_5m   `oml-lake drain --tenant T` of 10 `claim.demote` ops of random claims of that
              silver (the retract MERGE);
  erase_5m    the same with 10 `claim.erase` ops.
Memory peaks do not depend on the machine's load (other engineers' work here), times do: times
are printed, not checked.
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import fresh_database, machine  # noqa: E402
from retract_bench import area_ids, claim_rows  # noqa: E402

from oml_dagster.lake.ingest import sequencer  # noqa: E402
from oml_dagster.lake.model.tables import CORE_TABLES, SILVER_CLAIMS, writer_properties  # noqa: E402
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND  # noqa: E402
from oml_dagster.lake.store.layout import Lake  # noqa: E402
from oml_dagster.simulate import producer  # noqa: E402

PINS = Path(__file__).resolve().parent / "memory_peaks.json"
OPERATIONS = ("drain_1m", "compact_1m", "zorder_5m", "demote_5m", "erase_5m")
TOLERANCE = 0.15  # a peak may pass its pin by this share before the benchmark fails
RETRACT_CLAIMS = 10
MIB = 1024 * 1024


def peak_of(cmd: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """Run `cmd`; (its peak resident memory in MiB, seconds, the tail of its output). Exits the
    benchmark when the command fails: a peak of a failed run says nothing."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        tail = out.read()[-1500:]
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}:\n{tail}")
    return usage.ru_maxrss // 1024, seconds, tail  # ru_maxrss is in KiB on Linux


def oml_lake(*args: str) -> list[str]:
    return [sys.executable, "-m", "oml_dagster.cli", *args]


def backlog_ops(args: argparse.Namespace) -> dict:
    """drain_1m and compact_1m: one tenant's backlog drained, then its tables compacted."""
    found: dict = {}
    with fresh_database("oml_memory") as dsn, tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": os.path.join(tmp, "oml-lake")}
        for name in ("OML_MAX_BATCH", "OML_MEMORY_BUDGET_MIB", "OML_TXN_LAG_LIMIT"):
            env.pop(name, None)  # the defaults, as a deployment runs them
        started = time.perf_counter()
        subprocess.run(
            oml_lake("simulate", "--tenants", "1", "--claims", str(args.claims), "--seed", "1",
                     "--no-progress"),
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        with psycopg.connect(dsn) as conn:
            ops = conn.execute("SELECT count(*) FROM oml.outbox").fetchone()[0]
        print(f"backlog: {ops:,} ops written in {time.perf_counter() - started:.0f} s", flush=True)
        if "drain_1m" in args.only:
            peak, seconds, _ = peak_of(oml_lake("drain", "--until-idle"), env)
            found["drain_1m"] = {"peak_mib": peak, "seconds": round(seconds, 1), "ops": ops}
            report("drain_1m", found["drain_1m"])
        else:
            subprocess.run(
                oml_lake("drain", "--until-idle"), env=env, check=True, capture_output=True
            )
        if "compact_1m" in args.only:
            peak, seconds, _ = peak_of(oml_lake("maintain", "compact"), env)
            found["compact_1m"] = {"peak_mib": peak, "seconds": round(seconds, 1)}
            report("compact_1m", found["compact_1m"])
    return found


def build_silver(conn: psycopg.Connection, lake: Lake, tenant_id: str, rows: int) -> list[str]:
    """The tenant's core tables, silver with `rows` promoted claims written unsorted (the
    Z-order is one of the operations measured); returns the claims' artifact ids."""
    rng = random.Random(1)
    areas = area_ids("random")
    bound = int(DEFAULT_ERASURE_BOUND.total_seconds())
    for spec in CORE_TABLES:
        if spec is not SILVER_CLAIMS:
            write_deltalake(
                lake.table_uri(tenant_id, spec),
                spec.schema.empty_table(),
                mode="error",
                partition_by=list(spec.partition_by) or None,
                configuration=spec.configuration(bound),
                writer_properties=writer_properties(spec),
            )
    uri = lake.table_uri(tenant_id, SILVER_CLAIMS)
    artifacts: list[str] = []
    chunk = 50_000
    for start in range(0, rows, chunk):
        data, ids = claim_rows(tenant_id, start + 1, min(chunk, rows - start), rng, 256, areas)
        artifacts += ids
        write_deltalake(
            uri,
            data,
            mode="error" if start == 0 else "append",
            configuration=SILVER_CLAIMS.configuration(bound) if start == 0 else None,
            writer_properties=writer_properties(SILVER_CLAIMS),
        )
    # The writer's txn version on silver: the retract ops below come after the claims' seqs.
    return artifacts


def enqueue(conn: psycopg.Connection, tenant_id: str, op: str, claims: list[str], first: int):
    at = producer.instant(dt.datetime(2026, 11, 2, tzinfo=dt.UTC))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
            [
                (tenant_id, first + i, op, json.dumps({"artifact_id": a, "version": 1, "at": at}))
                for i, a in enumerate(claims)
            ],
        )
    sequencer.sequence(conn)


def silver_ops(args: argparse.Namespace) -> dict:
    """zorder_5m, demote_5m, erase_5m on a tenant whose silver holds `args.rows` claims."""
    found: dict = {}
    with (
        fresh_database("oml_memory") as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        lake = Lake(os.path.join(tmp, "oml-lake"))
        env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
        for name in ("OML_MAX_BATCH", "OML_MEMORY_BUDGET_MIB", "OML_TXN_LAG_LIMIT"):
            env.pop(name, None)
        keys = producer.create_tenant(conn)
        started = time.perf_counter()
        artifacts = build_silver(conn, lake, keys.tenant_id, args.rows)
        print(f"silver: {args.rows:,} claims written in {time.perf_counter() - started:.0f} s",
              flush=True)  # fmt: skip
        # Z-ordered (as the weekly schedule leaves it) before the retracts, measured or not.
        peak, seconds, _ = peak_of(oml_lake("maintain", "zorder", "--tenant", keys.tenant_id), env)
        if "zorder_5m" in args.only:
            found["zorder_5m"] = {"peak_mib": peak, "seconds": round(seconds, 1)}
            report("zorder_5m", found["zorder_5m"])
        picked = random.Random(2).sample(artifacts, 2 * RETRACT_CLAIMS)
        for name, op, claims, first in (
            ("demote_5m", "claim.demote", picked[:RETRACT_CLAIMS], 1),
            ("erase_5m", "claim.erase", picked[RETRACT_CLAIMS:], 1 + RETRACT_CLAIMS),
        ):
            enqueue(conn, keys.tenant_id, op, claims, first)
            peak, seconds, tail = peak_of(oml_lake("drain", "--tenant", keys.tenant_id), env)
            if f"silver.claims: committed {RETRACT_CLAIMS} rows" not in tail:
                raise SystemExit(f"{name}: the retract batch did not apply:\n{tail}")
            if name in args.only:
                found[name] = {"peak_mib": peak, "seconds": round(seconds, 1)}
                report(name, found[name])
    return found


def report(name: str, figures: dict) -> None:
    print(f"{name}: peak {figures['peak_mib']:,} MiB in {figures['seconds']} s", flush=True)


def check(found: dict, pins: dict) -> list[str]:
    """The operations whose peak passed its pin by more than the tolerance."""
    grown = []
    for name, figures in found.items():
        pin = pins.get("peaks_mib", {}).get(name)
        if pin is None:
            continue
        allowed = pin * (1 + pins.get("tolerance", TOLERANCE))
        verdict = "ok" if figures["peak_mib"] <= allowed else "GROWN"
        print(f"  {name}: {figures['peak_mib']:,} MiB against the pin {pin:,} "
              f"(allowed {allowed:,.0f}): {verdict}")  # fmt: skip
        if verdict != "ok":
            grown.append(name)
    return grown


def pin(found: dict, source: str) -> None:
    """Write `found`'s peaks as the pins (the operations it lacks keep theirs)."""
    pins = json.loads(PINS.read_text()) if PINS.exists() else {}
    peaks = {**pins.get("peaks_mib", {}), **{n: f["peak_mib"] for n, f in found.items()}}
    pins = {
        "tolerance": pins.get("tolerance", TOLERANCE),
        "measured": f"{dt.datetime.now(dt.UTC):%Y-%m-%d}, bench/memory_peaks.py, {source}",
        "peaks_mib": peaks,
    }
    PINS.write_text(json.dumps(pins, indent=2) + "\n")
    print(f"pinned: {PINS}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=OPERATIONS, default=list(OPERATIONS))
    parser.add_argument("--claims", type=int, default=160_000, help="the backlog's claims")
    parser.add_argument("--rows", type=int, default=5_000_000, help="silver's claims")
    parser.add_argument("--quick", action="store_true", help="a 100k-op backlog, 500k rows")
    parser.add_argument("--pin", action="store_true", help="write this run's peaks as the pins")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--pin-from", help="pin the peaks of an earlier run's --json file (nothing is measured)"
    )
    args = parser.parse_args()
    if args.pin_from:
        pin(json.loads(Path(args.pin_from).read_text()), f"from {Path(args.pin_from).name}")
        return 0
    if args.quick:
        args.claims, args.rows = 16_000, 500_000
    print(f"memory peaks, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {machine()}", flush=True)
    found: dict = {}
    if {"drain_1m", "compact_1m"} & set(args.only):
        found.update(backlog_ops(args))
    if {"zorder_5m", "demote_5m", "erase_5m"} & set(args.only):
        found.update(silver_ops(args))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    pins = json.loads(PINS.read_text()) if PINS.exists() else {}
    if args.pin:
        if args.quick:
            raise SystemExit("--pin takes the full sizes, not --quick")
        pin(found, "by this run")
        return 0
    if args.quick:
        print("--quick: smaller sizes, not checked against the pins")
        return 0
    grown = check(found, pins)
    if grown:
        print(f"FAILED: peak memory grew past its pin: {', '.join(grown)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
