"""Retract cost against table size: for each size N, a tenant's silver.claims holds N promoted
claims (written with `write_deltalake` in the table's schema and properties, in appends of
`--chunk` rows), Z-ordered by the product's maintenance (`maintenance.zorder`, as a scheduled
run does); then rounds of 10 `claim.demote` or 10 `claim.erase` ops of random claims go into
the outbox and one `drain_tenant` batch applies each: the fetch, the fold and the silver MERGE
the drain runs for every retract.

    .venv/bin/python bench/retract_bench.py                      # 100k and 1M rows
    .venv/bin/python bench/retract_bench.py --sizes 100000 1000000 5000000
    .venv/bin/python bench/retract_bench.py --sizes 20000 100000 --rounds 2   # quick

Workarea ids are random UUIDs, as the product's are (`--area-ids counted` writes the ids
this benchmark used before 4 Dec, UUID(1) to UUID(50): they differ only in their last
characters, which delta-rs's Z-order key (the first 16 bytes of a value) never sees, so the
Z-order clustered by artifact_id alone and looked better than real ids allow).

Per size: the drain batch time (median over the rounds of each kind), the MERGE's own
execution time and the files it rewrote, from the Delta commit's operationMetrics, against
the claims it touched. The ratio t(largest)/t(smallest) is the figure (target: at most 1.5x);
files rewritten should not exceed claims touched.
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import random
import statistics
import tempfile
import time
import uuid

import psycopg
import pyarrow as pa
from deltalake import write_deltalake

from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import (
    CORE_TABLES,
    SILVER_CLAIMS,
    TIMESTAMP,
    TableId,
    writer_properties,
)
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
from oml_dagster.lake.store import maintenance
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import query
from oml_dagster.lake.store.sql import sql_in
from oml_dagster.lake.write.writer import drain_tenant
from oml_dagster.simulate import producer

try:
    from bench._support import fresh_database, machine
except ImportError:  # run as a script
    from _support import fresh_database, machine

CLAIMS_PER_ROUND = 10
WORKAREAS = 50


def area_ids(kind: str) -> list[str]:
    """The tenant's WORKAREAS workarea ids: random UUIDs (seeded), or counted ones."""
    if kind == "counted":
        return [str(uuid.UUID(int=1 + i, version=4)) for i in range(WORKAREAS)]
    rng = random.Random("workareas")
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(WORKAREAS)]


def claim_rows(
    tenant_id: str, start: int, n: int, rng: random.Random, body_bytes: int, areas: list[str]
):
    """`n` promoted silver rows in the table's schema, in `areas`; returns the table and its
    artifact ids."""
    artifacts = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    area_of = [rng.randrange(WORKAREAS) for _ in range(n)]
    body = os.urandom(body_bytes * n)
    at = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    seqs = range(start, start + n)
    columns = {
        "tenant_id": pa.array([tenant_id] * n),
        "artifact_id": pa.array(artifacts),
        "version": pa.array([1] * n, pa.int64()),
        "claim_key": pa.array([f"claim-{s}" for s in seqs]),
        "kind": pa.array(["note"] * n),
        "state": pa.array(["promoted"] * n),
        "workarea_id": pa.array([areas[a] for a in area_of]),
        "workarea_path_at_write": pa.array([f"root.a{a}" for a in area_of]),
        "writer_identity": pa.array(["bench-writer"] * n),
        "principal": pa.array(["bench"] * n),
        "producer": pa.nulls(n, pa.string()),
        "provenance": pa.array(["agent"] * n),
        "simulation_id": pa.nulls(n, pa.string()),
        "sim_derived_ids": pa.nulls(n, SILVER_CLAIMS.schema.field("sim_derived_ids").type),
        "plaintext_digest": pa.array([os.urandom(32).hex() for _ in range(n)]),
        "ciphertext_digest": pa.array([os.urandom(32).hex() for _ in range(n)]),
        "body_ciphertext": pa.array(
            [body[i * body_bytes : (i + 1) * body_bytes] for i in range(n)], pa.binary()
        ),
        "body_ref": pa.array(["lake"] * n),
        "attachments": pa.nulls(n, SILVER_CLAIMS.schema.field("attachments").type),
        "created_at": pa.array([at] * n, TIMESTAMP),
        "promoted_at": pa.array([at] * n, TIMESTAMP),
        "retracted_at": pa.nulls(n, TIMESTAMP),
        "applied_seq": pa.array(list(seqs), pa.int64()),
        "fold_seq": pa.nulls(n, pa.int64()),
    }
    return pa.table(columns, schema=SILVER_CLAIMS.schema), artifacts


