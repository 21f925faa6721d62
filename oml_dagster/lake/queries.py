"""Every statement the lake-writer runs against schema `oml` (DESIGN §2), by the table it reads
or writes: migrations, the sequencer, the outbox batch fetch, verdicts, the frontier cache, dead
letters, policies, bodies and api keys, and the reads of the reconciler, the erasure evidence and
the analytics. The core, the Dagster layer and the command line run these and no other SQL on
`oml`; the simulator (`oml_dagster.simulate`) plays the producer and keeps its own.

psycopg statements take `%s` / `%(name)s` parameters (a literal `%` is `%%`); the batch fetch
runs over ADBC and takes `$1`..`$4`. This module imports nothing of the lake.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

# --- migrations (db.py) ------------------------------------------------------------------------

# Serializes concurrent `db upgrade` runs (an arbitrary, project-owned key).
MIGRATION_LOCK = 0x6F6D6C00
ADVISORY_XACT_LOCK = "SELECT pg_advisory_xact_lock(%s)"
CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS oml"
CREATE_MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS oml.schema_migrations ("
    " version integer PRIMARY KEY, name text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)
APPLIED_MIGRATIONS = "SELECT version FROM oml.schema_migrations"
RECORD_MIGRATION = "INSERT INTO oml.schema_migrations (version, name) VALUES (%s, %s)"
ROLE_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)"

# --- rewrites of a table (rewrites.py) ---------------------------------------------------------

# One OPTIMIZE (bin-pack or Z-order) of a table at a time, across every process (the writer's
# packing on the way, maintenance runs, the command line): two rewrites of the same files both
# commit in delta-rs 1.6 and double the rows (ADR 0033). Keyed by the class below and the hash
# of "<tenant>:<table name>"; session locks, released by the caller or with the connection.
REWRITE_LOCK = 0x6F6D6C02
REWRITE_LOCK_TAKE = "SELECT pg_advisory_lock(%s, hashtext(%s))"
REWRITE_LOCK_TRY = "SELECT pg_try_advisory_lock(%s, hashtext(%s))"
REWRITE_LOCK_FREE = "SELECT pg_advisory_unlock(%s, hashtext(%s))"

# --- the sequencer (sequencer.py) --------------------------------------------------------------

# Serializes sequencer runs (an arbitrary, project-owned key).
SEQUENCER_LOCK = 0x6F6D6C01
MAX_SEQ = "SELECT COALESCE(max(seq), 0) FROM oml.outbox"
CLOCK = "SELECT clock_timestamp()"

# One statement: take each tenant's first pending rows up to its quota (the partial index
# outbox_unsequenced hands them over in order, so a cut reads at most the quotas' sum, the
# cut's limit, however long the backlog), keep the contiguous run, number it after the current
# maximum seq. The quotas are the cut's fair shares (sequencer.quotas), so no cap follows.
# Returns per tenant: rows numbered, first and last seq, last journal_seq.
SEQUENCE_ASSIGN = """
WITH pending AS (
    SELECT o.id, o.tenant_id, o.journal_seq,
           COALESCE(t.last_journal_seq,
                    min(o.journal_seq) OVER (PARTITION BY o.tenant_id) - 1) AS base
    FROM unnest(%(tenants)s::uuid[], %(quotas)s::bigint[]) AS q(tenant_id, quota)
    CROSS JOIN LATERAL (
        SELECT id, tenant_id, journal_seq FROM oml.outbox
        WHERE tenant_id = q.tenant_id AND seq IS NULL
        ORDER BY journal_seq, id
        LIMIT q.quota
    ) o
    LEFT JOIN oml.sequencer_tenant t ON t.tenant_id = o.tenant_id
), ranked AS (
    SELECT id, tenant_id, journal_seq, base,
           dense_rank() OVER (PARTITION BY tenant_id, journal_seq <= base
                              ORDER BY journal_seq) AS step
    FROM pending
), numbered AS (
    SELECT id, tenant_id, journal_seq,
           %(start)s + row_number() OVER (ORDER BY tenant_id, journal_seq, id) AS seq
    FROM ranked
    WHERE journal_seq <= base OR journal_seq - step = base
), assigned AS (
    UPDATE oml.outbox o SET seq = n.seq, sequenced_at = clock_timestamp()
    FROM numbered n WHERE o.id = n.id
    RETURNING n.tenant_id, n.journal_seq, n.seq
)
SELECT tenant_id::text, count(*), min(seq), max(seq), max(journal_seq)
FROM assigned GROUP BY tenant_id
"""

# SEQUENCE_ASSIGN finds each row it numbers by the primary key. The planner, which expects a
# fraction of the rows a cut numbers, otherwise hashes them and scans the whole outbox for
# their ids: on every cut, at a cost that grows with the outbox and not with the cut (a 1M-row
# outbox, a 100,000-row cut: 3.1-3.3 s against 2.1 s). Set for the statement, set back to the
# defaults after it; the transaction's end restores whatever the session had.
INDEX_JOINS_ONLY = "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off"
ANY_JOINS = "SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT"

# The cut's own settings, for its transaction: no JIT (a cut of 100,000 rows passes the
# planner's JIT threshold and compiled 14 functions it then ran once: 0.1-0.3 s of a 2.5-2.9 s
# cut) and room to number the cut in memory (the default 4 MB sorted 100,000 rows on disk;
# bench/RESULTS.md).
CUT_SETTINGS = "SET LOCAL jit = off; SET LOCAL work_mem = '64MB'"

# Whether any row is unsequenced: the first entry of outbox_unsequenced, which the ORDER BY
# makes the planner read whatever its statistics say. The counts below are run only when it
# finds one: right after a large cut the statistics still count the rows it numbered as
# unsequenced, and the planner scanned the whole outbox for them (80 ms per 200,000 rows,
# twice per cut that found nothing, and a drain until idle made one per pass).
ANY_UNSEQUENCED = (
    "SELECT 1 FROM oml.outbox WHERE seq IS NULL ORDER BY tenant_id, journal_seq, id LIMIT 1"
)

# Pending rows per tenant: an index-only scan of outbox_unsequenced.
SEQUENCE_PENDING = (
    "SELECT tenant_id::text, count(*) FROM oml.outbox WHERE seq IS NULL GROUP BY tenant_id"
)

# Every tenant of a cut in one statement (one round trip per tenant was a second per 1,000
# tenants' cut on a loaded machine).
SEQUENCER_TENANT_UPSERT = (
    "INSERT INTO oml.sequencer_tenant (tenant_id, last_journal_seq, last_seq)"
    " SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::bigint[])"
    " ON CONFLICT (tenant_id) DO UPDATE SET"
    " last_journal_seq = GREATEST(oml.sequencer_tenant.last_journal_seq,"
    " EXCLUDED.last_journal_seq), last_seq = EXCLUDED.last_seq, updated_at = now()"
)

# Rows still unsequenced after a cut, per tenant, with the tenant's last sequenced journal_seq.
UNSEQUENCED_BY_TENANT = """
SELECT o.tenant_id::text, count(*), min(o.journal_seq), min(o.created_at),
       max(t.last_journal_seq)
