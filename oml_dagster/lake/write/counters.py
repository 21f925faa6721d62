"""The writers' own counters (ADR 0066): table commits by action, retries by fault class and the
wall time of committing batches, added up in PostgreSQL (`oml.lake_writer_counters`) where the
metrics exporter reads them, so they reach Prometheus from every writer run, short or standing,
without a Pushgateway and without a port per run.

A writer keeps its increments in memory and adds them to the running totals in one statement
at most every `flush_seconds`, looked at after every batch (a pass over many tenants can last
minutes: the heartbeat must not go stale while the writer works), and when its drain ends. A
flush that fails keeps the increments for the next one: a lost PostgreSQL session delays
counts, never loses or doubles them. Every flush also touches the writers' heartbeat row, whose
age tells the exporter a writer is alive."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.faults import Fault, classify
from oml_dagster.lake.queries import cross_scope
from oml_dagster.lake.write.writer import COMMITS, BatchResult

COMMITS_COUNTER = "commits"
RETRIES_COUNTER = "retries"
BATCH_SECONDS_SUM = "batch_seconds_sum"
BATCH_SECONDS_COUNT = "batch_seconds_count"
HEARTBEAT_COUNTER = "flushes"

FLUSH_SECONDS = 15.0


@dataclass
class WriterCounters:
    """One writer process's counters, flushed to PostgreSQL over a connection from `connect`."""

    connect: Callable[[], psycopg.Connection]
    flush_seconds: float = FLUSH_SECONDS
    pending: dict[tuple[str | None, str, str], float] = field(default_factory=dict)
    tried_at: float = field(default_factory=time.monotonic)  # the last flush, failed or not
    mark: float = field(default_factory=time.monotonic)  # when the current batch began
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tenant_id: str | None, name: str, label: str, value: float) -> None:
        with self.lock:
            key = (tenant_id, name, label)
            self.pending[key] = self.pending.get(key, 0.0) + value

    def batch_ended(self, result: BatchResult) -> None:
        now = time.monotonic()
        took, self.mark = now - self.mark, now
        for table in result.tables:
            if table.action in COMMITS:
                self.add(result.tenant_id, COMMITS_COUNTER, table.action, 1)
        if result.committed:
            self.add(result.tenant_id, BATCH_SECONDS_SUM, "", took)
            self.add(result.tenant_id, BATCH_SECONDS_COUNT, "", 1)
        self._flush_when_due()

    def pass_ended(self) -> None:
        self._flush_when_due()

    def _flush_when_due(self) -> None:
        """A flush once `flush_seconds` passed since the last one tried (a failed one is not
        tried again at every batch); the next batch's time starts after it."""
        if time.monotonic() - self.tried_at >= self.flush_seconds:
            self.flush()
        self.mark = time.monotonic()

    def retried(self, fault: Fault) -> None:
        self.add(None, RETRIES_COUNTER, fault.cause, 1)

    def flush(self) -> bool:
        """Add the increments to PostgreSQL's totals and touch the heartbeat; False (the
        increments kept) when PostgreSQL cannot be reached or refuses."""
        self.tried_at = time.monotonic()
        with self.lock:
            taken, self.pending = self.pending, {}
        taken[(None, HEARTBEAT_COUNTER, "")] = taken.get((None, HEARTBEAT_COUNTER, ""), 0) + 1
        keys = sorted(taken, key=lambda k: (k[0] or "", k[1], k[2]))
        try:
            with self.connect() as conn, cross_scope(conn):
                conn.execute(
                    queries.WRITER_COUNTERS_ADD,
                    (
                        [k[0] for k in keys],
                        [k[1] for k in keys],
                        [k[2] for k in keys],
                        [float(taken[k]) for k in keys],
                    ),
                )
        except Exception as error:
            if classify(error) is None:
                raise
            with self.lock:
                for key in keys:
                    if key[1] != HEARTBEAT_COUNTER:
                        self.pending[key] = self.pending.get(key, 0.0) + taken[key]
            return False
        return True
