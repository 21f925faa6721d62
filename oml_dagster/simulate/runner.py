"""Writing a workload the way production does: K writer threads, each with its own Postgres
connection, committing transactions of different tenants that interleave and commit in any
order, while one tenant's acts stay serialized by its chain head lock.

How a tenant's acts keep their order across writers: the scheduler hands out a tenant's acts in
chunks (consecutive acts, one transaction each), normally one chunk in flight per tenant. Now and
then (`contention`) it hands out the next chunk at once to another writer: that transaction
takes its xid first, then waits for the chain head lock the first one holds, so a later
journal_seq ends up with an older xid — the hazard the stable-prefix cut must not trip over. A
chunk only asks for the lock once its predecessor holds it, so the lock is always taken in chunk
order. `long_tx` keeps some transactions open a while after writing their rows, so transactions
that inserted later (higher outbox ids) commit first.

With `rate` the run is a paced stream (ops per second, for lag and soak measurement) that stops
after `duration` seconds or when the workload is done.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import psycopg
from tqdm import tqdm

from . import producer
from .faults import FAULT_KEY
from .producer import Act, TenantKeys
from .workload import TenantSpec, TenantWorkload, WorkloadConfig, tenant_specs


class SimulationError(RuntimeError):
    """The simulation cannot run (schema missing, tenants already present) or a writer failed."""


@dataclass(frozen=True)
class RunConfig:
    writers: int = 4
    # Acts per transaction (consecutive acts of one tenant); None: 64, or 1 with a rate.
    acts_per_tx: int | None = None
    rate: float | None = None  # outbox rows per second
    duration: float | None = None  # seconds, with a rate
    # Share of transactions whose successor (same tenant) takes its xid before the lock.
    contention: float = 0.02
    # Share of transactions kept open for `long_tx_seconds` after writing their rows.
    long_tx: float = 0.002
    long_tx_seconds: tuple[float, float] = (0.05, 0.5)
    # How long a transaction waits for its successor to take an xid before locking anyway.
    pair_wait: float = 0.25
    progress: bool = False

    def __post_init__(self) -> None:
        if self.writers < 1:
            raise ValueError("need at least one writer")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be positive")

    @property
    def chunk(self) -> int:
        if self.acts_per_tx is not None:
            return max(1, self.acts_per_tx)
        return 1 if self.rate else 64


@dataclass
class RunReport:
    tenants: list[str] = field(default_factory=list)
    claims: int = 0
    acts: int = 0
    ops: Counter[str] = field(default_factory=Counter)  # outbox rows by op
    faults: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    # Transactions that took their xid before waiting for the chain lock held by their
    # predecessor (a later journal_seq with an older xid).
    early_xid: int = 0
    long_open: int = 0
    # Commits that came after a commit of a transaction with a higher xid.
    late_commits: int = 0
    elapsed: float = 0.0
    exhausted: bool = True  # the whole workload was written

    @property
    def rows(self) -> int:
        return sum(self.ops.values())

    @property
    def ops_per_second(self) -> float:
        return self.rows / self.elapsed if self.elapsed else 0.0


@dataclass(eq=False)
class _Tenant:
    keys: TenantKeys
    workload: TenantWorkload
    cond: threading.Condition = field(default_factory=threading.Condition)
    next_index: int = 0
    locked_through: int = -1  # highest chunk index that has taken the chain head lock
    in_flight: int = 0
    exhausted: bool = False


@dataclass(eq=False)
class _Chunk:
    tenant: _Tenant
    index: int
    acts: list[Act]
    claims: int
    early_xid: bool = False
    pair: threading.Event | None = None  # set by the successor once it holds an xid
    hold_open: float = 0.0
    paired: bool = False


class _Scheduler:
    def __init__(self, tenants: list[_Tenant], config: RunConfig, seed: int):
        self.tenants = tenants
        self.config = config
        self.rng = random.Random(f"oml-sim-scheduler/{seed}")
        self.cond = threading.Condition()
        self.handoffs: deque[_Chunk] = deque()
        self.cursor = 0
        self.failure: BaseException | None = None
        self.deadline: float | None = None
        self.max_committed_xid = 0
        self.report = RunReport(tenants=[t.keys.tenant_id for t in tenants])
        self.bar = None

    def _generate(self, tenant: _Tenant) -> _Chunk | None:
        before = tenant.workload.started
        acts = tenant.workload.take(self.config.chunk)
        if not acts:
            tenant.exhausted = True
            return None
        chunk = _Chunk(tenant, tenant.next_index, acts, tenant.workload.started - before)
        tenant.next_index += 1
        tenant.in_flight += 1
        if tenant.workload.done:
            tenant.exhausted = True
        return chunk

    def next_chunk(self) -> _Chunk | None:
        with self.cond:
            while True:
                if self.failure is not None:
                    return None
                if self.handoffs:
                    return self.handoffs.popleft()
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.report.exhausted = all(t.exhausted for t in self.tenants)
                    return None
                busy = False
                for step in range(len(self.tenants)):
                    tenant = self.tenants[(self.cursor + step) % len(self.tenants)]
                    if tenant.exhausted:
                        busy = busy or tenant.in_flight > 0
                        continue
                    if tenant.in_flight:
                        busy = True
                        continue
                    self.cursor = (self.cursor + step + 1) % len(self.tenants)
                    chunk = self._generate(tenant)
                    if chunk is None:
                        continue
                    self._decorate(chunk)
                    return chunk
                if not busy and not self.handoffs:
                    return None
                self.cond.wait(0.2)

    def _decorate(self, chunk: _Chunk) -> None:
        """Roll the concurrency hazards for this transaction."""
        config, rng = self.config, self.rng
        if rng.random() < config.long_tx:
            chunk.hold_open = rng.uniform(*config.long_tx_seconds)
        if config.writers > 1 and rng.random() < config.contention and not chunk.tenant.exhausted:
            successor = self._generate(chunk.tenant)
            if successor is not None:
                chunk.pair = successor.pair = threading.Event()
                successor.early_xid = True
                self.handoffs.append(successor)
                self.cond.notify_all()

    def done(self, chunk: _Chunk, xid: int) -> None:
        with self.cond:
            tenant = chunk.tenant
            tenant.in_flight -= 1
            report = self.report
            report.transactions += 1
            report.acts += len(chunk.acts)
            report.claims += chunk.claims
            for act in chunk.acts:
                for op, payload in act.ops:
                    report.ops[op] += 1
                    if FAULT_KEY in payload:
                        report.faults[payload[FAULT_KEY]] += 1
                for forgery in act.forgeries:
                    report.faults[forgery.marks.get(FAULT_KEY, "forged")] += 1
                report.ops["journal.event"] += 1 + len(act.forgeries)
            report.early_xid += chunk.paired
            report.long_open += chunk.hold_open > 0
            if xid < self.max_committed_xid:
                report.late_commits += 1
            self.max_committed_xid = max(self.max_committed_xid, xid)
            if self.bar is not None:
                self.bar.update(chunk.claims)
                self.bar.set_postfix_str(f"{report.rows:,} ops", refresh=False)
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = error
            self.cond.notify_all()
        for tenant in self.tenants:
            with tenant.cond:
                tenant.cond.notify_all()


class _Pacer:
    """Spreads `rate` rows per second evenly over the writers."""

    def __init__(self, rate: float):
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def wait(self, rows: int, sleep: bool = True) -> None:
        """Reserve the next slot for `rows` and sleep until it (unless `sleep` is false: a
        successor whose predecessor is already waiting for it only takes its share)."""
        with self.lock:
            now = time.monotonic()
            start = max(self.next, now)
            self.next = start + rows / self.rate
        if sleep and start > now:
            time.sleep(start - now)


def _wait_locked(scheduler: _Scheduler, tenant: _Tenant, index: int) -> None:
    """Block until chunk `index - 1` of the tenant holds (or has released) the chain lock."""
    with tenant.cond:
        while tenant.locked_through < index - 1:
            if scheduler.failure is not None:
                raise SimulationError("another writer failed")
            tenant.cond.wait(0.2)


def _commit(conn: psycopg.Connection, scheduler: _Scheduler, chunk: _Chunk) -> int:
    tenant = chunk.tenant
    xid = 0

    def before_lock(_conn: psycopg.Connection) -> None:
        if chunk.early_xid:
            if chunk.pair is not None:
                chunk.pair.set()  # our xid is taken: the predecessor may lock now
        elif chunk.pair is not None:
            chunk.paired = chunk.pair.wait(scheduler.config.pair_wait)
        _wait_locked(scheduler, tenant, chunk.index)

    def after_lock(conn: psycopg.Connection) -> None:
        nonlocal xid
        xid = producer.scalar(conn, "SELECT pg_current_xact_id()::text::bigint")
        with tenant.cond:
            tenant.locked_through = chunk.index
            tenant.cond.notify_all()

    def before_commit(_conn: psycopg.Connection) -> None:
        if chunk.hold_open:
            time.sleep(chunk.hold_open)

    producer.commit_acts(
        conn,
        tenant.keys,
        chunk.acts,
        early_xid=chunk.early_xid,
        before_lock=before_lock,
        after_lock=after_lock,
        before_commit=before_commit,
    )
    return xid


def _writer(dsn: str, scheduler: _Scheduler, pacer: _Pacer | None, number: int) -> None:
    try:
        with psycopg.connect(
            dsn, autocommit=True, application_name=f"oml-simulate-writer-{number}"
        ) as conn:
            while (chunk := scheduler.next_chunk()) is not None:
                if pacer is not None:
                    pacer.wait(sum(act.rows for act in chunk.acts), sleep=not chunk.early_xid)
                xid = _commit(conn, scheduler, chunk)
                scheduler.done(chunk, xid)
    except BaseException as error:  # reported by run()
        scheduler.fail(error)


def prepare_tenants(conn: psycopg.Connection, specs: list[TenantSpec]) -> list[TenantKeys]:
    """Create the workload's tenants (api key, tenant policy, genesis chain head)."""
    if producer.scalar(conn, "SELECT to_regclass('oml.outbox')") is None:
        raise SimulationError("schema oml is missing: run `oml-lake db upgrade` first")
    producer.ensure_schema(conn)
    ids = [s.tenant_id for s in specs]
    existing = producer.scalar(
        conn, "SELECT count(*) FROM oml.api_keys WHERE tenant_id = ANY(%s::uuid[])", (ids,)
    )
    if existing:
        raise SimulationError(
            f"{existing} of this workload's tenants already exist: use another --seed or a "
            "fresh database"
        )
    return [
        producer.create_tenant(conn, s.tenant_id, key_seed=s.key_seed, principal=s.principal)
        for s in specs
    ]