FROM oml.outbox o LEFT JOIN oml.sequencer_tenant t ON t.tenant_id = o.tenant_id
WHERE o.seq IS NULL
GROUP BY o.tenant_id
"""

# Tenants with sequenced ops beyond what the frontier cache says is drained (every core table:
# curated tables are left out). `PENDING_TENANTS_OF` narrows it; `PENDING_TENANTS_ORDER` ends it.
PENDING_TENANTS = """
        SELECT s.tenant_id::text, s.last_seq, COALESCE(f.drained, 0)
        FROM oml.sequencer_tenant s
        LEFT JOIN (SELECT tenant_id, min(batch_end) AS drained FROM oml.lake_frontier
                   WHERE table_name NOT LIKE 'gold.curated/%%' GROUP BY tenant_id) f
          ON f.tenant_id = s.tenant_id
        WHERE s.last_seq > COALESCE(f.drained, 0)
          AND NOT EXISTS (SELECT 1 FROM oml.lake_tenant_purge p WHERE p.tenant_id = s.tenant_id)
    """
PENDING_TENANTS_OF = " AND s.tenant_id = ANY(%s::uuid[])"
PENDING_TENANTS_ORDER = " ORDER BY s.tenant_id"

# --- the batch fetch (fetch.py, over ADBC) -----------------------------------------------------

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
  k.p::text AS payload_json,
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
# A batch's window stays in memory (the default 4 MB spills to disk).
FETCH_WORK_MEM = "SET work_mem = '256MB'"

# --- the outbox --------------------------------------------------------------------------------

OUTBOX_COUNT_IN = "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND seq > %s AND seq <= %s"
# The read-only fold's stream of a tenant's sequenced ops (the reconciler).
OUTBOX_THROUGH = (
    "SELECT seq, journal_seq, op, payload FROM oml.outbox"
    " WHERE tenant_id = %s AND seq IS NOT NULL AND seq <= %s ORDER BY seq"
)
# A tenant's erase acts with their dead letter, if any (the erasure evidence).
ERASE_ACTS = (
    "SELECT o.id, o.seq, o.payload, o.created_at, d.seq IS NOT NULL,"
    " d.seq IS NOT NULL AND d.requeued_at IS NULL AND d.resolved_at IS NULL, d.reason"
    " FROM oml.outbox o LEFT JOIN oml.lake_dead_letter d ON d.seq = o.seq"
    " WHERE o.tenant_id = %s AND o.op = 'claim.erase' ORDER BY o.id"
)
# The oldest op of a tenant in each batch (lo, hi] (the analytics' lake lag).
OLDEST_OP_PER_BATCH = (
    "SELECT b.lo, b.hi, min(o.created_at) FROM unnest(%s::bigint[], %s::bigint[])"
    " AS b(lo, hi) JOIN oml.outbox o ON o.tenant_id = %s AND o.seq > b.lo"
    " AND o.seq <= b.hi GROUP BY b.lo, b.hi"
)
# journal_seqs of acts none of whose area ops the writer applied (areas-at's replay).
REFUSED_AREA_ACTS = (
    "SELECT o.journal_seq FROM oml.outbox o"
    " LEFT JOIN oml.lake_dead_letter d ON d.seq = o.seq AND d.requeued_at IS NULL"
    " WHERE o.tenant_id = %s AND o.op LIKE 'area.%%'"
    " GROUP BY o.journal_seq HAVING bool_and(d.seq IS NOT NULL)"
)

# --- bodies and api keys -----------------------------------------------------------------------

BODIES_OF = (
    "SELECT b.artifact_id::text, b.version, b.body_ciphertext FROM oml.claim_bodies b"
    " JOIN unnest(%s::uuid[], %s::bigint[]) AS k(artifact_id, version)"
    " ON b.artifact_id = k.artifact_id AND b.version = k.version WHERE b.tenant_id = %s"
)
STORED_BODIES = "SELECT artifact_id::text, version FROM oml.claim_bodies WHERE tenant_id = %s"
# Owners of any tenant's keys: a tenant's scope reaches them through this function alone
# (migration 0004), which hands out ids and owners, never the keys.
API_KEY_OWNERS = "SELECT api_key_id, tenant_id FROM oml.api_key_owners(%s::text[])"
PUBLIC_KEYS = "SELECT api_key_id, tenant_id::text, public_key FROM oml.api_keys"

# --- verdicts ----------------------------------------------------------------------------------

DECIDED_THROUGH = "SELECT decided_through FROM oml.lake_verdicts WHERE tenant_id = %s"
VERDICTS_UPSERT = (
    "INSERT INTO oml.lake_verdicts (tenant_id, decided_through) VALUES (%s, %s)"
    " ON CONFLICT (tenant_id) DO UPDATE SET decided_through ="
    " GREATEST(oml.lake_verdicts.decided_through, EXCLUDED.decided_through),"
    " updated_at = now()"
)

# --- the frontier cache ------------------------------------------------------------------------

# Every table of a tenant in one statement: (tenant_id, batch_end, table names, txn versions,
# table versions), the last three arrays in step.
FRONTIER_UPSERT = (
    "INSERT INTO oml.lake_frontier"
    " (tenant_id, table_name, batch_end, txn_version, table_version)"
    " SELECT %s, t.name, %s, t.txn, t.version"
    " FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS t (name, txn, version)"
    " ON CONFLICT (tenant_id, table_name) DO UPDATE SET"
    " batch_end = EXCLUDED.batch_end, txn_version = EXCLUDED.txn_version,"
    " table_version = EXCLUDED.table_version, updated_at = now()"
)
FRONTIER_BATCH_ENDS = (
    "SELECT table_name, batch_end, txn_version FROM oml.lake_frontier WHERE tenant_id = %s"
)
FRONTIER_VERSIONS = (
    "SELECT table_name, txn_version, table_version FROM oml.lake_frontier WHERE tenant_id = %s"
)
# When each tenant's last drain finished (any table's frontier row is written by every completed
# run, whatever it committed). One aggregate query over the tenants named.
DRAINED_AT = """
SELECT tenant_id::text, max(updated_at) FROM oml.lake_frontier
WHERE tenant_id = ANY(%s::uuid[]) GROUP BY tenant_id
"""

# Each tenant's lag (freshness.py). Only tenants with something waiting come back: a tenant whose
# sequencer row is drained and that has no unsequenced row is fresh (lag 0). The per-tenant
# lateral scan reads the (tenant_id, seq) index from drained_through up: the waiting rows, not the
# tenant's history. The three filters are empty, or `TENANT_LAGS_OF`'s for some tenants.
TENANT_LAGS = """
WITH drained AS (
    SELECT tenant_id, min(batch_end) AS drained FROM oml.lake_frontier
    WHERE table_name NOT LIKE 'gold.curated/%%' {frontier_filter} GROUP BY tenant_id
), sequenced AS (
    SELECT s.tenant_id, s.last_seq, COALESCE(d.drained, 0) AS drained, w.ops, w.oldest
    FROM oml.sequencer_tenant s
    LEFT JOIN drained d ON d.tenant_id = s.tenant_id
    CROSS JOIN LATERAL (
        SELECT count(*) AS ops, min(o.created_at) AS oldest FROM oml.outbox o
        WHERE o.tenant_id = s.tenant_id AND o.seq > COALESCE(d.drained, 0)
    ) w
    WHERE s.last_seq > COALESCE(d.drained, 0) {sequencer_filter}
), unsequenced AS (
    SELECT tenant_id, count(*) AS ops, min(created_at) AS oldest
    FROM oml.outbox WHERE seq IS NULL {outbox_filter} GROUP BY tenant_id
)
SELECT COALESCE(s.tenant_id, u.tenant_id)::text, s.last_seq, COALESCE(s.drained, f.drained, 0),
       COALESCE(s.ops, 0), COALESCE(u.ops, 0), LEAST(s.oldest, u.oldest),
       greatest(extract(epoch FROM clock_timestamp() - LEAST(s.oldest, u.oldest)), 0)::float8
