"""Reading a batch of a tenant's outbox as Arrow columns (ADBC).

For every `journal.event` row whose payload is a JSON object, the query returns each field as
text (`->>`), the JSON type of the fields whose check needs it (`queries.TYPED_FIELDS`), whether the
object has fields the catalog does not declare, and whether the tenant owns its api key.
`bronze.py` checks those columns and turns the rows that pass into bronze rows without a Python
object per row. Every row also comes with its whole payload as JSON text (`payload_json`): the
rows the catalog folds (every other op, and the events the checks do not clear or the batch's
order leaves to it) are parsed from it once, with no second read of the outbox (ADR 0064). PostgreSQL does no format checks here: its regular expressions cost microseconds per
field and row, where Arrow's (RE2) cost nanoseconds, and a cast it cannot make would fail the
whole query. The statement's rows keep the index's seq order from scan to output (decision
0022).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import pyarrow as pa

from oml_dagster.lake.queries import (
    BATCH_SQL,
    FETCH_WORK_MEM,
    SCOPE_NUMBERED,
    TENANT_ROLE,
    tenant_text,
)


@dataclass
class Batch:
    """One batch of a tenant's sequenced ops, in seq order, as Arrow columns."""

    after: int
    columns: pa.Table
    max_ops: int

    @property
    def more(self) -> bool:
        """Whether the outbox may hold more sequenced ops right after this batch."""
        n = len(self)
        # full, or the byte cap cut it before an op the scan had read
        return n > 0 and (n == self.max_ops or self.columns["followed"][n - 1].as_py())

    def head(self, max_ops: int) -> Batch:
        """The batch a fetch with the smaller cap `max_ops` reads: this one's first ops. A
        tenant's ops after `after` are fixed once sequenced (a later cut numbers above every
        seq), and the byte cap counts from the batch's first op, so the first ops of a batch
        are a batch."""
        return Batch(self.after, self.columns.slice(0, max_ops), max_ops)

    @property
    def seqs(self) -> list[int]:
        seqs: list[int] = self.columns.column("seq").to_pylist()
        return seqs

    def __len__(self) -> int:
        return int(self.columns.num_rows)


# A run of 19 digits: an integer orjson would read as a float (past 64 bits), where PostgreSQL's
# numeric and `json.loads` keep it exact.
_LONG_NUMBER = re.compile(r"[0-9]{19}")


def parse_payload(text: str) -> Any:
    """An outbox payload from the JSON text the fetch carried: orjson, except for text with a
    number orjson would not read exactly (it is then read as `json.loads` reads it)."""
    if _LONG_NUMBER.search(text):
        return json.loads(text)
    return orjson.loads(text)


def second_conninfo(conn: psycopg.Connection) -> str:
    """The connection string of `conn`, password included, for a second connection of the same
    login (the fetcher's ADBC connection, the drain's cut ahead)."""
    params = conn.info.get_parameters()
    if conn.info.password:
        params["password"] = conn.info.password
    return psycopg.conninfo.make_conninfo(**params)


class Fetcher:
    """Fetches batches over its own ADBC connection (opened on first use, kept until close).
    One fetch at a time: a fetch waits for the one under way (on the worker thread) to end."""

    def __init__(self, conn: psycopg.Connection):
        self._conninfo = second_conninfo(conn)
        self._adbc: Any = None  # an ADBC DB-API connection (the driver ships no types)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def fetch(self, tenant_id: str, *, after: int, max_ops: int, max_bytes: int) -> Batch:
        import adbc_driver_postgresql.dbapi as adbc

        with self._lock:
            if self._adbc is None:
                self._adbc = adbc.connect(self._conninfo, autocommit=True)
                with self._adbc.cursor() as cur:
                    cur.execute(FETCH_WORK_MEM)
            # The statement runs in the tenant's scope (queries.tenant_scope's role and id): a
            # transaction of its own.
            with self._adbc.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    cur.execute(SCOPE_NUMBERED, parameters=(TENANT_ROLE, tenant_text(tenant_id)))
                    cur.fetchall()
                    cur.execute(BATCH_SQL, parameters=(tenant_id, after, max_ops, max_bytes))
                    columns = cur.fetch_arrow_table()
                except BaseException:
                    with contextlib.suppress(Exception):
                        cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return Batch(after, columns, max_ops)

    def fetch_async(
        self, tenant_id: str, *, after: int, max_ops: int, max_bytes: int
    ) -> Future[Batch]:
        """`fetch` on the fetcher's worker thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="oml-fetch")
        return self._pool.submit(
            self.fetch, tenant_id, after=after, max_ops=max_ops, max_bytes=max_bytes
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
