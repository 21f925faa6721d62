"""The writer's CPU per tenant batch beside delta-rs's floor for the same commits, in one run.

`oml-lake simulate`'s workload (seeded, with its injected bad input) is written into a fresh
database; a drain of small batches (`--batch` ops a tenant visit, the shape of a shard run with
many tenants) runs `--warm` passes so that every table exists and has history. The lake is then
copied, and one drain of `--passes` passes runs in this process with:

- a `CommitObserver` that records every commit each tenant batch makes (the `TableCommit`: table,
  operation, rows, predicate, app transaction, metadata; once landed, the version and the MERGE's
  file counts) and the process CPU between its `before` and `landed` (the writer's commit call);
- a `DrainObserver` that reads the process CPU (`time.process_time`: every thread, delta-rs's
  runtime and the read-ahead's fetch included; PostgreSQL's own CPU is another process's and is
  not counted) at each `batch_ended`: a batch's CPU is the CPU since the batch before it ended.

Then the same commits are made again, in the same order, on the copy, with bare deltalake calls:
`write_deltalake` (create, append, an append of no rows for a txn-only commit) and
`DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()`, each with the
writer's `WriterProperties`, `CommitProperties(app_transactions=[Transaction(APP_ID,
batch_end)], custom_metadata=...)`, post-commit hooks and `streamed_exec=False`; every table
opened once before (the drain keeps its tables open too). The process CPU of each call is the
floor. The copy's tables must end at the writer's versions and row counts, or the run fails.

Reported: writer CPU per batch against the replay's (overall, per pass, the distribution of the
per-batch ratio), and per operation kind the writer's commit calls against the replay's; what
the writer spends outside its commit calls (read, fold, verdicts, frontier) is the rest.

    .venv/bin/python bench/floor_replay.py --tenants 25 --claims 80 --batch 60 --warm 3 --passes 4
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import fresh_database, machine  # noqa: E402

from oml_dagster.lake.model.tables import (  # noqa: E402
    APP_ID,
    CORE_TABLES,
    GOLD_CURATED,
    writer_properties,
)
from oml_dagster.lake.store.layout import Lake  # noqa: E402
from oml_dagster.lake.write.commit import (  # noqa: E402
    CommitObserver,
    TableCommit,
    post_commit_hooks,
)
from oml_dagster.lake.write.drain import DrainObserver, DrainPolicy, drain  # noqa: E402
from oml_dagster.lake.write.writer import BatchResult, WriterConfig  # noqa: E402
from oml_dagster.simulate.runner import RunConfig, run  # noqa: E402
from oml_dagster.simulate.workload import WorkloadConfig  # noqa: E402

SPECS = {spec.name: spec for spec in (*CORE_TABLES, GOLD_CURATED)}


@dataclass
class Recorded:
    """One commit as the writer made it, the CPU of its commit call and the batch it belongs to."""

    commit: TableCommit
    batch: int
    writer_s: float
    replay_s: float = 0.0


@dataclass
class Batch:
    tenant_id: str
    pass_no: int
    ops: int
    cpu_s: float
    commits: list[Recorded] = field(default_factory=list)


class Recorder(DrainObserver, CommitObserver):
    """Hears every batch and every table commit of one drain; reads the process CPU at each."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.commits: list[Recorded] = []
        self.pending: list[Recorded] = []
        self.pass_no = 1
        self.mark = time.process_time()
        self.started: float | None = None

    def table_commits(self) -> CommitObserver:
        return self

    def before(self, commit: TableCommit) -> None:
        self.started = time.process_time()

    def landed(self, commit: TableCommit) -> None:
        took = time.process_time() - (self.started or 0.0)
        recorded = Recorded(commit, len(self.batches), took)
        self.pending.append(recorded)
        self.commits.append(recorded)

    def batch_ended(self, result: BatchResult) -> None:
        now = time.process_time()
        batch = Batch(result.tenant_id, self.pass_no, result.ops, now - self.mark, self.pending)
        self.batches.append(batch)
        self.pending, self.mark = [], now

    def pass_ended(self, drained) -> None:
        self.pass_no += 1