FROM sequenced s
FULL JOIN unsequenced u ON u.tenant_id = s.tenant_id
LEFT JOIN drained f ON f.tenant_id = COALESCE(s.tenant_id, u.tenant_id)
"""
TENANT_LAGS_ALL = {"frontier_filter": "", "sequencer_filter": "", "outbox_filter": ""}
TENANT_LAGS_OF = {
    "frontier_filter": "AND tenant_id = ANY(%s::uuid[])",
    "sequencer_filter": "AND s.tenant_id = ANY(%s::uuid[])",
    "outbox_filter": "AND tenant_id = ANY(%s::uuid[])",
}

# --- dead letters ------------------------------------------------------------------------------

DEAD_LETTER_INSERT = (
    "INSERT INTO oml.lake_dead_letter (seq, tenant_id, journal_seq, op, payload, reason)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (seq) DO NOTHING"
)
REFUSED_IN = (
    "SELECT seq, reason FROM oml.lake_dead_letter WHERE tenant_id = %s AND seq > %s AND seq <= %s"
)
REFUSED_THROUGH = "SELECT seq FROM oml.lake_dead_letter WHERE tenant_id = %s AND seq <= %s"
# `DEAD_LETTERS_LIST` takes `DEAD_LETTERS_OF_TENANT` and `DEAD_LETTERS_OPEN` as it is asked, then
# `DEAD_LETTERS_ORDER`.
DEAD_LETTERS_LIST = (
    "SELECT seq, tenant_id::text, journal_seq, op, payload, reason, refused_at,"
    " requeued_at, requeued_by, requeued_id, resolved_at, resolved_by, resolution"
    " FROM oml.lake_dead_letter WHERE true"
)
DEAD_LETTERS_OF_TENANT = " AND tenant_id = %s"
# Open: neither re-enqueued nor resolved by an operator.
DEAD_LETTERS_OPEN = " AND requeued_at IS NULL AND resolved_at IS NULL"
DEAD_LETTERS_ORDER = " ORDER BY seq"
OPEN_DEAD_LETTERS = (
    "SELECT seq, op, payload, reason, refused_at FROM oml.lake_dead_letter"
    " WHERE tenant_id = %s AND requeued_at IS NULL AND resolved_at IS NULL ORDER BY seq"
)
OPEN_DEAD_LETTER_COUNTS = (
    "SELECT count(*), count(*) FILTER (WHERE op = 'claim.erase') FROM oml.lake_dead_letter"
    " WHERE tenant_id = %s AND requeued_at IS NULL AND resolved_at IS NULL"
)
DEAD_LETTER_TENANT = "SELECT tenant_id::text FROM oml.lake_dead_letter WHERE seq = %s"
DEAD_LETTER_FOR_REQUEUE = (
    "SELECT tenant_id, op, payload, requeued_at, resolved_at FROM oml.lake_dead_letter"
    " WHERE seq = %s FOR UPDATE"
)
LAST_JOURNAL_SEQ = "SELECT last_journal_seq FROM oml.sequencer_tenant WHERE tenant_id = %s"
REQUEUE_INTO_OUTBOX = (
    "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
    " VALUES (%s, %s, %s, %s) RETURNING id"
)
MARK_RESOLVED = (
    "UPDATE oml.lake_dead_letter SET resolved_at = now(), resolved_by = %s, resolution = %s"
    " WHERE seq = %s RETURNING resolved_at"
)
MARK_REQUEUED = (
    "UPDATE oml.lake_dead_letter SET requeued_at = now(), requeued_by = %s,"
    " requeued_id = %s WHERE seq = %s"
)

# --- policies ----------------------------------------------------------------------------------

# Every tenant Postgres knows: each has a policy row from its creation (DESIGN §2), and each
# tenant that ever had an op sequenced has a sequencer row (covers ops enqueued without a policy).
# The union is taken over uuids and sorted by the caller: at 10,000 tenants that is about a third
# cheaper than a union over text, and much cheaper than ORDER BY under a locale collation.
# A tenant whose purge has started is no longer one (`oml.lake_tenant_purge`, ADR 0076).
KNOWN_TENANTS = """
SELECT tenant_id::text FROM (
    SELECT tenant_id FROM oml.tenant_policy UNION SELECT tenant_id FROM oml.sequencer_tenant
    EXCEPT SELECT tenant_id FROM oml.lake_tenant_purge
) known
"""
# Whether any outbox row names the tenant (a producer's first ops, not yet sequenced).
TENANT_IN_OUTBOX = "SELECT EXISTS (SELECT 1 FROM oml.outbox WHERE tenant_id = %s)"
ERASURE_BOUND = "SELECT lake_erasure_bound FROM oml.tenant_policy WHERE tenant_id = %s"
# (ops sequenced above a seq, the oldest one's created_at) of a tenant.
OUTBOX_LAG = "SELECT count(*), min(created_at) FROM oml.outbox WHERE tenant_id = %s AND seq > %s"


# --- a tenant's departure (audit/export.py, audit/purge.py; migration tenant_departure) -------

DEPARTED_AT = "SELECT departed_at, lake_erasure_bound FROM oml.tenant_policy WHERE tenant_id = %s"
# Every departed tenant, its bound and how far its purge got (cross scope).
DEPARTURES = """
SELECT p.tenant_id::text, p.departed_at, p.lake_erasure_bound, r.state, r.finished_at
FROM oml.tenant_policy p LEFT JOIN oml.lake_tenant_purge r ON r.tenant_id = p.tenant_id
WHERE p.departed_at IS NOT NULL
ORDER BY p.tenant_id
"""
PURGE_ROW = (
    "SELECT state, requested_by, started_at, finished_at, removed, receipt"
    " FROM oml.lake_tenant_purge WHERE tenant_id = %s"
)
PURGE_START = (
    "INSERT INTO oml.lake_tenant_purge (tenant_id, state, requested_by, removed)"
    " VALUES (%s, 'purging', %s, %s) ON CONFLICT (tenant_id) DO NOTHING"
)
PURGE_REMOVED = (
    "UPDATE oml.lake_tenant_purge SET removed = %s WHERE tenant_id = %s AND state = 'purging'"
)
PURGE_FINISH = (
    "UPDATE oml.lake_tenant_purge SET state = 'purged', finished_at = %s, receipt = %s"
    " WHERE tenant_id = %s AND state = 'purging'"
)
OUTBOX_UNSEQUENCED = "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND seq IS NULL"
# The writer's own records of a tenant, removed by its purge (table name, statement).
PURGE_WRITER_ROWS = (
    ("lake_frontier", "DELETE FROM oml.lake_frontier WHERE tenant_id = %s"),
    ("lake_verdicts", "DELETE FROM oml.lake_verdicts WHERE tenant_id = %s"),
    ("lake_dead_letter", "DELETE FROM oml.lake_dead_letter WHERE tenant_id = %s"),
)

# --- monitoring (audit/metrics.py, write/counters.py; the `monitoring` migration) -------------

# Every known tenant (policy or sequencer) with the cut's position, the least batch end of its
# core tables in the frontier cache, when its last drain finished, its erasure bound, and
# PostgreSQL's clock: one row per tenant.
EXPORT_TENANTS = """
WITH drained AS (
    SELECT tenant_id, min(batch_end) FILTER (WHERE table_name NOT LIKE 'gold.curated/%%')
           AS drained, max(updated_at) AS drained_at
    FROM oml.lake_frontier GROUP BY tenant_id
)
SELECT k.tenant_id::text, s.last_seq, s.last_journal_seq, COALESCE(d.drained, 0), d.drained_at,
       extract(epoch FROM COALESCE(p.lake_erasure_bound, interval '7 days'))::float8,
       clock_timestamp()
