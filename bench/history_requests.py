"""Which S3 requests the writer's commit makes, counted from the request log of a loopback S3
server (`python -m moto.server`): a bronze table built to `--versions` (every commit kept, as the
erasure bound keeps them), then `--commits` kept-open commits through the writer's own path
(`commit.open_handle`, `commit.commit_table`, as a drain's later batches commit), then as many with
delta-rs's default post-commit hook (expired-log cleanup after every commit). Each phase is
marked in the log by a GET of a key that does not exist (`oml-mark/<phase>`).

    .venv/bin/python bench/history_requests.py --versions 1000 --commits 10
    .venv/bin/python bench/history_requests.py --list-cost 100 1000 5000 10000

Prints, per phase and per commit, the LIST requests (from an offset, of the whole log, or of one
name as pyarrow's `get_file_info` asks) and the other requests by method.
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import collections
import contextlib
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

from deltalake import CommitProperties, Transaction, write_deltalake

from oml_dagster.lake.model.tables import APP_ID, BRONZE_EVENTS
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
from oml_dagster.lake.store import conditional_put
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import LAKE_URI, lake_storage_options

if __package__ is None or __package__ == "":  # run as a script: the repository's root first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.history_bench import TENANT, cheap_appends, event_rows, measured_commit  # noqa: E402
from oml_testbed.s3_server import lake_env, moto_server  # noqa: E402


def default_hook_commit(lake: Lake, tables: OpenTables, seq: int) -> None:
    table = tables.open(lake.table_uri(TENANT, BRONZE_EVENTS))
    write_deltalake(
        table,
        event_rows(seq),
        mode="append",
        partition_by=list(BRONZE_EVENTS.partition_by),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=APP_ID, version=seq)], max_commit_retries=0
        ),
    )


def count(log_path: str, commits: int) -> None:
    request = re.compile(r'"(?:\x1b\[[0-9;]*m)*(\w+) (\S+) HTTP')
    phase, counts = "start", collections.defaultdict(collections.Counter)
    with open(log_path) as f:
        for line in f:
            found = request.search(line)
            if not found:
                continue
            method, target = found.groups()
            if "/oml-mark/" in target:
                phase = target.rsplit("/", 1)[-1]
                continue
            if method == "GET" and "list-type=2" in target:
                if "start-after=" in target:
                    kind = "LIST _delta_log start-after"
                elif "delimiter=" in target:
                    kind = "LIST one name (get_file_info)"
                else:
                    kind = "LIST _delta_log whole (one per 1,000 keys)"
                counts[phase][kind] += 1
            else:
                counts[phase][method] += 1
    for name in ("writer", "default_hook"):
        per = {k: v / commits for k, v in sorted(counts[name].items())}
        print(f"{name}: per commit " + ", ".join(f"{k} {v:.1f}" for k, v in per.items()))


def list_cost(lake: Lake, sizes: list[int], lists: int = 20) -> None:
    """The server's own cost of one LIST with start-after near the end of a prefix (what a
    commit's offset listings ask), with `sizes` keys under the prefix: on S3 a page's cost; a
    server that scans every key of the bucket per LIST grows with the size."""
    client = conditional_put.s3_client(lake)
    bucket = lake.root.split("/")[2]
    made = 0
    for size in sorted(sizes):
        prefix = "list-cost/_delta_log/"
        while made < size:
            client.put_object(Bucket=bucket, Key=f"{prefix}{made:020d}.json", Body=b"{}")
            made += 1
        after = f"{prefix}{size - 2:020d}"
        started = time.perf_counter()
        for _ in range(lists):
            client.list_objects_v2(Bucket=bucket, Prefix=prefix, StartAfter=after)
        took = (time.perf_counter() - started) / lists
        print(f"LIST start-after with {size} keys under the prefix: {took * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--log", help="keep the server's request log here")
    parser.add_argument(
        "--list-cost",
        type=int,
        nargs="+",
        metavar="KEYS",
        help="instead: time a LIST with start-after against the server at these key counts",
    )
    args = parser.parse_args()
    log_path = args.log or os.path.join(tempfile.mkdtemp(), "moto.log")
    with moto_server(log_path) as endpoint:
        env = lake_env(endpoint, f"requests-{uuid.uuid4().hex[:8]}")
        lake = Lake(LAKE_URI.read(env), lake_storage_options(env))
        bucket = lake.root.split("/")[2]
        conditional_put.s3_client(lake).create_bucket(Bucket=bucket)
        lake = lake.checked()
        if args.list_cost:
            list_cost(lake, args.list_cost)
            return
        configuration = BRONZE_EVENTS.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
        tables = OpenTables(lake)
        measured_commit(lake, 1, WriterConfig(), configuration, tables)
        uri = lake.table_uri(TENANT, BRONZE_EVENTS)
        # Stop short of a checkpoint commit, so both phases are ordinary commits.
        seq = cheap_appends(lake.open(uri), 1, args.versions, 0)

        def mark(phase: str) -> None:
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"{endpoint}/{bucket}/oml-mark/{phase}", timeout=5)

        tables.forget(uri)
        tables.open(uri)
        mark("writer")
        for _ in range(args.commits):
            seq += 1
            measured_commit(lake, seq, WriterConfig(), configuration, tables)
        mark("default_hook")
        for _ in range(args.commits):
            seq += 1
            default_hook_commit(lake, tables, seq)
        mark("end")
    if args.list_cost:
        return
    print(f"table at version {seq}; request log {log_path}")
    count(log_path, args.commits)


if __name__ == "__main__":
    main()