def replay(commits: list[Recorded], live_root: str, copy_root: str) -> None:
    """Make every commit again on the copy with deltalake alone; each one's CPU into `replay_s`."""
    tables: dict[str, DeltaTable] = {}
    for uri in {r.commit.uri for r in commits}:  # opened once, before: not timed
        there = uri.replace(live_root, copy_root, 1)
        if os.path.isdir(os.path.join(there, "_delta_log")):
            tables[there] = DeltaTable(there)
    for r in commits:
        c = r.commit
        uri = c.uri.replace(live_root, copy_root, 1)
        spec = SPECS[c.table.spec_name]
        started = time.process_time()
        props = CommitProperties(
            app_transactions=[Transaction(app_id=APP_ID, version=c.batch_end)],
            custom_metadata=dict(c.metadata),
            max_commit_retries=0,
        )
        table = tables.get(uri)
        if c.operation == "merge":
            assert table is not None and c.predicate is not None
            (
                table.merge(
                    c.rows,
                    c.predicate,
                    source_alias="s",
                    target_alias="t",
                    writer_properties=writer_properties(spec),
                    streamed_exec=False,
                    commit_properties=props,
                    post_commithook_properties=post_commit_hooks(table),
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        elif c.operation == "create":
            write_deltalake(
                uri,
                c.rows,
                mode="error",
                partition_by=list(c.partition_by) or None,
                configuration=dict(c.configuration) if c.configuration is not None else None,
                writer_properties=writer_properties(spec),
                commit_properties=props,
            )
            tables[uri] = DeltaTable(uri)
        else:  # an append, or an append of no rows (txn-only)
            assert table is not None
            write_deltalake(
                table,
                c.rows,
                mode="append",
                writer_properties=writer_properties(spec),
                commit_properties=props,
                post_commithook_properties=post_commit_hooks(table),
            )
        r.replay_s = time.process_time() - started
    for r in commits:  # the same tables, version for version and row for row
        live = DeltaTable(r.commit.uri)
        copy = tables[r.commit.uri.replace(live_root, copy_root, 1)]
        same = live.version() == copy.version() and (
            live.to_pyarrow_dataset().count_rows() == copy.to_pyarrow_dataset().count_rows()
        )
        if not same:
            raise SystemExit(f"{r.commit.uri}: the replay does not end where the writer did")


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def report(recorder: Recorder) -> dict:
    batches = [b for b in recorder.batches if b.ops]
    committing = [b for b in batches if b.commits]
    writer = sum(b.cpu_s for b in batches)
    floor = sum(r.replay_s for b in batches for r in b.commits)
    in_commits = sum(r.writer_s for b in batches for r in b.commits)
    lines = [
        f"{len(batches)} tenant batches with ops ({len(committing)} committed), "
        f"{sum(b.ops for b in batches)} ops, {len(recorder.commits)} table commits",
        f"writer CPU per batch {_ms(writer / len(batches))} ms; the replay of its commits "
        f"{_ms(floor / len(batches))} ms; ratio {writer / floor:.2f}x",
        f"  of the writer's: its commit calls {_ms(in_commits / len(batches))} ms a batch "
        f"({100 * in_commits / writer:.0f}%), outside them {_ms((writer - in_commits) / len(batches))} ms",
    ]
    per_pass = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for b in batches:
        row = per_pass[b.pass_no]
        row[0] += 1
        row[1] += b.cpu_s
        row[2] += sum(r.replay_s for r in b.commits)
    for no, (n, w, f) in sorted(per_pass.items()):
        lines.append(
            f"  pass {no}: {n} batches, writer {_ms(w / n)} ms, replay {_ms(f / n)} ms a batch,"
            f" {w / f:.2f}x"
        )
    # The measured drain opens its tables in its first pass (the replay's are opened before it
    # is timed): the passes after the first are a standing shard run's steady state.
    later = [row for no, row in per_pass.items() if no > min(per_pass)]
    if later:
        n, w, f = (sum(row[i] for row in later) for i in range(3))
        lines.append(
            f"  passes after the first (tables open): writer {_ms(w / n)} ms, replay "
            f"{_ms(f / n)} ms a batch, {w / f:.2f}x"
        )
    ratios = sorted(b.cpu_s / sum(r.replay_s for r in b.commits) for b in committing)
    q = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
    lines.append(
        f"per-batch ratio: p10 {q[0]:.2f}x, median {statistics.median(ratios):.2f}x, "
        f"p90 {q[-1]:.2f}x"
    )
    kinds: dict[tuple[str, str], list[Recorded]] = collections.defaultdict(list)
    for b in batches:
        for r in b.commits:
            kinds[r.commit.table.spec_name, r.commit.operation].append(r)
    lines.append("per table and operation: count, rows/commit, writer's call ms, replay ms, ratio")
    by_kind = []
    for (table, op), rs in sorted(kinds.items()):
        w = sum(r.writer_s for r in rs)
        f = sum(r.replay_s for r in rs)
        rows = sum(r.commit.rows.num_rows for r in rs) / len(rs)
        scanned = [r.commit.files_scanned for r in rs if r.commit.files_scanned is not None]
        files = f", files scanned {statistics.mean(scanned):.1f}" if scanned else ""
        lines.append(
            f"  {table:<14} {op:<9} {len(rs):4d}  {rows:7.1f}  {_ms(w / len(rs)):>6}  "
            f"{_ms(f / len(rs)):>6}  {w / f:.2f}x{files}"
        )
        by_kind.append(
            {
                "table": table,
                "operation": op,
                "commits": len(rs),
                "rows_per_commit": round(rows, 1),
                "writer_call_ms": round(1000 * w / len(rs), 2),
                "replay_ms": round(1000 * f / len(rs), 2),
            }
        )
    ops = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for rs in kinds.values():
        for r in rs:
            row = ops[r.commit.operation]
            row[0] += 1
            row[1] += r.writer_s
            row[2] += r.replay_s
    lines.append("per operation: count, writer's call ms, replay ms, ratio; commits per batch")
    for op, (n, w, f) in sorted(ops.items()):
        lines.append(
            f"  {op:<9} {n:4d}  {_ms(w / n):>6}  {_ms(f / n):>6}  {w / f:.2f}x  "
            f"{n / len(batches):.2f}"
        )
    print("\n".join(lines))
    return {
        "batches": len(batches),
        "writer_ms_per_batch": round(1000 * writer / len(batches), 2),
        "replay_ms_per_batch": round(1000 * floor / len(batches), 2),
        "ratio": round(writer / floor, 3),
        "writer_commit_calls_ms_per_batch": round(1000 * in_commits / len(batches), 2),
        "ratio_after_first_pass": round(w / f, 3) if later else None,
        "per_batch_ratio_median": round(statistics.median(ratios), 3),
        "per_kind": by_kind,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=25)
    parser.add_argument("--claims", type=int, default=80)
    parser.add_argument("--batch", type=int, default=60, help="ops a tenant batch takes at most")
    parser.add_argument("--warm", type=int, default=3, help="passes before the measured drain")
    parser.add_argument("--passes", type=int, default=4, help="passes of the measured drain")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    print(machine())
    print(
        f"workload: {args.tenants} tenants x {args.claims} claims, seed {args.seed}; batches of "
        f"{args.batch} ops; {args.warm} passes before, {args.passes} measured"
    )
    with fresh_database("oml_floor") as dsn, tempfile.TemporaryDirectory() as tmp:
        run(dsn, WorkloadConfig(args.tenants, args.claims, args.seed, 0.01), RunConfig())
        live, copy = os.path.join(tmp, "lake"), os.path.join(tmp, "copy")
        lake = Lake(live)
        # A shard visit's small batch, with the highest txn lag limit it allows (as a shard run).
        config = WriterConfig(max_batch=args.batch, txn_lag_limit=args.batch - 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(args.warm):
                drain(conn, lake, policy=DrainPolicy(config=config))
            shutil.copytree(live, copy)
            recorder = Recorder()
            policy = DrainPolicy(until_idle=True, config=config, max_passes=args.passes)
            started = time.process_time()
            drain(conn, lake, policy=policy, observer=recorder)
            drained = time.process_time() - started
        replay(recorder.commits, live, copy)
    print(f"the measured drain: {drained:.2f} s of process CPU")
    figures = report(recorder)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), **figures}, indent=1))


if __name__ == "__main__":
    main()
