"""The operator's metrics (ADR 0065): what `oml-lake exporter` serves to Prometheus, per tenant
and per table, read from the authority and the lake.

- PostgreSQL is read on every scrape, in a handful of set-based statements whatever the tenant
  count (`read_authority`): drain lag by the freshness check's definition
  (`freshness.tenant_lags`), ops waiting sequenced and unsequenced, the oldest unsequenced op and
  whether it waits behind a journal gap, the cut's position, open dead letters by class, pending
  erases against their deadline, the reconciler's last recorded results and the writers' own
  counters (ADR 0066).
- The lake's logs are read on a slower cadence by a background thread and cached
  (`LakeCache`): per table its version, txn version, last commit, live and small files, versions
  since the last checkpoint and the last maintenance of each kind, and per tenant the doctor's
  erasure verdict (`doctor.erasure_verdict`, the one that judges an erased body still in files).
- A fault never ends the exporter: a failed read is classified (`faults.classify`), counted by
  source and class, and the series it would have produced are left out of that scrape (not
  served stale); the age of each source's last good read is served beside them.

Label values are tenant ids, table ids (`silver.claims`, `gold.curated/<workarea uuid>`) and
names from fixed sets in this module: never a path, a payload or an error's text."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg
from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.registry import Collector, CollectorRegistry

from oml_dagster.lake import queries
from oml_dagster.lake.audit.doctor import AT_RISK, BREACHED, HOLDS, erasure_verdict
from oml_dagster.lake.audit.freshness import TenantLag, tenant_lags
from oml_dagster.lake.faults import classify
from oml_dagster.lake.model import catalog
from oml_dagster.lake.model.tables import APP_ID, CHECKPOINT_INTERVAL, TableId
from oml_dagster.lake.policy import DEFAULT_CADENCE
from oml_dagster.lake.queries import cross_scope
from oml_dagster.lake.store.deltalog import last_checkpoint
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.store.rewrites import SMALL_FILE_TARGET
from oml_dagster.lake.write.counters import (
    BATCH_SECONDS_COUNT,
    BATCH_SECONDS_SUM,
    COMMITS_COUNTER,
    HEARTBEAT_COUNTER,
    RETRIES_COUNTER,
)

# The sources a refresh reads, and the classes of a failed read (label values).
POSTGRES, LAKE = "postgres", "lake"
TRANSIENT, PERMANENT, INTERNAL = "transient", "permanent", "internal"
ERASURE_STATES = (HOLDS, AT_RISK, BREACHED)
# Maintenance kinds a table's log records, by the commit's operation.
COMPACT, ZORDER, VACUUM, CHECKPOINT = "compact", "zorder", "vacuum", "checkpoint"
UNKNOWN_OP = "unknown"  # a dead letter of an op the catalog does not know: no producer's text


_SLUG = re.compile(r"[^a-z0-9]+")


def fault_class(error: BaseException) -> str:
    """The label of a failed read: transient, permanent (a person must act) or internal."""
    fault = classify(error)
    if fault is None:
        return INTERNAL
    return TRANSIENT if fault.transient else PERMANENT


def slug(text: str) -> str:
    """A fault's cause as a label value: lower-case words joined by `_`."""
    return _SLUG.sub("_", text.lower()).strip("_") or "unknown"


def _tenant(text: str | None) -> str | None:
    """`text` as a tenant label value, None unless it is a UUID (nothing else becomes a label)."""
    if text is None:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _epoch(at: dt.datetime | None) -> float | None:
    return None if at is None else at.timestamp()


# --- the authority -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantPosition:
    tenant_id: str
    cut_seq: int | None  # the last seq the cut assigned (None: nothing sequenced yet)
    cut_journal_seq: int | None
    drained_through: int  # the least batch end of the core tables in the frontier cache
    last_drain_at: dt.datetime | None
    erasure_bound_seconds: float


@dataclass(frozen=True)
class Unsequenced:
    ops: int
    oldest_age_seconds: float
    behind_gap: bool  # its first row is past the next journal_seq: an act not yet visible


