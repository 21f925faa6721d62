"""What one table commit costs delta-rs, whatever the batch: the floor under a tenant batch
(issue 35). On a silver.claims table of the spec's schema, written with the writer's own
options (`writer_properties`, the app transaction, MERGE with `streamed_exec=False`), at a few
table sizes:

- append of 10 new rows (a promotion; bronze's and lineage's appends are alike);
- txn-only: an append of no rows that records the app transaction (the fence of a table the
  batch did not change);
- MERGE of 10 rows that demote existing ones (`when_matched_update_all`,
  `when_not_matched_insert_all`: the writer's retract MERGE), without and with the target
  filter on the clustering column the writer adds;
- for comparison only, the same change as `write_deltalake(mode="overwrite", predicate=...)`
  (a replaceWhere): the spec names MERGE for retracts, so the writer does not use it.

Each figure is the median of `--samples` commits, the table reopened between none of them (as a
drain keeps its tables open). Local disk.

    .venv/bin/python bench/commit_floor.py --sizes 100 10000 100000 --samples 15
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import machine  # noqa: E402
from retract_bench import area_ids, claim_rows  # noqa: E402

from oml_dagster.lake.model.tables import APP_ID, SILVER_CLAIMS, writer_properties  # noqa: E402

TENANT = "00000000-0000-4000-8000-000000000001"
ROWS = 10


class Table:
    def __init__(self, root: str, size: int, files: int, rng: random.Random):
        self.rng, self.areas, self.txn = rng, area_ids("random"), 0
        self.artifacts: list[str] = []
        self.rows: list[pa.Table] = []  # every row written, as written
        for part in range(files):
            data, artifacts = claim_rows(
                TENANT, 1 + part * size, size // files, rng, 200, self.areas
            )
            self.artifacts += artifacts
            self.rows.append(data)
            self._append(
                root if part == 0 else self.table, data, "error" if part == 0 else "append"
            )
            if part == 0:
                self.table = DeltaTable(root)
        self.demoted: set[str] = set()

    def _props(self) -> CommitProperties:
        self.txn += 1
        return CommitProperties(app_transactions=[Transaction(app_id=APP_ID, version=self.txn)])

    def _append(self, target, data: pa.Table, mode: str = "append") -> None:
        write_deltalake(
            target,
            data,
            mode=mode,
            writer_properties=writer_properties(SILVER_CLAIMS),
            commit_properties=self._props(),
        )

    def append(self) -> None:
        data, artifacts = claim_rows(TENANT, 10**9, ROWS, self.rng, 200, self.areas)
        self._append(self.table, data)
        self.artifacts += artifacts
        self.rows.append(data)

    def txn_only(self) -> None:
        self._append(self.table, SILVER_CLAIMS.schema.empty_table())

    def demotions(self) -> tuple[pa.Table, list[str]]:
        """ROWS rows of the table, demoted, not demoted before; and the workareas they lie in
        (prepared outside the timed commit)."""
        fresh = [a for a in self.artifacts if a not in self.demoted]
        if len(fresh) < ROWS:  # a small table runs out: demote again (the MERGE is the same)
            self.demoted.clear()
            fresh = self.artifacts
        picked = self.rng.sample(fresh, ROWS)
        self.demoted.update(picked)
        everything = pa.concat_tables(self.rows)
        rows = everything.filter(pc.is_in(everything["artifact_id"], pa.array(picked)))
        rows = rows.set_column(
            rows.schema.get_field_index("state"), "state", pa.array(["demoted"] * rows.num_rows)
        )
        return rows, sorted(set(rows["workarea_id"].to_pylist()))

    def merge(self, change: tuple[pa.Table, list[str]], filtered: bool) -> None:
        data, areas = change
        predicate = "t.artifact_id = s.artifact_id AND t.version = s.version"
        if filtered:
            predicate += " AND (" + " OR ".join(f"t.workarea_id = '{a}'" for a in areas) + ")"
        (
            self.table.merge(
                data,
                predicate,
                source_alias="s",
                target_alias="t",
                writer_properties=writer_properties(SILVER_CLAIMS),
                streamed_exec=False,
                commit_properties=self._props(),
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def replace_where(self, change: tuple[pa.Table, list[str]]) -> None:
        data, _ = change
        keys = " OR ".join(
            f"(artifact_id = '{a}' AND version = {v})"
            for a, v in zip(
                data["artifact_id"].to_pylist(), data["version"].to_pylist(), strict=True
            )
        )
        write_deltalake(
            self.table,
            data,
            mode="overwrite",
            predicate=keys,
            writer_properties=writer_properties(SILVER_CLAIMS),
            commit_properties=self._props(),
        )


def timed(fn, samples: int, prepare=None) -> float:
    """The median seconds of `samples` calls of `fn` (of `fn(prepare())`, `prepare` untimed)."""
    times = []
    for _ in range(samples):
        given = prepare() if prepare is not None else None
        started = time.perf_counter()
        fn() if prepare is None else fn(given)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument(
        "--files", type=int, default=10, help="files per table (10 or fewer rows: 1)"
    )
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    print(machine())
    results = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as root:
            table = Table(root, size, max(1, min(args.files, size // 100)), random.Random(size))
            row = {"rows": size, "files": len(table.table.file_uris())}
            for name, fn, prepare in (
                ("append_ms", table.append, None),
                ("txn_only_ms", table.txn_only, None),
                ("merge_ms", lambda c, t=table: t.merge(c, False), table.demotions),
                ("merge_filtered_ms", lambda c, t=table: t.merge(c, True), table.demotions),
                ("replace_where_ms", table.replace_where, table.demotions),
            ):
                row[name] = round(1000 * timed(fn, args.samples, prepare), 1)
            results.append(row)
            print(
                f"silver.claims, {size:,} rows in {row['files']} files: append {row['append_ms']} ms,"
                f" txn-only {row['txn_only_ms']} ms, MERGE {row['merge_ms']} ms (with the"
                f" clustering filter {row['merge_filtered_ms']} ms), replaceWhere (not used)"
                f" {row['replace_where_ms']} ms; medians of {args.samples}, {ROWS} rows each"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