FROM (SELECT tenant_id FROM oml.tenant_policy UNION SELECT tenant_id FROM oml.sequencer_tenant) k
LEFT JOIN oml.sequencer_tenant s ON s.tenant_id = k.tenant_id
LEFT JOIN oml.tenant_policy p ON p.tenant_id = k.tenant_id
LEFT JOIN drained d ON d.tenant_id = k.tenant_id
"""
# Open dead letters per tenant and op.
EXPORT_OPEN_DEAD_LETTERS = (
    "SELECT tenant_id::text, op, count(*) FROM oml.lake_dead_letter"
    " WHERE requeued_at IS NULL AND resolved_at IS NULL GROUP BY tenant_id, op"
)
# Per tenant, its erases not yet drained into its core tables and not refused: how many, and
# the oldest one's age by PostgreSQL's clock.
EXPORT_PENDING_ERASES = """
WITH drained AS (
    SELECT tenant_id, min(batch_end) AS drained FROM oml.lake_frontier
    WHERE table_name NOT LIKE 'gold.curated/%%' GROUP BY tenant_id
)
SELECT o.tenant_id::text, count(*),
       greatest(extract(epoch FROM clock_timestamp() - min(o.created_at)), 0)::float8
FROM oml.outbox o
LEFT JOIN drained d ON d.tenant_id = o.tenant_id
LEFT JOIN oml.lake_dead_letter l ON l.seq = o.seq
WHERE o.op = 'claim.erase' AND (o.seq IS NULL OR o.seq > COALESCE(d.drained, 0))
  AND l.seq IS NULL
