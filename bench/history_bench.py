"""Commit latency against table history: one bronze table of one tenant, created by the writer
with the tables' checkpoint policy (`delta.checkpointInterval` 100, so delta-rs writes a
checkpoint at every hundredth version), is brought to version ~100 and then to ~10,000 by cheap
appends (by default zero-row ones: the writer's txn-only commit, which adds no file). At each point, `--samples` commits go through the writer's own commit path
(`commit.open_handle` opens the table as a drain's first batch does, `commit.commit_table`
commits one batch's rows with the app transaction), at the same offsets past a
checkpoint, so the two points differ only in the history behind them; then as many commits
with the table kept open, as a drain commits every batch after its first (`OpenTables`: the
table is brought up to date instead of opened).

    .venv/bin/python bench/history_bench.py --versions 10000
    .venv/bin/python bench/history_bench.py --versions 1000 --samples 10   # quick
    .venv/bin/python bench/history_bench.py --stores local s3 --versions 5000

`--stores` runs the same measurement on each store in turn: `local` is a lake in a temporary
directory; `s3` is the lake OML_LAKE_URI names when that is an s3:// URI (with
OML_LAKE_STORAGE_OPTIONS and the `AWS_*` variables, as the product reads them; the table goes
under a fresh prefix), else an S3 API server started on loopback (`python -m moto.server`, as
the tests do) with a fresh bucket. moto is not S3: it answers every LIST by scanning and sorting
all keys of the bucket (start-after only drops the head of that list), where S3 pages through
its index.

Prints per point the median and 90th percentile of open, commit and their sum for both, and the
ratios of the medians at the high point to the low one (target: at most 2x).
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import PostCommitHookProperties

from oml_dagster.lake.model.tables import APP_ID, BRONZE_EVENTS, CHECKPOINT_INTERVAL
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
from oml_dagster.lake.store import conditional_put, deltalog
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.commit import CommitRules, commit_table, open_handle
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import LAKE_URI, lake_storage_options

if __package__ is None or __package__ == "":  # run as a script: the repository's root first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._support import machine  # noqa: E402
from oml_testbed.s3_server import lake_env, moto_server  # noqa: E402

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
    handle = open_handle(tables or OpenTables(lake), TENANT, BRONZE_EVENTS)
    opened = time.perf_counter()
    outcome = commit_table(
        lake=lake,
        tenant_id=TENANT,
        handle=handle,
        output=lambda _txn: event_rows(seq),
        op_seqs=[seq],
        batch_end=seq,
        leading_txn=handle.txn,
        rules=CommitRules(
            txn_lag_limit=config.txn_lag_limit,
            max_commit_attempts=config.max_commit_attempts,
            configuration=configuration,
        ),
    )
    done = time.perf_counter()
    assert outcome.action == "committed", outcome
    if tables is not None:  # as a drain does after its batch: the table and its new txn
        tables.keep(handle.uri, handle.table, handle.txn)
    return {
        "version": outcome.version,
        "open_s": opened - started,
        "commit_s": done - opened,
        "total_s": done - started,
    }


# Building appends skip delta-rs's expired-log cleanup after each commit (a listing of the whole
# log, which expires nothing here: every entry is inside the retention): they are not measured,
# and it would make building a 10,000-version table over S3 take hours. Checkpoints are written.
_BUILD_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


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
            post_commithook_properties=_BUILD_HOOKS,
        )
    return seq


def summary(samples: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = sorted(s[key] for s in samples)
        p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
        return {"median_ms": statistics.median(values) * 1000, "p90_ms": p90 * 1000}

    return {k: stats(k) for k in ("open_s", "commit_s", "total_s")}


@contextlib.contextmanager
def bench_lake(store: str) -> Iterator[tuple[Lake, str]]:
    """A fresh lake on `store` ("local" or "s3") and a line saying where it is."""
    if store == "local":
        with tempfile.TemporaryDirectory() as tmp:
            yield Lake(os.path.join(tmp, "oml-lake")), "local filesystem (temporary directory)"
        return
    if LAKE_URI.read().startswith(("s3://", "s3a://")):
        # The product's lake settings, under a prefix of this run's own.
        root = f"{LAKE_URI.read().rstrip('/')}/history-bench-{uuid.uuid4().hex[:8]}"
        lake = Lake(root, lake_storage_options()).checked()
        yield lake, f"S3 at {lake.store}, prefix {root}"
        return
    with moto_server() as endpoint:
        # The settings a deployment would set, read the way the product reads them.
        env = lake_env(endpoint, f"history-{uuid.uuid4().hex[:8]}")
        lake = Lake(LAKE_URI.read(env), lake_storage_options(env))
        conditional_put.s3_client(lake).create_bucket(Bucket=lake.root.split("/")[2])
        yield lake.checked(), f"moto {_moto_version()} S3 API server on loopback ({endpoint})"


def _moto_version() -> str:
    from importlib.metadata import version

    return version("moto")


def run(versions: list[int], samples: int, rows: int, store: str = "local") -> dict:
    with bench_lake(store) as (lake, where):
        print(f"{store}: {where}", flush=True)
        result = _run(lake, versions, samples, rows)
    result["store"], result["where"] = store, where
    return result


def _run(lake: Lake, versions: list[int], samples: int, rows: int) -> dict:
    config = WriterConfig()
    configuration = BRONZE_EVENTS.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
    points = []
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
        log = deltalog.log_names(lake.filesystem(uri))
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
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=("local", "s3"),
        default=["local"],
        help="where the lake is, one run each, in this order (s3: see the module docstring)",
    )
    parser.add_argument(
        "--s3-versions",
        type=int,
        help="the high version on s3 (default: --versions; a loopback S3 server is slower)",
    )
    parser.add_argument(
        "--json", help="write the results here (one store: its result; more: a list of them)"
    )
    args = parser.parse_args()
    highs = {"local": args.versions, "s3": args.s3_versions or args.versions}
    if min(highs[s] for s in args.stores) <= args.low:
        parser.error("the high versions must be above --low")
    results = []
    for store in args.stores:
        result = run([args.low, highs[store]], args.samples, args.build_rows, store)
        results.append(result)
        report(result)
    if len(results) > 1:
        print("summary:")
        for result in results:
            print(f"  {result['store']}: {ratios(result)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results[0] if len(results) == 1 else results, f, indent=1)


def ratios(result: dict) -> str:
    return (
        f"total {result['ratio_total']:.2f}x, commit {result['ratio_commit']:.2f}x, open"
        f" {result['ratio_open']:.2f}x; kept open (as a drain commits after its first batch):"
        f" total {result['ratio_total_kept_open']:.2f}x (target <= 2x)"
    )


def report(result: dict) -> None:
    print(f"{result['store']} ({result['where']}); {result['machine']}")
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
    print(f"ratio high/low (medians): {ratios(result)}", flush=True)


if __name__ == "__main__":
    main()