@dataclass(frozen=True)
class PendingErases:
    ops: int
    oldest_age_seconds: float


@dataclass(frozen=True)
class WriterCounter:
    tenant_id: str | None
    name: str
    label: str
    value: float
    updated_at: dt.datetime


@dataclass(frozen=True)
class CheckOutcome:
    tenant_id: str
    check: str  # "<table>/<name>"
    findings: int
    checked_at: dt.datetime


@dataclass(frozen=True)
class Authority:
    """What PostgreSQL says at one instant (`now`, its clock), for every tenant."""

    now: dt.datetime
    tenants: list[TenantPosition]
    lags: dict[str, TenantLag]
    unsequenced: dict[str, Unsequenced]
    dead_letters: dict[tuple[str, str], int]  # (tenant, class) -> open dead letters
    pending_erases: dict[str, PendingErases]
    checks: list[CheckOutcome]
    counters: list[WriterCounter]
    statements: int  # statements the read ran


def dead_letter_class(op: str) -> str:
    """An open dead letter's class: its op when the catalog knows it, else `unknown`."""
    return op if op in catalog.CATALOG else UNKNOWN_OP


def read_authority(conn: psycopg.Connection) -> Authority:
    """Every tenant's numbers from PostgreSQL, in one cross-scope transaction per statement
    group and a fixed number of statements (`Authority.statements`), whatever the tenant count.
    """
    lags = tenant_lags(conn)  # the freshness check's definition: the scope, the statement
    statements = 2
    with cross_scope(conn):
        positions = conn.execute(queries.EXPORT_TENANTS, ()).fetchall()
        unsequenced = conn.execute(queries.UNSEQUENCED_BY_TENANT).fetchall()
        letters = conn.execute(queries.EXPORT_OPEN_DEAD_LETTERS).fetchall()
        erases = conn.execute(queries.EXPORT_PENDING_ERASES, ()).fetchall()
        checks = conn.execute(queries.CHECK_RESULTS).fetchall()
        counters = conn.execute(queries.WRITER_COUNTERS).fetchall()
        statements += 7  # the six above and the scope's own
    now = positions[0][6] if positions else dt.datetime.now(dt.UTC)
    found_unsequenced = {}
    for tenant_id, ops, first_journal_seq, oldest, last_journal_seq in unsequenced:
        behind = last_journal_seq is not None and first_journal_seq > last_journal_seq + 1
        found_unsequenced[tenant_id] = Unsequenced(
            ops, max((now - oldest).total_seconds(), 0.0), behind
        )
    dead: dict[tuple[str, str], int] = {}
    for tenant_id, op, count in letters:
        key = (tenant_id, dead_letter_class(op))
        dead[key] = dead.get(key, 0) + count
    return Authority(
        now=now,
        tenants=[
            TenantPosition(t, last_seq, last_js, drained, drained_at, bound)
            for t, last_seq, last_js, drained, drained_at, bound, _ in positions
        ],
        lags=lags,
        unsequenced=found_unsequenced,
        dead_letters=dead,
        pending_erases={t: PendingErases(n, age) for t, n, age in erases},
        checks=[CheckOutcome(*row) for row in checks],
        counters=[WriterCounter(*row) for row in counters],
        statements=statements,
    )


def erasure_state(
    pending: PendingErases | None,
    open_dead_lettered_erases: int,
    bound_seconds: float,
    cadence: dt.timedelta,
    lake_state: str | None = None,
) -> str:
    """The erasure SLO state by the doctor's rule, from what PostgreSQL shows (an erase waiting
    past the deadline, bound + cadence: breached; within a cadence of it, or a dead-lettered
    erase waiting on an operator: at risk) and the doctor's verdict over the lake when the lake
    cache has one: the worse of the two."""
    deadline = bound_seconds + cadence.total_seconds()
    state = HOLDS
    if open_dead_lettered_erases:
        state = AT_RISK
    if pending is not None and pending.oldest_age_seconds > bound_seconds:
        state = AT_RISK
    if pending is not None and pending.oldest_age_seconds > deadline:
        state = BREACHED
    if lake_state is not None and ERASURE_STATES.index(lake_state) > ERASURE_STATES.index(state):
        state = lake_state
    return state