GROUP BY o.tenant_id
"""
WRITER_COUNTERS = (
    "SELECT tenant_id::text, name, label, value, updated_at FROM oml.lake_writer_counters"
)
# A writer's increments since its last flush, added to the running totals.
WRITER_COUNTERS_ADD = """
INSERT INTO oml.lake_writer_counters (tenant_id, name, label, value)
SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::float8[])
ON CONFLICT (COALESCE(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid), name, label)
DO UPDATE SET value = oml.lake_writer_counters.value + EXCLUDED.value, updated_at = now()
"""
CHECK_RESULTS = (
    "SELECT tenant_id::text, check_name, findings, checked_at FROM oml.lake_check_results"
)
# A reconciler run's checks (a run of some checks leaves the others' last results as they are).
CHECK_RESULTS_RECORD = (
    "INSERT INTO oml.lake_check_results (tenant_id, check_name, findings)"
    " SELECT %s, * FROM unnest(%s::text[], %s::int[])"
    " ON CONFLICT (tenant_id, check_name) DO UPDATE SET findings = EXCLUDED.findings,"
    " checked_at = now()"
)

# --- row-level security scopes (migration 0004, ADR 0049) --------------------------------------
#
# Every statement on a tenant-scoped table of schema `oml` runs inside one of these transactions:
# `tenant_scope(conn, tenant)` takes role oml_lake_tenant, whose policies show and accept only the
# rows of that tenant (setting `oml.tenant_id`); `cross_scope(conn)` takes role oml_lake_cross, for
# the cross-tenant parts (the sequencer's cut, the pending list, the lag report, the tenant list,
# reports over every tenant), which reads every tenant's rows and writes only what the sequencer
# writes. Role and tenant are both LOCAL: they end with the transaction, so a connection handed
# back to a pool, or reused for the next tenant, carries neither. A login role that is a member of
# both roles and holds nothing of its own (README, "PostgreSQL roles") can run no statement on
# those tables outside a scope: a forgotten scope fails loudly instead of reading across tenants.

TENANT_ROLE = "oml_lake_tenant"
CROSS_ROLE = "oml_lake_cross"
# Role and tenant for the rest of the transaction (set_config's `true`: SET LOCAL).
SCOPE = "SELECT set_config('role', %s, true), set_config('oml.tenant_id', %s, true)"
# The same over ADBC (the batch fetch), which numbers its parameters.
SCOPE_NUMBERED = "SELECT set_config('role', $1, true), set_config('oml.tenant_id', $2, true)"


def tenant_text(tenant_id: str) -> str:
    """The tenant's id as the policies compare it; a ValueError names anything else."""
    try:
        return str(uuid.UUID(str(tenant_id)))
    except ValueError:
        raise ValueError(f"tenant {tenant_id!r} is not a UUID") from None


