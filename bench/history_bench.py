"""Commit latency against table history: one bronze table of one tenant, created by the writer
with the tables' checkpoint policy (`delta.checkpointInterval` 100, so delta-rs writes a
checkpoint at every hundredth version), is brought to version ~100 and then to ~10,000 by cheap
appends (by default zero-row ones: the writer's txn-only commit, which adds no file). At each point, `--samples` commits go through the writer's own commit path
(`writer._handle` opens the table as a drain's first batch does, `writer._commit_table`
commits one batch's rows with the app transaction), at the same offsets past a
checkpoint, so the two points differ only in the history behind them; then as many commits
with the table kept open, as a drain commits every batch after its first (`OpenTables`: the
table is brought up to date instead of opened).

    .venv/bin/python bench/history_bench.py --versions 10000
    .venv/bin/python bench/history_bench.py --versions 1000 --samples 10   # quick

Prints per point the median and 90th percentile of open, commit and their sum for both, and the
ratios of the medians at the high point to the low one (target: at most 2x).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
import uuid

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from oml_dagster.lake import writer
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
from oml_dagster.lake.storage import Lake, OpenTables
from oml_dagster.lake.tables import APP_ID, BRONZE_EVENTS, CHECKPOINT_INTERVAL
from oml_dagster.lake.writer import WriterConfig

try:
    from bench._support import machine
except ImportError:  # run as a script
    from _support import machine

TENANT = str(uuid.UUID(int=10, version=4))


def event_rows(seq: int, n: int = 1) -> pa.Table:
    """`n` bronze rows (a batch's worth of events) ending at outbox seq `seq`."""
    at = dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seq)
    rows = [
        {
            "tenant_id": TENANT,
            "journal_seq": s,
            "event_id": str(uuid.UUID(int=s, version=4)),
            "event_type": "claim.promoted",
            "at": at,
            "event_date": at.date(),
            "prev_hash": b"p" * 32,
            "hash": b"h" * 32,
            "sig": b"s" * 64,
            "signed_bytes": b"b" * 200,
            "payload": "{}",
            "principal": "bench",
            "api_key_id": "bench-key",
            "outbox_seq": s,
        }
        for s in range(seq - n + 1, seq + 1)
    ]
    return pa.Table.from_pylist(rows, schema=BRONZE_EVENTS.schema)


def measured_commit(
    lake: Lake,
    seq: int,
    config: WriterConfig,
    configuration: dict,
    tables: OpenTables | None = None,
) -> dict:
    """One batch's bronze commit as the writer does it: open (or, with `tables` a drain's open
    tables, bring the open table up to date), fenced commit."""
    started = time.perf_counter()
    handle = writer._handle(tables or OpenTables(lake), TENANT, BRONZE_EVENTS)
    opened = time.perf_counter()
    outcome = writer._commit_table(
        lake,
        TENANT,
        handle,
        lambda _txn: event_rows(seq),
        [seq],
        seq,
        handle.txn,
        config,
        configuration,
    )
    done = time.perf_counter()
    assert outcome.action == "committed", outcome
    return {
        "version": outcome.version,
        "open_s": opened - started,
        "commit_s": done - opened,
        "total_s": done - started,
    }


def cheap_appends(table: DeltaTable, seq: int, until_version: int, rows: int) -> int:
    """Appends of `rows` rows (0: the writer's txn-only commit) with the app transaction until
    the table is at `until_version`."""
    while table.version() < until_version:
        seq += 1
        write_deltalake(
            table,
            event_rows(seq, rows) if rows else BRONZE_EVENTS.schema.empty_table(),
            mode="append",
            partition_by=list(BRONZE_EVENTS.partition_by),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=APP_ID, version=seq)]
            ),
        )
    return seq