def build_lake(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    n: int,
    chunk: int,
    body_bytes: int,
    seed: int,
    areas: list[str],
):
    """The tenant's core tables: silver with `n` claims, Z-ordered; the others empty."""
    rng = random.Random(seed)
    configuration_for = {
        spec.name: spec.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
        for spec in CORE_TABLES
    }
    for spec in CORE_TABLES:
        if spec is not SILVER_CLAIMS:
            write_deltalake(
                lake.table_uri(tenant_id, spec),
                spec.schema.empty_table(),
                mode="error",
                partition_by=list(spec.partition_by) or None,
                configuration=configuration_for[spec.name],
                writer_properties=writer_properties(spec),
            )
    uri = lake.table_uri(tenant_id, SILVER_CLAIMS)
    artifacts: list[str] = []
    for start in range(0, n, chunk):
        data, ids = claim_rows(tenant_id, start + 1, min(chunk, n - start), rng, body_bytes, areas)
        artifacts += ids
        write_deltalake(
            uri,
            data,
            mode="error" if start == 0 else "append",
            configuration=configuration_for[SILVER_CLAIMS.name] if start == 0 else None,
            writer_properties=writer_properties(SILVER_CLAIMS),
        )
    started = time.perf_counter()
    (zordered,) = [
        r for r in maintenance.zorder(conn, lake, tenant_id) if r.table == SILVER_CLAIMS.name
    ]
    return artifacts, zordered, time.perf_counter() - started


def retract_round(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    op: str,
    artifacts: list[str],
    journal_seq: int,
    profile: cProfile.Profile | None = None,
) -> dict:
    """Enqueue one retract op per artifact, sequence them, and time the drain batch."""
    at = producer.instant(dt.datetime(2026, 11, 2, tzinfo=dt.UTC))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
            [
                (
                    tenant_id,
                    journal_seq + i,
                    op,
                    json.dumps({"artifact_id": a, "version": 1, "at": at}),
                )
                for i, a in enumerate(artifacts)
            ],
        )
    sequencer.sequence(conn)
    if profile is not None:
        profile.enable()
    started = time.perf_counter()
    result = drain_tenant(conn, lake, tenant_id)
    elapsed = time.perf_counter() - started
    if profile is not None:
        profile.disable()
    silver = result.outcome(TableId(SILVER_CLAIMS.name))
    if result.refused or silver is None or silver.action != "committed":
        raise SystemExit(f"retract round did not apply: {result}")
    table = lake.open(lake.table_uri(tenant_id, SILVER_CLAIMS))
    commit = table.history(1)[0]
    metrics = commit.get("operationMetrics") or {}
    states = set(
        query(table, "state", sql_in("artifact_id", artifacts)).column("state").to_pylist()
    )
    expected = {"claim.demote": "demoted", "claim.erase": "erased"}[op]
    if states != {expected}:
        raise SystemExit(f"{op}: rows read back as {states}")
    return {
        "op": op,
        "claims": len(artifacts),
        "drain_s": elapsed,
        "merge_ms": metrics.get("execution_time_ms"),
        "scan_ms": metrics.get("scan_time_ms"),
        "rewrite_ms": metrics.get("rewrite_time_ms"),
        "files_removed": metrics.get("num_target_files_removed"),
        "files_added": metrics.get("num_target_files_added"),
        "rows_updated": metrics.get("num_target_rows_updated"),
        "rows_copied": metrics.get("num_target_rows_copied"),
        "ops_folded": result.ops_folded,
        "operation": commit.get("operation"),
    }