class TenantSession:
    """A connection acting for one tenant inside one transaction (`tenant_scope`). The reads and
    writes of a tenant batch's phase take it: their statements run in the transaction the phase
    opened at its boundary, in the tenant's role, and know the tenant from it."""

    __slots__ = ("conn", "tenant_id")

    def __init__(self, conn: psycopg.Connection, tenant_id: str):
        self.conn = conn
        self.tenant_id = tenant_id

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> psycopg.Cursor[Any]:
        return self.conn.execute(statement, params)


# The tenant a transaction acts for (empty or NULL outside a tenant's scope).
CURRENT_TENANT = "SELECT current_setting('oml.tenant_id', true)"


@contextmanager
def tenant_scope(conn: psycopg.Connection, tenant_id: str) -> Iterator[TenantSession]:
    """A transaction on `conn` acting for `tenant_id` alone, as a session to run statements in.
    Inside a transaction already open the scope is a savepoint, and role and tenant hold until
    that transaction ends; inside another tenant's scope it is refused, as it would leave that
    tenant's statements in this one's role and id."""
    tenant = tenant_text(tenant_id)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        row = conn.execute(CURRENT_TENANT).fetchone()
        acting = row[0] if row else None
        if acting and acting != tenant:
            raise RuntimeError(f"a scope of tenant {tenant} inside the session of tenant {acting}")
    with conn.transaction():
        conn.execute(SCOPE, (TENANT_ROLE, tenant))
        yield TenantSession(conn, tenant)