# --- the lake ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableState:
    table: str
    version: int
    txn_version: int | None
    last_commit_at: float | None  # epoch seconds
    live_files: int
    small_files: int
    versions_since_checkpoint: int
    last_maintenance: dict[str, float]  # kind -> epoch seconds of its last commit


def maintenance_kind(entry: dict[str, object]) -> str | None:
    """The maintenance kind of a Delta commit (its commitInfo: the `oml.maintenance` our
    maintenance records, else delta-rs's operation), None for a writer commit. A VACUUM that
    removes nothing commits nothing, so it leaves no time here."""
    recorded = entry.get("oml.maintenance")
    if recorded in (COMPACT, ZORDER, VACUUM):
        return str(recorded)
    operation = str(entry.get("operation") or "")
    if operation == "OPTIMIZE":
        parameters = entry.get("operationParameters")
        z_order = parameters.get("zOrderBy") if isinstance(parameters, dict) else None
        return ZORDER if z_order not in (None, "", "[]") else COMPACT
    if operation.startswith("VACUUM"):
        return VACUUM
    return None


def read_table(
    lake: Lake, table_id: TableId, uri: str, *, small_file_bytes: int
) -> TableState | None:
    """One table's numbers from its Delta log, None when it is gone."""
    table = lake.open(uri)
    if table is None:
        return None
    version = table.version()
    checkpoint = last_checkpoint(lake.filesystem(uri))
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    last: dict[str, float] = {}
    last_commit: float | None = None
    for entry in table.history():
        stamp = float(entry["timestamp"]) / 1000
        if last_commit is None or stamp > last_commit:
            last_commit = stamp
        kind = maintenance_kind(entry)
        if kind is not None and stamp > last.get(kind, 0.0):
            last[kind] = stamp
        if checkpoint is not None and entry.get("version") == checkpoint:
            last[CHECKPOINT] = stamp
    return TableState(
        table=str(table_id),
        version=version,
        txn_version=table.transaction_version(APP_ID),
        last_commit_at=last_commit,
        live_files=len(sizes),
        small_files=sum(1 for s in sizes if s < small_file_bytes),
        versions_since_checkpoint=version - (checkpoint if checkpoint is not None else -1),
        last_maintenance=last,
    )


@dataclass(frozen=True)
class TenantLake:
    tables: list[TableState]
    erasure_state: str | None  # the doctor's verdict over the lake (None: not judged)