def bench_size(n: int, args: argparse.Namespace, profile: bool) -> dict:
    with (
        fresh_database() as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        keys = producer.create_tenant(conn)
        lake = Lake(os.path.join(tmp, "oml-lake"))
        started = time.perf_counter()
        artifacts, zordered, zorder_s = build_lake(
            conn,
            lake,
            keys.tenant_id,
            n,
            args.chunk,
            args.body_bytes,
            args.seed,
            area_ids(args.area_ids),
        )
        built = time.perf_counter() - started
        table = lake.open(lake.table_uri(keys.tenant_id, SILVER_CLAIMS))
        files = len(table.file_uris())
        rng = random.Random(args.seed + 1)
        picked = rng.sample(artifacts, 2 * args.rounds * CLAIMS_PER_ROUND)
        profiler = cProfile.Profile() if profile else None
        rounds = []
        journal_seq = 1
        for r in range(2 * args.rounds):
            op = ("claim.demote", "claim.erase")[r % 2]
            claims = picked[r * CLAIMS_PER_ROUND : (r + 1) * CLAIMS_PER_ROUND]
            last = r == 2 * args.rounds - 1
            rounds.append(
                retract_round(
                    conn,
                    lake,
                    keys.tenant_id,
                    op,
                    claims,
                    journal_seq,
                    profiler if last else None,
                )
            )
            journal_seq += CLAIMS_PER_ROUND
        load = os.getloadavg()[0]
    out = {
        "rows": n,
        "build_s": round(built, 1),
        "zorder_s": round(zorder_s, 1),
        "zorder": zordered.describe(),
        "files_after_zorder": files,
        "load_1m": load,
        "rounds": rounds,
    }
    for op in ("claim.demote", "claim.erase"):
        mine = [r for r in rounds if r["op"] == op]
        out[op] = {
            "drain_median_s": statistics.median(r["drain_s"] for r in mine),
            "merge_median_ms": statistics.median(r["merge_ms"] or 0 for r in mine),
            "files_removed_max": max(r["files_removed"] or 0 for r in mine),
        }
    out["drain_median_s"] = statistics.median(r["drain_s"] for r in rounds)
    out["merge_median_ms"] = statistics.median(r["merge_ms"] or 0 for r in rounds)
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        out["profile"] = text.getvalue()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each of demote, erase")
    parser.add_argument("--chunk", type=int, default=50_000, help="rows per building append")
    parser.add_argument("--body-bytes", type=int, default=256, help="ciphertext per claim")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--area-ids", choices=("random", "counted"), default="random", help="workarea ids"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the last round")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    results = []
    for n in sizes:
        results.append(bench_size(n, args, args.profile and n == sizes[-1]))
        r = results[-1]
        print(
            f"  {n:,} rows: built in {r['build_s']} s (Z-order {r['zorder_s']} s),"
            f" drain median {r['drain_median_s']:.3f} s",
            flush=True,
        )
    low, high = results[0], results[-1]
    summary = {
        "machine": machine(),
        "claims_per_round": CLAIMS_PER_ROUND,
        "area_ids": args.area_ids,
        "results": results,
        "ratio_drain": high["drain_median_s"] / low["drain_median_s"],
        "ratio_merge": high["merge_median_ms"] / max(low["merge_median_ms"], 1e-9),
    }
    print(summary["machine"])
    print(f"workarea ids: {args.area_ids} ({WORKAREAS} workareas)")
    for r in results:
        print(
            f"{r['rows']:>9,} rows, {r['files_after_zorder']} files after Z-order"
            f" (load {r['load_1m']:.1f}): drain batch median {r['drain_median_s'] * 1000:.0f} ms"
            f" (demote {r['claim.demote']['drain_median_s'] * 1000:.0f},"
            f" erase {r['claim.erase']['drain_median_s'] * 1000:.0f}),"
            f" MERGE median {r['merge_median_ms']:.0f} ms;"
            f" files rewritten per round at most"
            f" {max(x['files_removed'] or 0 for x in r['rounds'])} for {CLAIMS_PER_ROUND} claims"
        )
    print(
        f"ratio t({high['rows']:,})/t({low['rows']:,}): drain batch {summary['ratio_drain']:.2f}x,"
        f" MERGE {summary['ratio_merge']:.2f}x (target <= 1.5x)"
    )
    if args.profile:
        print(high["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
