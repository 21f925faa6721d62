"""Lake lag: how long each writer commit's oldest op had waited in the outbox, from the tables'
own Delta logs and the outbox's `created_at`."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.model.tables import APP_ID, TableId
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store.layout import Lake


@dataclass(frozen=True)
class CommitLag:
    """One writer commit of one table: when it landed, the batch it carried, and how long the
    batch's oldest op had waited in the outbox by then."""

    table: str
    version: int
    committed_at: dt.datetime
    batch_start: int
    batch_end: int
    oldest_op_at: dt.datetime | None  # None: no op of the tenant in the batch (txn-only)

    @property
    def lag_seconds(self) -> float | None:
        if self.oldest_op_at is None:
            return None
        return (self.committed_at - self.oldest_op_at).total_seconds()


def lake_lag(
    conn: psycopg.Connection, lake: Lake, tenant_id: str, tables: Iterable[tuple[TableId, str]]
) -> list[CommitLag]:
    """Every writer commit the tenant's tables' logs still hold (`tables`: (TableId, uri)), with its
    lag: commit time (the Delta commitInfo timestamp) minus the `oml.outbox.created_at` of the
    oldest of the tenant's ops in the batch (`oml.batch_start`, `oml.batch_end`]."""
    found: list[CommitLag] = []
    for table_id, uri in tables:
        table = lake.open(uri)
        if table is None:
            continue
        for entry in table.history():
            if "oml.batch_end" not in entry:
                continue  # maintenance commits carry no batch
            found.append(
                CommitLag(
                    table=str(table_id),
                    version=int(entry["version"]),
                    committed_at=dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC),
                    batch_start=int(entry["oml.batch_start"]),
                    batch_end=int(entry["oml.batch_end"]),
                    oldest_op_at=None,
                )
            )
    if not found:
        return []
    # One query: the oldest op of the tenant in each distinct batch.
    bounds = sorted({(c.batch_start, c.batch_end) for c in found})
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(
            queries.OLDEST_OP_PER_BATCH,
            ([lo for lo, _ in bounds], [hi for _, hi in bounds], tenant_id),
        ).fetchall()
    oldest = {(lo, hi): at for lo, hi, at in rows}
    return sorted(
        (
            dataclasses.replace(c, oldest_op_at=oldest.get((c.batch_start, c.batch_end)))
            for c in found
        ),
        key=lambda c: (c.table, c.version),
    )


def lag_summary(commits: list[CommitLag]) -> list[dict[str, Any]]:
    """Per table: writer commits in the log, the latest commit's lag, the median and worst."""
    by_table: dict[str, list[CommitLag]] = {}
    for c in commits:
        by_table.setdefault(c.table, []).append(c)
    rows = []
    for table, cs in sorted(by_table.items()):
        lags = sorted(c.lag_seconds for c in cs if c.lag_seconds is not None)
        latest = max(cs, key=lambda c: c.version)
        rows.append(
            {
                "table": table,
                "commits": len(cs),
                "latest_version": latest.version,
                "latest_batch_end": latest.batch_end,
                "latest_lag_seconds": latest.lag_seconds,
                "median_lag_seconds": lags[len(lags) // 2] if lags else None,
                "max_lag_seconds": lags[-1] if lags else None,
            }
        )
    return rows


def txn_version(lake: Lake, uri: str) -> int | None:
    table = lake.open(uri)
    return None if table is None else table.transaction_version(APP_ID)