def summary(samples: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = sorted(s[key] for s in samples)
        p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
        return {"median_ms": statistics.median(values) * 1000, "p90_ms": p90 * 1000}

    return {k: stats(k) for k in ("open_s", "commit_s", "total_s")}


def run(versions: list[int], samples: int, rows: int) -> dict:
    config = WriterConfig()
    configuration = BRONZE_EVENTS.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(os.path.join(tmp, "oml-lake"))
        uri = lake.table_uri(TENANT, BRONZE_EVENTS)
        # Created through the writer: the table properties are the product's.
        seq = 1
        measured_commit(lake, seq, config, configuration)
        table = lake.open(uri)
        for target in versions:
            # Start each point just past a checkpoint, so every point replays the same tail.
            start = (target // CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
            started = time.perf_counter()
            seq = cheap_appends(table, seq, start - 1, rows)
            built = time.perf_counter() - started
            runs, kept = [], []
            for _ in range(samples):
                seq += 1
                runs.append(measured_commit(lake, seq, config, configuration))
            # The same commits from a drain that keeps the table open (its first batch opened
            # it, untimed here): each batch brings the table up to date instead of opening it.
            tables = OpenTables(lake)
            tables.open(uri)
            for _ in range(samples):
                seq += 1
                kept.append(measured_commit(lake, seq, config, configuration, tables))
            table = lake.open(uri)
            log = os.listdir(os.path.join(lake.local_path(uri), "_delta_log"))
            points.append(
                {
                    "target_version": target,
                    "first_version": runs[0]["version"],
                    "last_version": runs[-1]["version"],
                    "build_s": round(built, 1),
                    "checkpoints": sum(1 for name in log if ".checkpoint." in name),
                    "log_files": len(log),
                    "live_files": len(table.file_uris()),
                    "samples": runs,
                    **summary(runs),
                    "kept_open": {"samples": kept, **summary(kept)},
                }
            )
            print(
                f"  version {runs[0]['version']}-{kept[-1]['version']}: total median "
                f"{points[-1]['total_s']['median_ms']:.1f} ms opened, "
                f"{points[-1]['kept_open']['total_s']['median_ms']:.1f} ms kept open "
                f"(built in {built:.0f} s)",
                flush=True,
            )
    low, high = points[0], points[-1]
    return {
        "machine": machine(),
        "samples": samples,
        "build_rows_per_append": rows,
        "points": points,
        "ratio_total": high["total_s"]["median_ms"] / low["total_s"]["median_ms"],
        "ratio_commit": high["commit_s"]["median_ms"] / low["commit_s"]["median_ms"],
        "ratio_open": high["open_s"]["median_ms"] / low["open_s"]["median_ms"],
        "ratio_total_kept_open": high["kept_open"]["total_s"]["median_ms"]
        / low["kept_open"]["total_s"]["median_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--low", type=int, default=100, help="the baseline version")
    parser.add_argument("--versions", type=int, default=10_000, help="the high version")
    parser.add_argument("--samples", type=int, default=20, help="measured commits per point")
    parser.add_argument(
        "--build-rows",
        type=int,
        default=0,
        help="rows per building append (0: txn-only commits, so only the measured commits add"
        " files and both points hold about as many)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.versions <= args.low:
        parser.error("--versions must be above --low")
    result = run([args.low, args.versions], args.samples, args.build_rows)
    print(result["machine"])
    for p in result["points"]:
        print(
            f"version {p['first_version']:>6}-{p['last_version']:<6} ({p['live_files']} files,"
            f" {p['checkpoints']} checkpoints, {p['log_files']} log files):"
            f" open {p['open_s']['median_ms']:.1f} ms, commit {p['commit_s']['median_ms']:.1f} ms,"
            f" total median {p['total_s']['median_ms']:.1f} ms / p90 {p['total_s']['p90_ms']:.1f} ms;"
            f" kept open: update {p['kept_open']['open_s']['median_ms']:.1f} ms, commit"
            f" {p['kept_open']['commit_s']['median_ms']:.1f} ms, total median"
            f" {p['kept_open']['total_s']['median_ms']:.1f} ms"
        )
    print(
        f"ratio high/low (medians): total {result['ratio_total']:.2f}x, commit"
        f" {result['ratio_commit']:.2f}x, open {result['ratio_open']:.2f}x; kept open (as a drain"
        f" commits after its first batch): total {result['ratio_total_kept_open']:.2f}x"
        " (target <= 2x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