@dataclass
class LakeCache:
    """The lake's numbers per tenant, refreshed by `refresh` (the exporter's background thread)
    and read by scrapes. A tenant whose read fails keeps its last numbers; the failure is
    counted, and `refreshed_at` (the last refresh with no failure) stops moving."""

    lake: Lake
    cadence: dt.timedelta = DEFAULT_CADENCE
    small_file_bytes: int = SMALL_FILE_TARGET
    judge_erasure: bool = True
    tenants: dict[str, TenantLake] = field(default_factory=dict)
    refreshed_at: float | None = None  # time.time() of the last clean refresh
    clean: bool = False  # whether the last refresh read every tenant
    duration: float | None = None  # seconds the last refresh took
    errors: dict[str, int] = field(default_factory=dict)  # class -> failed reads
    # The tables' families rendered (OpenMetrics without its end, Prometheus text): `publish`.
    rendered: tuple[bytes, bytes] = (b"", b"")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, tenant_ids: list[str], connect: Callable[[], psycopg.Connection]) -> None:
        """Read every tenant of `tenant_ids` from the lake (and the erasure verdict, which also
        reads PostgreSQL, over one connection from `connect`)."""
        started = time.monotonic()
        clean = True
        found: dict[str, TenantLake] = {}
        conn: psycopg.Connection | None = None
        try:
            for tenant_id in tenant_ids:
                try:
                    tables = [
                        state
                        for name, _, uri in tenant_tables(self.lake, tenant_id)
                        if (
                            state := read_table(
                                self.lake, name, uri, small_file_bytes=self.small_file_bytes
                            )
                        )
                        is not None
                    ]
                    verdict = None
                    if self.judge_erasure:
                        if conn is None:
                            conn = connect()
                        verdict = erasure_verdict(
                            conn, self.lake, tenant_id, cadence=self.cadence
                        ).state
                    found[tenant_id] = TenantLake(tables, verdict)
                except Exception as error:
                    clean = False
                    self.count(error)
                    if conn is not None and conn.closed:
                        conn = None
                    with self.lock:
                        previous = self.tenants.get(tenant_id)
                    if previous is not None:
                        found[tenant_id] = previous
        except Exception as error:  # `connect` itself failed
            clean = False
            self.count(error)
        finally:
            if conn is not None:
                conn.close()
        with self.lock:
            for tenant_id in tenant_ids:
                if tenant_id in found:
                    self.tenants[tenant_id] = found[tenant_id]
            for gone in set(self.tenants) - set(tenant_ids):
                del self.tenants[gone]
            self.clean = clean
            self.duration = time.monotonic() - started
            if clean:
                self.refreshed_at = time.time()
        self.publish()

    def publish(self) -> None:
        """Render the cached tables' families once, for every scrape until the next refresh to
        serve as they are (`rendered`): at 1,000 tenants they are two thirds of a scrape's
        series, and they change only here."""
        with self.lock:
            tenants = dict(self.tenants)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TableMetrics(tenants))
        open_metrics, _ = render(registry, OPENMETRICS)
        text, _ = render(registry, "")
        rendered = (open_metrics.removesuffix(EOF), text)
        with self.lock:
            self.rendered = rendered

    def count(self, error: BaseException) -> None:
        """Count a failed read of the lake by its class."""
        kind = fault_class(error)
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def snapshot(
        self,
    ) -> tuple[dict[str, TenantLake], float | None, dict[str, int], bool, float | None]:
        with self.lock:
            return (
                dict(self.tenants),
                self.refreshed_at,
                dict(self.errors),
                self.clean,
                self.duration,
            )


# --- the collector -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ExporterConfig:
    lag_bound_seconds: float  # the freshness check's bound (OML_FRESHNESS_BOUND_SECONDS)
    cadence: dt.timedelta = DEFAULT_CADENCE
    lake_refresh_seconds: float = 60.0
    checkpoint_interval: int = CHECKPOINT_INTERVAL