def run(dsn: str, workload: WorkloadConfig, config: RunConfig | None = None) -> RunReport:
    """Write `workload` into the database at `dsn`; returns what was written."""
    config = config or RunConfig()
    specs = tenant_specs(workload)
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = prepare_tenants(conn, specs)
    tenants = [
        _Tenant(k, TenantWorkload(spec, workload, k, keys[:i] + keys[i + 1 :]))
        for i, (spec, k) in enumerate(zip(specs, keys, strict=True))
    ]
    scheduler = _Scheduler(tenants, config, workload.seed)
    pacer = _Pacer(config.rate) if config.rate else None
    if config.progress:
        scheduler.bar = tqdm(
            total=workload.tenants * workload.claims,
            unit="claim",
            desc="simulate",
            file=sys.stderr,
            mininterval=0.5,
        )
    started = time.monotonic()
    if config.rate and config.duration:
        scheduler.deadline = started + config.duration
    threads = [
        threading.Thread(
            target=_writer, args=(dsn, scheduler, pacer, n), name=f"simulate-writer-{n}"
        )
        for n in range(config.writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = scheduler.report
    report.elapsed = time.monotonic() - started
    if scheduler.bar is not None:
        scheduler.bar.close()
    if scheduler.failure is not None:
        raise SimulationError(f"a writer failed: {scheduler.failure!r}") from scheduler.failure
    if scheduler.deadline is None:
        report.exhausted = all(t.exhausted for t in tenants)
    return report
