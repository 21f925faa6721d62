"""Reading a batch of a tenant's outbox as Arrow columns (ADBC), with bronze's columns extracted
and checked in PostgreSQL.

For every `journal.event` row the query extracts the bronze columns in their lake types (base64
decoded to bytea, instants cast to timestamptz) and sets `event_ok` when the row passes every
check of the op catalog that SQL can express: the declared fields and no others, each of its
type and format, the api key known and the tenant's, the payload's journal_seq the outbox row's.
Those rows go to bronze as columns, never as Python objects. Every other row — other ops, and
events the checks do not clear — comes with its payload as JSON text for the catalog's
per-op path, which stays the one place a refusal's reason is written. The SQL checks are
therefore conservative: a row they clear is one the catalog accepts with the same values (a
property test holds them to that); a row they do not clear is simply looked at by the catalog.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg
import pyarrow as pa

from .tables import PROVENANCES

_UUID = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_POSITIVE = "^[1-9][0-9]{0,17}$"
_B64_32 = "^[A-Za-z0-9+/]{43}=$"
_B64_64 = "^[A-Za-z0-9+/]{86}==$"
_B64_NONEMPTY = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
# The producers' canonical instant (RFC 3339, UTC, up to microseconds); any other lawful form
# takes the per-op path.
_INSTANT = (
    r"^([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|\+00:00)$"
)
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
_REQUIRED = ("journal_seq", "event_id", "event_type", "at", "prev_hash", "hash", "sig")
_REQUIRED += ("signed_bytes", "payload", "principal", "api_key_id")


def _text(name: str) -> str:
    return f"(jsonb_typeof(p->'{name}') = 'string' AND p->>'{name}' <> '')"


def _matches(name: str, pattern: str) -> str:
    return f"(jsonb_typeof(p->'{name}') = 'string' AND p->>'{name}' ~ '{pattern}')"


def _optional(name: str, check: str) -> str:
    return f"(NOT p ? '{name}' OR jsonb_typeof(p->'{name}') = 'null' OR {check})"


def _positive(name: str) -> str:
    return f"(jsonb_typeof(p->'{name}') = 'number' AND p->>'{name}' ~ '{_POSITIVE}')"


_DAY_EXISTS = """(
  substr(p->>'at', 1, 4)::int >= 1 AND (
    substr(p->>'at', 9, 2)::int <= 28
    OR (substr(p->>'at', 9, 2)::int <= 30 AND substr(p->>'at', 6, 2)::int <> 2)
    OR (substr(p->>'at', 9, 2)::int = 31 AND substr(p->>'at', 6, 2)::int IN (1,3,5,7,8,10,12))
    OR (substr(p->>'at', 6, 2)::int = 2 AND substr(p->>'at', 9, 2)::int = 29
        AND substr(p->>'at', 1, 4)::int % 4 = 0
        AND (substr(p->>'at', 1, 4)::int % 100 <> 0 OR substr(p->>'at', 1, 4)::int % 400 = 0))
  ))"""

_PROVENANCES = ", ".join(f"'{p}'" for p in PROVENANCES)
_DECLARED = ", ".join(f"'{f}'" for f in EVENT_FIELDS)

# Checks that cannot fail, whatever `p` holds once it is an object. PostgreSQL does not promise
# to evaluate AND's operands in order, so casts wait behind CASE (below).
_SHAPE_CHECKS = (
    f"NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p) k WHERE k NOT IN ({_DECLARED}))",
    _positive("journal_seq"),
    _matches("event_id", _UUID),
    _text("event_type"),
    _matches("at", _INSTANT),
    _matches("prev_hash", _B64_32),
    _matches("hash", _B64_32),
    _matches("sig", _B64_64),
    _matches("signed_bytes", _B64_NONEMPTY),
    _text("payload"),
    _text("principal"),
    _text("api_key_id"),
    _optional("artifact_id", _matches("artifact_id", _UUID)),
    _optional("version", _positive("version")),
    _optional("workarea_id", _matches("workarea_id", _UUID)),
    _optional("simulation_id", _matches("simulation_id", _UUID)),
    _optional(
        "provenance",
        f"(jsonb_typeof(p->'provenance') = 'string' AND p->>'provenance' IN ({_PROVENANCES}))",
    ),
    "key_tenant IS NOT NULL AND key_tenant = tenant_id",
)
# Checks with casts, run only once every shape check has passed.
_VALUE_CHECKS = ("(p->>'journal_seq')::bigint = coalesce(origin, journal_seq)", _DAY_EXISTS)

EVENT_OK = f"""coalesce(CASE WHEN op = 'journal.event' AND jsonb_typeof(p) = 'object' THEN
    CASE WHEN {" AND ".join(_SHAPE_CHECKS)} THEN {" AND ".join(_VALUE_CHECKS)} ELSE false END
  ELSE false END, false)"""


def _column(expression: str) -> str:
    return f"CASE WHEN event_ok THEN {expression} END"


# $1 tenant, $2 the seq after which the batch starts, $3 most ops, $4 most payload bytes (the
# first op is always taken, so a batch is never empty while ops are pending).
BATCH_SQL = f"""
WITH batch AS (
  SELECT o.seq, o.tenant_id, o.journal_seq, o.op, o.payload AS p,
         d.journal_seq AS origin, k.tenant_id AS key_tenant
  FROM oml.outbox o
  LEFT JOIN oml.lake_dead_letter d ON d.requeued_id = o.id
  LEFT JOIN oml.api_keys k ON o.op = 'journal.event' AND k.api_key_id = o.payload->>'api_key_id'
  WHERE o.tenant_id = $1::uuid AND o.seq > $2 AND o.seq IS NOT NULL
  ORDER BY o.seq
  LIMIT $3
), sized AS (
  SELECT *, sum(pg_column_size(p)) OVER (ORDER BY seq) AS cumulative_bytes FROM batch
), checked AS MATERIALIZED (
  SELECT *, {EVENT_OK} AS event_ok
  FROM sized
  WHERE cumulative_bytes <= $4 OR seq = (SELECT min(seq) FROM batch)
)
SELECT seq, journal_seq, op, origin AS origin_journal_seq, event_ok,
  (SELECT count(*) FROM batch) AS fetched_ops,
  CASE WHEN event_ok THEN NULL ELSE p::text END AS payload_json,
  {_column("tenant_id::text")} AS tenant_id,
  {_column("(p->>'journal_seq')::bigint")} AS event_journal_seq,
  {_column("p->>'event_id'")} AS event_id,
  {_column("p->>'event_type'")} AS event_type,
  {_column("(p->>'at')::timestamptz")} AS at,
  {_column("decode(p->>'prev_hash', 'base64')")} AS prev_hash,
  {_column("decode(p->>'hash', 'base64')")} AS hash,
  {_column("decode(p->>'sig', 'base64')")} AS sig,
  {_column("decode(p->>'signed_bytes', 'base64')")} AS signed_bytes,
  {_column("p->>'payload'")} AS payload,
  {_column("p->>'principal'")} AS principal,
  {_column("p->>'api_key_id'")} AS api_key_id,
  {_column("p->>'artifact_id'")} AS artifact_id,
  {_column("(p->>'version')::bigint")} AS version,
  {_column("p->>'workarea_id'")} AS workarea_id,
  {_column("p->>'simulation_id'")} AS simulation_id,
  {_column("p->>'provenance'")} AS provenance
FROM checked
ORDER BY seq
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
        return n > 0 and (n == self.max_ops or n < self.columns["fetched_ops"][0].as_py())

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
                # A batch's sorts and window stay in memory (the default 4 MB spills to disk).
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