class LakeMetrics(Collector):
    """The exporter's collector: on each scrape, `read_authority` over a connection kept between
    scrapes (reopened after a fault), and the lake cache as it stands. Thread-safe: scrapes are
    served one at a time (`lock`)."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection],
        cache: LakeCache,
        config: ExporterConfig,
    ):
        self.connect, self.cache, self.config = connect, cache, config
        self.lock = threading.Lock()
        self.conn: psycopg.Connection | None = None
        self.authority_at: float | None = None  # time.time() of the last good read
        self.errors: dict[str, int] = {}  # class -> failed reads of PostgreSQL
        self.last: Authority | None = None  # the last good read (the lake thread's tenant list)
        self.started = time.time()

    def read(self) -> Authority | None:
        """PostgreSQL's numbers now, None (the failure counted) when the read failed."""
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self.connect()
            found = read_authority(self.conn)
        except Exception as error:
            kind = fault_class(error)
            self.errors[kind] = self.errors.get(kind, 0) + 1
            if self.conn is not None:
                with contextlib.suppress(Exception):  # closing a broken one can fail too
                    self.conn.close()
            self.conn = None
            return None
        self.authority_at = time.time()
        self.last = found
        return found

    def collect_authority_once(self) -> None:
        """Read PostgreSQL outside a scrape (the lake thread's first tenant list)."""
        with self.lock:
            self.read()

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def tenant_ids(self) -> list[str]:
        """The tenants of the last good read of PostgreSQL (the lake thread's list)."""
        with self.lock:
            last = self.last
        return [t.tenant_id for t in last.tenants] if last else []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        with self.lock:
            authority = self.read()
            authority_at, pg_errors = self.authority_at, dict(self.errors)
        lake_tenants, lake_at, lake_errors, lake_clean, lake_duration = self.cache.snapshot()
        now = time.time()
        yield from self._health(
            now, authority, authority_at, pg_errors, lake_at, lake_errors, lake_clean, lake_duration
        )
        if authority is not None:
            yield from self._authority(authority, lake_tenants)

    def _health(
        self,
        now: float,
        authority: Authority | None,
        authority_at: float | None,
        pg_errors: dict[str, int],
        lake_at: float | None,
        lake_errors: dict[str, int],
        lake_clean: bool,
        lake_duration: float | None,
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily(
            "oml_lake_exporter_source_up",
            "Whether the source's last read succeeded (postgres: this scrape's; lake: the last "
            "refresh, every tenant)",
            labels=["source"],
        )
        up.add_metric([POSTGRES], 1.0 if authority is not None else 0.0)
        up.add_metric([LAKE], 1.0 if lake_clean else 0.0)
        yield up
        age = GaugeMetricFamily(
            "oml_lake_exporter_last_refresh_age_seconds",
            "Seconds since the source's last successful refresh (since the exporter started, "
            "when none has succeeded)",
            labels=["source"],
        )
        for source, at in ((POSTGRES, authority_at), (LAKE, lake_at)):
            age.add_metric([source], now - (at if at is not None else self.started))
        yield age
        errors = CounterMetricFamily(
            "oml_lake_exporter_refresh_errors",
            "Failed reads of a source, by the fault's class (lake/faults.py)",
            labels=["source", "class"],
        )
        for source, counts in ((POSTGRES, pg_errors), (LAKE, lake_errors)):
            for kind in (TRANSIENT, PERMANENT, INTERNAL):
                errors.add_metric([source, kind], counts.get(kind, 0))
        yield errors
        # What the lake's age is judged against: it refreshes every interval, each refresh
        # taking its duration (a refresh at many tenants takes minutes: bench/RESULTS.md).
        interval = GaugeMetricFamily(
            "oml_lake_exporter_refresh_interval_seconds",
            "Seconds between the lake refreshes (OML_EXPORTER_LAKE_REFRESH_SECONDS)",
            labels=["source"],
        )
        interval.add_metric([LAKE], self.config.lake_refresh_seconds)
        yield interval
        took = GaugeMetricFamily(
            "oml_lake_exporter_refresh_duration_seconds",
            "Seconds the last lake refresh took",
            labels=["source"],
        )
        if lake_duration is not None:
            took.add_metric([LAKE], lake_duration)
        yield took
        if authority is not None:
            yield GaugeMetricFamily(
                "oml_lake_exporter_scrape_statements",
                "Statements this scrape ran against PostgreSQL",
                value=authority.statements,
            )
        yield GaugeMetricFamily(
            "oml_lake_lag_bound_seconds",
            "The drain lag bound of the freshness check (OML_FRESHNESS_BOUND_SECONDS)",
            value=self.config.lag_bound_seconds,
        )
        yield GaugeMetricFamily(
            "oml_lake_checkpoint_interval_versions",
            "Versions between checkpoints (delta.checkpointInterval)",
            value=self.config.checkpoint_interval,
        )

    def _authority(
        self, authority: Authority, lake_tenants: dict[str, TenantLake]
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["tenant", *labels])

        lag = gauge(
            "oml_lake_tenant_drain_lag_seconds",
            "Age of the tenant's oldest outbox row not yet in every core table (freshness check)",
        )
        waiting = gauge(
            "oml_lake_tenant_ops_waiting",
            "Outbox rows not yet drained: sequenced, or waiting for the cut (unsequenced)",
            ("state",),
        )
        oldest = gauge(
            "oml_lake_tenant_oldest_unsequenced_age_seconds",
            "Age of the tenant's oldest row the cut has not sequenced (0: none)",
        )
        gap = gauge(
            "oml_lake_tenant_ops_behind_gap",
            "Unsequenced rows held behind a missing journal_seq (an act not yet visible)",
        )
        cut = gauge("oml_lake_tenant_cut_seq", "The last seq the cut assigned the tenant")
        cut_js = gauge("oml_lake_tenant_cut_journal_seq", "The last journal_seq the cut sequenced")
        drained = gauge(
            "oml_lake_tenant_drained_through_seq",
            "The least batch end of the tenant's core tables (the frontier cache)",
        )
        last_drain = gauge(
            "oml_lake_tenant_last_drain_timestamp_seconds",
            "When a writer run last finished a drain of the tenant (the frontier cache)",
        )
        dead = gauge(
            "oml_lake_tenant_dead_letters_open",
            "Open dead letters (neither re-enqueued nor resolved), by the op's class",
            ("class",),
        )
        erasure = gauge(
            "oml_lake_tenant_erasure_state",
            "The erasure SLO state (1 for the state it is in): holds, at_risk or breached",
            ("state",),
        )
        pending = gauge(
            "oml_lake_tenant_erasure_oldest_pending_seconds",
            "Age of the oldest erase not yet drained (0: none)",
        )
        deadline = gauge(
            "oml_lake_tenant_erasure_deadline_seconds",
            "How long an erased body may stay: the tenant's erasure bound plus the cadence",
        )
        for position in authority.tenants:
            t = position.tenant_id
            if _tenant(t) is None:
                continue
            found = authority.lags.get(t)
            lag.add_metric([t], found.seconds if found else 0.0)
            waiting.add_metric([t, "sequenced"], found.ops_waiting if found else 0)
            unseq = authority.unsequenced.get(t)
            waiting.add_metric([t, "unsequenced"], unseq.ops if unseq else 0)
            oldest.add_metric([t], unseq.oldest_age_seconds if unseq else 0.0)
            gap.add_metric([t], unseq.ops if unseq and unseq.behind_gap else 0)
            if position.cut_seq is not None:
                cut.add_metric([t], position.cut_seq)
            if position.cut_journal_seq is not None:
                cut_js.add_metric([t], position.cut_journal_seq)
            drained.add_metric([t], position.drained_through)
            if position.last_drain_at is not None:
                last_drain.add_metric([t], position.last_drain_at.timestamp())
            for kind in (*sorted(catalog.CATALOG), UNKNOWN_OP):
                count = authority.dead_letters.get((t, kind), 0)
                if count or kind == "claim.erase":
                    dead.add_metric([t, kind], count)
            erases = authority.pending_erases.get(t)
            lake = lake_tenants.get(t)
            state = erasure_state(
                erases,
                authority.dead_letters.get((t, "claim.erase"), 0),
                position.erasure_bound_seconds,
                self.config.cadence,
                lake.erasure_state if lake else None,
            )
            for s in ERASURE_STATES:
                erasure.add_metric([t, s.replace(" ", "_")], 1.0 if s == state else 0.0)
            pending.add_metric([t], erases.oldest_age_seconds if erases else 0.0)
            deadline.add_metric(
                [t], position.erasure_bound_seconds + self.config.cadence.total_seconds()
            )
        yield from (lag, waiting, oldest, gap, cut, cut_js, drained, last_drain, dead)
        yield from (erasure, pending, deadline)
        yield from self._checks(authority)
        yield from self._counters(authority)

    def _checks(self, authority: Authority) -> Iterator[GaugeMetricFamily]:
        failed = GaugeMetricFamily(
            "oml_lake_check_findings",
            "Findings of each reconciler check at its tenant's last recorded run (0: passed)",
            labels=["tenant", "table", "check"],
        )
        at = GaugeMetricFamily(
            "oml_lake_check_last_run_timestamp_seconds",
            "When the tenant's reconciler checks were last recorded",
            labels=["tenant"],
        )
        latest: dict[str, float] = {}
        for c in authority.checks:
            table, _, name = c.check.rpartition("/")
            if _tenant(c.tenant_id) is None:
                continue
            failed.add_metric([c.tenant_id, table, name], c.findings)
            latest[c.tenant_id] = max(latest.get(c.tenant_id, 0.0), c.checked_at.timestamp())
        for tenant_id, stamp in sorted(latest.items()):
            at.add_metric([tenant_id], stamp)
        yield failed
        yield at

    def _counters(
        self, authority: Authority
    ) -> Iterator[CounterMetricFamily | SummaryMetricFamily | GaugeMetricFamily]:
        commits = CounterMetricFamily(
            "oml_lake_writer_commits",
            "Table commits of the writers, by the batch's action on the table",
            labels=["tenant", "action"],
        )
        retries = CounterMetricFamily(
            "oml_lake_writer_retries",
            "Retries of the writers after a transient fault, by the fault's cause",
            labels=["class"],
        )
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        heartbeat: float | None = None
        for c in authority.counters:
            tenant = _tenant(c.tenant_id)
            if c.name == COMMITS_COUNTER and tenant is not None:
                commits.add_metric([tenant, slug(c.label)], c.value)
            elif c.name == RETRIES_COUNTER:
                retries.add_metric([slug(c.label)], c.value)
            elif c.name == BATCH_SECONDS_SUM and tenant is not None:
                sums[tenant] = c.value
            elif c.name == BATCH_SECONDS_COUNT and tenant is not None:
                counts[tenant] = c.value
            elif c.name == HEARTBEAT_COUNTER:
                heartbeat = c.updated_at.timestamp()
        latency = SummaryMetricFamily(
            "oml_lake_writer_batch_seconds",
            "Wall time of the writers' committing tenant batches (fetch, fold and commit)",
            labels=["tenant"],
        )
        for tenant in sorted(set(sums) & set(counts)):
            latency.add_metric([tenant], count_value=int(counts[tenant]), sum_value=sums[tenant])
        yield commits
        yield retries
        yield latency
        if heartbeat is not None:
            yield GaugeMetricFamily(
                "oml_lake_writer_last_report_timestamp_seconds",
                "When a writer last recorded its counters (a standing writer does so every "
                "few seconds, idle or not)",
                value=heartbeat,
            )


def table_families(tenants: dict[str, TenantLake]) -> Iterator[GaugeMetricFamily]:
    """The per-table families of the lake cache's tenants."""
    labels = ["tenant", "table"]
    version = GaugeMetricFamily(
        "oml_lake_table_version", "The table's Delta version", labels=labels
    )
    txn = GaugeMetricFamily(
        "oml_lake_table_txn_version",
        "The table's app transaction version (the last batch end it recorded)",
        labels=labels,
    )
    commit = GaugeMetricFamily(
        "oml_lake_table_last_commit_timestamp_seconds",
        "When the table's last commit landed",
        labels=labels,
    )
    live = GaugeMetricFamily("oml_lake_table_live_files", "Live data files", labels=labels)
    small = GaugeMetricFamily(
        "oml_lake_table_small_files",
        "Live data files under the compaction target size",
        labels=labels,
    )
    behind = GaugeMetricFamily(
        "oml_lake_table_versions_since_checkpoint",
        "Versions since the table's last checkpoint",
        labels=labels,
    )
    maintenance = GaugeMetricFamily(
        "oml_lake_table_last_maintenance_timestamp_seconds",
        "When the last maintenance of each kind committed on the table (its log)",
        labels=[*labels, "kind"],
    )
    for tenant_id, found in sorted(tenants.items()):
        if _tenant(tenant_id) is None:
            continue
        for s in found.tables:
            key = [tenant_id, s.table]
            version.add_metric(key, s.version)
            if s.txn_version is not None:
                txn.add_metric(key, s.txn_version)
            if s.last_commit_at is not None:
                commit.add_metric(key, s.last_commit_at)
            live.add_metric(key, s.live_files)
            small.add_metric(key, s.small_files)
            behind.add_metric(key, s.versions_since_checkpoint)
            for kind, stamp in sorted(s.last_maintenance.items()):
                maintenance.add_metric([*key, kind], stamp)
    yield from (version, txn, commit, live, small, behind, maintenance)


class TableMetrics(Collector):
    """The lake cache's per-table families as a collector (what `LakeCache.publish` renders)."""

    def __init__(self, tenants: dict[str, TenantLake]):
        self.tenants = tenants

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return table_families(self.tenants)


# --- the service -------------------------------------------------------------------------------


class LakeRefresher(threading.Thread):
    """The background thread that refreshes the lake cache every `seconds`, over the tenants of
    the collector's last good read of PostgreSQL."""

    def __init__(
        self,
        metrics: LakeMetrics,
        connect: Callable[[], psycopg.Connection],
        seconds: float,
    ):
        super().__init__(name="oml-lake-refresh", daemon=True)
        self.metrics, self.connect, self.seconds = metrics, connect, seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                tenants = self.metrics.tenant_ids()
                if not tenants and self.metrics.last is None:
                    self.metrics.collect_authority_once()
                    tenants = self.metrics.tenant_ids()
                self.metrics.cache.refresh(tenants, self.connect)
            except Exception as error:
                # The thread must outlive anything: a dead refresher would leave the lake's
                # numbers frozen. The error is counted; the lake's age shows the rest.
                self.metrics.cache.count(error)
            self.stopping.wait(self.seconds)

    def stop(self) -> None:
        self.stopping.set()


# --- serving -----------------------------------------------------------------------------------

WSGIEnviron = dict[str, object]


OPENMETRICS = "application/openmetrics-text"
EOF = b"# EOF\n"


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The registry's metrics in the format `accept` asks for: OpenMetrics 1.0 when it names
    it, Prometheus text otherwise. OpenMetrics is rendered with prometheus-client's UTF-8
    escaping, which for names that are all legacy characters (every name here) writes the same
    bytes as its default escaping, without the default's per-character pass over each sample's
    name: at 1,000 tenants (47,000 series) that pass was most of a scrape's time."""
    if OPENMETRICS in accept:
        body: bytes = openmetrics_exposition.generate_latest(  # type: ignore[no-untyped-call]
            registry, escaping=openmetrics_exposition.ALLOWUTF8
        )
        return body, str(openmetrics_exposition.CONTENT_TYPE_LATEST)
    return exposition.generate_latest(registry), exposition.CONTENT_TYPE_LATEST


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        """No line per scrape on stderr."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@dataclass
class MetricsServer:
    """`/metrics` on `host`:`port`: `registry`'s families rendered at each scrape, then the lake
    cache's as last published; served from a thread of its own, `stop` ends it. Binding fails
    with the OSError of the address (in use, not this host's)."""

    registry: CollectorRegistry
    cache: LakeCache | None
    host: str
    port: int
    server: WSGIServer | None = None

    def body(self, accept: str) -> tuple[bytes, str]:
        body, content_type = render(self.registry, accept)
        if self.cache is None:
            return body, content_type
        with self.cache.lock:
            open_metrics, text = self.cache.rendered
        if OPENMETRICS in accept:
            return body.removesuffix(EOF) + open_metrics + EOF, content_type
        return body + text, content_type

    def start(self) -> MetricsServer:
        # A WSGI application; `request` is WSGI's per-request dictionary (not the process's).
        def app(request: WSGIEnviron, start_response: Callable[..., object]) -> Iterable[bytes]:
            if request.get("PATH_INFO") not in ("/metrics", "/"):
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found: the metrics are at /metrics\n"]
            body, content_type = self.body(str(request.get("HTTP_ACCEPT") or ""))
            start_response("200 OK", [("Content-Type", content_type)])
            return [body]

        self.server = make_server(
            self.host, self.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        threading.Thread(
            target=self.server.serve_forever, name="oml-lake-metrics", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