@contextmanager
def cross_scope(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """A transaction on `conn` for the cross-tenant parts."""
    with conn.transaction():
        conn.execute(SCOPE, (CROSS_ROLE, ""))
        yield conn


def scalar(cursor: psycopg.Cursor[Any]) -> Any:
    """The first column of a statement's one row (an aggregate's, a RETURNING's); LookupError
    when it returned none."""
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the statement returned no row")
    return row[0]


# --- small reads the Dagster layer runs --------------------------------------------------------


def ops_in(conn: psycopg.Connection, tenant_id: str, after: int, through: int) -> int:
    """How many of the tenant's outbox rows have a seq in (after, through]."""
    return int(scalar(conn.execute(OUTBOX_COUNT_IN, (tenant_id, after, through))))


def frontier_versions(conn: psycopg.Connection, tenant_id: str) -> dict[str, tuple[int, int]]:
    """table name -> (txn_version, table_version) of the tenant's frontier cache."""
    return {
        name: (txn, version) for name, txn, version in conn.execute(FRONTIER_VERSIONS, (tenant_id,))
    }


def drained_at(conn: psycopg.Connection, tenant_ids: list[str]) -> dict[str, dt.datetime]:
    """tenant_id -> when its last drain finished, for the tenants of `tenant_ids` that had one."""
    return dict(conn.execute(DRAINED_AT, (tenant_ids,)).fetchall())
