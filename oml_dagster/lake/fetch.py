"""Reading a batch of a tenant's outbox as Arrow columns (ADBC).

For every `journal.event` row whose payload is a JSON object, the query returns each field as
text (`->>`), the JSON type of the fields whose check needs it (`TYPED_FIELDS`), whether the
object has fields the catalog does not declare, and whether the tenant owns its api key.
`bronze.py` checks those columns and turns the rows that pass into bronze rows without a Python
object per row. Every other row comes with its payload as JSON text for the catalog's per-op
path. PostgreSQL does no format checks here: its regular expressions cost microseconds per
field and row, where Arrow's (RE2) cost nanoseconds, and a cast it cannot make would fail the
whole query. The statement's rows keep the index's seq order from scan to output (decision
0022).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg
import pyarrow as pa

EVENT_FIELDS = (
    "journal_seq",
    "event_id",
    "event_type",
    "at",
    "prev_hash",
    "hash",
    "sig",
    "signed_bytes",
    "payload",
    "principal",
    "api_key_id",
    "artifact_id",
    "version",
    "workarea_id",
    "simulation_id",
    "provenance",
)
# The fields whose JSON type the checks need: a number's text ("1") passes the check of a string
# field that only asks for non-empty text or base64, and a string's text passes the integer
# pattern. No other value's text can match the remaining fields' patterns (a UUID, an instant,
# a padded digest, a provenance word) unless it is a string, so their type is not fetched.
TYPED_FIELDS = (
    "journal_seq",
    "version",
    "event_type",
    "signed_bytes",
    "payload",
    "principal",
    "api_key_id",
)
_FIELDS = ",\n  ".join(
    [f"k.p ->> '{name}' AS f_{name}" for name in EVENT_FIELDS]
    + [f"jsonb_typeof(k.p -> '{name}') AS t_{name}" for name in TYPED_FIELDS]
)
_DECLARED = "{" + ",".join(EVENT_FIELDS) + "}"

# $1 tenant, $2 the seq after which the batch starts, $3 most ops, $4 most payload bytes (the
# first op is always taken, so a batch is never empty while ops are pending). The rows keep the
# index's seq order from the scan to the output (no sort, no hash join): the dead letter an op
# was requeued from is looked up by index, the api key's owner in a hashed list of the tenant's
# keys.
BATCH_SQL = f"""
SELECT k.seq, k.journal_seq, k.op, k.event_object, k.followed,
  (SELECT d.journal_seq FROM oml.lake_dead_letter d WHERE d.requeued_id = k.id)
    AS origin_journal_seq,
  k.tenant_id::text AS tenant_id,
  CASE WHEN k.event_object THEN NULL ELSE k.p::text END AS payload_json,
  CASE WHEN k.event_object THEN k.p - '{_DECLARED}'::text[] = '{{}}'::jsonb END AS declared_only,
  CASE WHEN k.event_object THEN k.p ->> 'api_key_id' IN (
    SELECT a.api_key_id FROM oml.api_keys a WHERE a.tenant_id = $1::uuid
  ) END AS own_key,
  {_FIELDS}
FROM (
  SELECT b.*, b.op = 'journal.event' AND jsonb_typeof(b.p) = 'object' AS event_object,
    sum(pg_column_size(b.p)) OVER w AS cumulative_bytes,
    row_number() OVER w AS n,
    lead(b.seq) OVER w IS NOT NULL AS followed
  FROM (
    SELECT o.id, o.seq, o.tenant_id, o.journal_seq, o.op, o.payload AS p
    FROM oml.outbox o
    WHERE o.tenant_id = $1::uuid AND o.seq > $2 AND o.seq IS NOT NULL
    ORDER BY o.seq
    LIMIT $3
  ) b
  WINDOW w AS (ORDER BY b.seq)
) k
WHERE k.cumulative_bytes <= $4 OR k.n = 1
ORDER BY k.seq
"""


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

    @property
    def seqs(self) -> list[int]:
        return self.columns.column("seq").to_pylist()

    def __len__(self) -> int:
        return self.columns.num_rows


def _conninfo(conn: psycopg.Connection) -> str:
    """The connection string of `conn` for a second connection, password included."""
    params = conn.info.get_parameters()
    if conn.info.password:
        params["password"] = conn.info.password
    return psycopg.conninfo.make_conninfo(**params)


class Fetcher:
    """Fetches batches over its own ADBC connection (opened on first use, kept until close)."""

    def __init__(self, conn: psycopg.Connection):
        self._conninfo = _conninfo(conn)
        self._adbc = None
        self._pool: ThreadPoolExecutor | None = None

    def fetch(self, tenant_id: str, after: int, max_ops: int, max_bytes: int) -> Batch:
        import adbc_driver_postgresql.dbapi as adbc

        if self._adbc is None:
            self._adbc = adbc.connect(self._conninfo, autocommit=True)
            with self._adbc.cursor() as cur:
                # A batch's window stays in memory (the default 4 MB spills to disk).
                cur.execute("SET work_mem = '256MB'")
        with self._adbc.cursor() as cur:
            cur.execute(BATCH_SQL, parameters=(tenant_id, after, max_ops, max_bytes))
            return Batch(after, cur.fetch_arrow_table(), max_ops)

    def fetch_async(self, tenant_id: str, after: int, max_ops: int, max_bytes: int):
        """`fetch` on a worker thread; the fetcher is not to be used until it is done."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="oml-fetch")
        return self._pool.submit(self.fetch, tenant_id, after, max_ops, max_bytes)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
