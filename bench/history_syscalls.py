"""Which phase of a commit lists `_delta_log`, counted in system calls: run under
`strace -f -e trace=getdents64,statx,newfstatat,openat`, this script marks each phase with a
`stat` of a path that does not exist (`/oml-mark/<phase>`), so the trace splits into phases.

    .venv/bin/python bench/history_syscalls.py build /tmp/h3000 --versions 3000
    strace -f -qq -e trace=getdents64,statx,newfstatat -o trace.txt \\
        .venv/bin/python bench/history_syscalls.py phases /tmp/h3000 --commits 20
    .venv/bin/python bench/history_syscalls.py split trace.txt
    strace -f -c -o summary.txt .venv/bin/python bench/history_syscalls.py phases /tmp/h3000 \
        --commits 20 --only append_default

Phases (each on the table built by `build`, whose log keeps every commit):
- `open`: `DeltaTable(uri)` (a drain's first batch);
- `update_none`: `update_incremental()` with nothing new;
- `other_writer`: another handle opens the table and commits once;
- `update_one`: `update_incremental()` after that commit;
- `append_default`: `--commits` txn-only appends on a kept-open table, the post-commit hook as
  the table's properties set it (`delta.enableExpiredLogCleanup` unset: expired-log cleanup after
  every commit);
- `append_no_cleanup`: the same with `PostCommitHookProperties(cleanup_expired_logs=False)`.
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

from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import PostCommitHookProperties

from oml_dagster.lake.model.tables import APP_ID, BRONZE_EVENTS

try:
    from bench.history_bench import TENANT, cheap_appends, measured_commit
except ImportError:  # run as a script
    from history_bench import TENANT, cheap_appends, measured_commit

MARK = "/oml-mark/"


def mark(phase: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.stat(MARK + phase)


def build(root: str, versions: int) -> str:
    from oml_dagster.lake.model.tables import BRONZE_EVENTS as spec
    from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
    from oml_dagster.lake.store.layout import Lake
    from oml_dagster.lake.write.writer import WriterConfig

    lake = Lake(root)
    configuration = spec.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
    measured_commit(lake, 1, WriterConfig(), configuration)
    uri = lake.table_uri(TENANT, spec)
    cheap_appends(DeltaTable(uri), 1, versions, 0)
    return uri


def append(table: DeltaTable, seq: int, hooks: PostCommitHookProperties | None) -> None:
    write_deltalake(
        table,
        BRONZE_EVENTS.schema.empty_table(),
        mode="append",
        partition_by=list(BRONZE_EVENTS.partition_by),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=APP_ID, version=seq)]
        ),
        post_commithook_properties=hooks,
    )


def appends_only(uri: str, commits: int, cleanup: bool) -> None:
    """Just `commits` kept-open appends (for `strace -c`, whose totals include the imports)."""
    table = DeltaTable(uri)
    seq = (table.transaction_version(APP_ID) or 0) + 1
    hooks = None if cleanup else PostCommitHookProperties(cleanup_expired_logs=False)
    for _ in range(commits):
        seq += 1
        append(table, seq, hooks)


def phases(uri: str, commits: int) -> None:
    mark("open")
    table = DeltaTable(uri)
    mark("update_none")
    table.update_incremental()
    mark("other_writer")
    other = DeltaTable(uri)
    seq = (table.transaction_version(APP_ID) or 0) + 1
    append(other, seq, None)
    mark("update_one")
    table.update_incremental()
    mark("append_default")
    for _ in range(commits):
        seq += 1
        append(table, seq, None)
    mark("append_no_cleanup")
    no_cleanup = PostCommitHookProperties(cleanup_expired_logs=False)
    for _ in range(commits):
        seq += 1
        append(table, seq, no_cleanup)
    mark("end")


def split(trace: str) -> None:
    """Per phase: calls of each syscall, and how many `getdents64` read `_delta_log`."""
    marker = re.compile(re.escape(MARK) + r"(\w+)")
    fds: dict[str, str] = {}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    phase = "start"
    with open(trace) as f:
        for line in f:
            found = marker.search(line)
            if found:
                phase = found[1]
                continue
            call = re.match(r"^(?:\d+\s+)?(\w+)\(", line)
            if not call:
                continue
            name = call[1]
            counts[phase][name] += 1
            if name == "openat" and "_delta_log" in line and "O_DIRECTORY" in line:
                fd = line.rsplit("=", 1)[-1].strip()
                fds[fd] = "log"
            if name == "getdents64":
                fd = line.split("(", 1)[1].split(",", 1)[0]
                if fds.get(fd) == "log" and not line.rstrip().endswith("= 0"):
                    counts[phase]["getdents64 _delta_log batches"] += 1
                if line.rstrip().endswith("= 0"):
                    if fds.get(fd) == "log":
                        counts[phase]["_delta_log listings"] += 1
                    fds.pop(fd, None)
            if name in ("statx", "newfstatat") and "/_delta_log/" in line:
                counts[phase][f"{name} in _delta_log"] += 1
    for name, counter in counts.items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("root")
    b.add_argument("--versions", type=int, default=3000)
    p = sub.add_parser("phases")
    p.add_argument("root")
    p.add_argument("--commits", type=int, default=20)
    p.add_argument(
        "--only",
        choices=("append_default", "append_no_cleanup"),
        help="run only these appends",
    )
    s = sub.add_parser("split")
    s.add_argument("trace")
    args = parser.parse_args()
    if args.command == "build":
        print(build(args.root, args.versions))
    elif args.command == "phases":
        from oml_dagster.lake.store.layout import Lake

        uri = Lake(args.root).table_uri(TENANT, BRONZE_EVENTS)
        if args.only:
            appends_only(uri, args.commits, args.only == "append_default")
        else:
            phases(uri, args.commits)
    else:
        split(args.trace)


if __name__ == "__main__":
    main()
