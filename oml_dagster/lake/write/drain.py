"""Drain passes: sequence, then one batch per tenant with pending ops; the same loop serves
`oml-lake drain`, the benchmarks, the tests and each lake-writer run of the Dagster layer (one
tenant, until idle or a time cap: ADR 0021). What a drain does and for how long is one
`DrainPolicy`; what its caller hears of it (and decides on the way) is one `DrainObserver`
(ADR 0051)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg

from oml_dagster.lake.faults import Fault, RetryPolicy, is_transient, retrying
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.fetch import Batch, Fetcher, second_conninfo
from oml_dagster.lake.ingest.sequencer import SequencerReport
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.commit import CommitObserver
from oml_dagster.lake.write.counters import WriterCounters
from oml_dagster.lake.write.memory import MemoryGovernor, release_memory
from oml_dagster.lake.write.writer import BatchRead, BatchResult, TenantBatch, WriterConfig

# After a tenant batch of this many ops the drain hands the memory the batch freed back to the
# system (`release_memory`): a full batch's Python objects and buffers are hundreds of MiB.
RELEASE_AFTER_OPS = 10_000


@dataclass
class DrainPass:
    sequenced: SequencerReport
    batches: list[BatchResult] = field(default_factory=list)
    # Whether a tenant is one the drain was asked for (None: every pending tenant). Rows the
    # cut sequenced for other tenants are not progress here: a run of one tenant (or one shard)
    # must not keep going, idle, because others are busy.
    scope: Callable[[str], bool] | None = None

    @property
    def sequenced_here(self) -> int:
        if self.scope is None:
            return self.sequenced.sequenced
        return sum(c.sequenced for t, c in self.sequenced.tenants.items() if self.scope(t))

    @property
    def moved(self) -> bool:
        """Whether a batch of the pass committed or refused anything."""
        return any(b.committed or b.refused for b in self.batches)

    @property
    def progressed(self) -> bool:
        return self.sequenced_here > 0 or self.moved


@dataclass(frozen=True)
class DrainPolicy:
    """What a drain drains and for how long.

    - `until_idle`: pass after pass until one neither sequences nor applies anything (else one
      pass); at most `max_passes`.
    - `max_seconds`: no pass starts after this many seconds from the drain's start (the pass
      under way always finishes: its batches are committed or not, never cut).
    - `poll_seconds` (a standing shard run, ADR 0032): an idle pass does not end the drain, which
      passes again until `max_seconds`, at most once per `poll_seconds`: ops arriving after a
      quiet spell are sequenced and drained by a writer already running, and a trickle is
      drained in batches of half a second's ops rather than one pass per op. Idle passes after
      the first are not kept in the passes returned.
    - `owns`: with no tenants named, the pending tenants the drain takes (a shard of tenants:
      only their rows count as progress); None, every one.
    - `config`: each batch takes at most `config.max_batch` ops, fewer when the memory budget
      (`config.memory_budget_mib`, measured by `governor`, one made per drain when None) calls
      for it (ADR 0034). A governor given here is shared by every drain the policy runs."""

    until_idle: bool = False
    max_passes: int = 100_000
    max_seconds: float | None = None
    poll_seconds: float | None = None
    owns: Callable[[str], bool] | None = None
    config: WriterConfig = field(default_factory=WriterConfig)
    governor: MemoryGovernor | None = None

    def __post_init__(self) -> None:
        if self.max_seconds is not None and not self.max_seconds >= 0:
            raise ValueError(f"max_seconds must be >= 0, got {self.max_seconds!r}")
        if self.poll_seconds is not None and (
            not self.poll_seconds > 0 or self.max_seconds is None
        ):
            raise ValueError(
                f"poll_seconds must be > 0 and bounded by max_seconds, got {self.poll_seconds!r} "
                f"with max_seconds {self.max_seconds!r}"
            )


class DrainObserver:
    """What a drain tells its caller, and the two things it asks. Every method is a no-op (or
    the plain answer) here; a caller subclasses it and overrides what it needs."""

    def busy_tenants(self) -> Collection[str]:
        """Tenants to leave alone in this pass (another run writes them); asked once per pass
        that has tenants to visit."""
        return ()

    def batch_ended(self, result: BatchResult) -> None:
        """A tenant batch ended (committed, refused, or nothing to do), before its pass does."""

    def table_commits(self) -> CommitObserver | None:
        """What hears each table commit of every batch (`CommitObserver`: each commit as it is
        about to be made and as it landed); asked once per drain. None (here): nothing."""
        return None

    def pass_ended(self, drained: DrainPass) -> None:
        """A pass ended: every pass, the idle ones of a polling drain too."""

    def tenant_failed(self, tenant_id: str, error: Exception) -> bool:
        """A tenant's batch raised. True: the drain goes on and leaves that tenant alone for the
        rest of the drain, so one broken tenant does not stop the others (a shard run); False
        (here): the error propagates. A transient fault (`faults.is_transient`: a lost
        connection, a store's 5xx) never comes here: it is no tenant's fault, and always
        propagates (`drain_riding_through` starts over)."""
        return False

    def retrying(self, fault: Fault, failures: int, wait: float) -> None:
        """`drain_riding_through` retries after `fault`, the streak's `failures`-th, in `wait`
        seconds."""


def drain(
    conn: psycopg.Connection,
    lake: Lake,
    tenants: list[str] | None = None,
    *,
    policy: DrainPolicy | None = None,
    observer: DrainObserver | None = None,
) -> list[DrainPass]:
    """Run passes as `policy` says (one, or until idle or its time cap) and return them.

    Named tenants are always visited (their Delta logs decide what is left); otherwise the
    tenants the frontier cache shows behind the sequencer are, those `policy.owns` accepts when
    given. `observer` hears of each batch and pass, names the busy tenants each pass leaves
    alone and decides whether a tenant's failure stops the drain (`DrainObserver`)."""
    run = _Drain(conn, lake, tenants, policy or DrainPolicy(), observer or DrainObserver())
    try:
        passes = run.passes()
    except BaseException:
        # The fetcher's connection may be the one that was lost: closing it must not hide why.
        with contextlib.suppress(Exception):
            run.close()
        raise
    run.close()
    return passes


class _Drain:
    """One drain's state from pass to pass: the fetcher, the open tables, the batches read
    ahead, the tenants that failed and the memory governor."""

    def __init__(
        self,
        conn: psycopg.Connection,
        lake: Lake,
        tenants: list[str] | None,
        policy: DrainPolicy,
        observer: DrainObserver,
    ):
        self.conn, self.lake, self.tenants = conn, lake, tenants
        self.policy, self.observer = policy, observer
        self.config = policy.config
        self.scope = frozenset(tenants).__contains__ if tenants else policy.owns
        self.started = time.monotonic()
        # One fetcher (one ADBC connection) for every tenant, made at the first batch: a
        # connection per tenant would hold one Postgres connection per tenant of a shard for the
        # whole run.
        self.fetcher: Fetcher | None = None
        self.ahead = _BatchesAhead()
        self.failed: set[str] = set()
        # The tenants' tables stay open from one pass to the next (brought up to date per batch).
        self.tables = OpenTables(lake)
        self.commits = observer.table_commits()
        # Batches as large as the memory budget allows (ADR 0034), up to the configured cap.
        self.governor = policy.governor or MemoryGovernor(self.config.memory_budget_mib or None)
        # A drain until idle with no time cap cuts the next pass's rows while this pass's
        # batches commit (`_CutAhead`); one with a cap does not, as the cut would outlast it.
        self.cut_ahead = (
            _CutAhead(conn, self.config.max_batch)
            if policy.until_idle and policy.max_seconds is None
            else None
        )

    def passes(self) -> list[DrainPass]:
        passes: list[DrainPass] = []
        current: DrainPass | None = None
        for n in range(self.policy.max_passes):
            pass_started = time.monotonic()
            # A pass waits for a cut ahead under way unless the last pass's batches moved.
            waits = current is None or not current.moved
            current = self._one_pass(last=n + 1 == self.policy.max_passes, waits=waits)
            # A cut ahead not yet taken (under way, or ended since the pass looked) is progress
            # to come: the next pass takes it, waiting for it if it must.
            idle = not current.progressed and not (self.cut_ahead and self.cut_ahead.untaken())
            if not idle or self.policy.poll_seconds is None or not passes:
                passes.append(current)
            self.observer.pass_ended(current)
            if not self._goes_on(idle, pass_started):
                break
        return passes

    def close(self) -> None:
        if self.cut_ahead is not None:
            self.cut_ahead.close()
        if self.fetcher is not None:
            self.fetcher.close()

    def _one_pass(self, last: bool, waits: bool) -> DrainPass:
        current = DrainPass(self._cut(last, waits), scope=self.scope)
        # Each pending tenant's frontier (the frontier cache's), where its next batch starts:
        # the targets, and where the tenant visited next is read ahead from; a drain of one
        # named tenant needs neither.
        pending: dict[str, int] = {}
        if not self.tenants or len(self.tenants) > 1:
            pending = {t: at for t, _, at in sequencer.pending_tenants(self.conn, self.tenants)}
        targets = self._targets(pending)
        self.ahead.keep_only(targets)
        for k, tenant_id in enumerate(targets):
            visited_next = targets[k + 1] if k + 1 < len(targets) else None
            result = self._batch(tenant_id, visited_next=visited_next, pending=pending)
            if result is None:
                continue
            current.batches.append(result)
            self.observer.batch_ended(result)
            self.governor.observed(result.ops)
            if result.ops >= RELEASE_AFTER_OPS:
                release_memory()
        return current

    def _cut(self, last: bool, waits: bool) -> SequencerReport:
        """The pass's cut. With a cut ahead (`_CutAhead`): the one under way, unless it has not
        ended and the drain has rows to go on with (`waits` false: the last pass's batches
        moved), in which case the pass cuts nothing and a later pass takes it; a cut ahead
        that found nothing is made again, as rows may have come since. Then, if another pass
        follows and this cut left rows waiting, the next cut starts."""
        ahead = self.cut_ahead
        if ahead is None:
            return sequencer.sequence_for_batches(self.conn, self.config.max_batch)
        if ahead.under_way() and not waits:
            return SequencerReport()
        cut = ahead.take()
        if cut is None or not cut.sequenced:
            cut = sequencer.sequence_for_batches(self.conn, self.config.max_batch)
        if not last and cut.sequenced and cut.deferred_rows:
            ahead.start()
        return cut

    def _targets(self, pending: dict[str, int]) -> list[str]:
        """The tenants this pass visits, in order: the named ones, else the pending ones the
        policy owns; less those the observer says are busy and those that failed."""
        targets = self.tenants or list(pending)
        if self.policy.owns is not None and not self.tenants:
            targets = [t for t in targets if self.policy.owns(t)]
        if targets:
            busy = self.observer.busy_tenants()
            targets = [t for t in targets if t not in busy]
        return [t for t in targets if t not in self.failed]

    def _batch(
        self, tenant_id: str, *, visited_next: str | None, pending: dict[str, int]
    ) -> BatchResult | None:
        """One batch of the tenant, its three phases in turn; the next batch is read ahead as
        soon as this one's read returns. None when it failed and the observer lets the drain go
        on."""
        self.fetcher = fetcher = self.fetcher or Fetcher(self.conn)
        cap = self.governor.cap(self.config.max_batch)
        config = self.config if cap == self.config.max_batch else self.config.capped(cap)
        batch = TenantBatch(
            tables=self.tables, tenant_id=tenant_id, config=config, commits=self.commits
        )
        try:
            read = batch.read(self.conn, fetcher=fetcher, ahead=self.ahead.take(tenant_id))
            self._read_ahead(
                fetcher, read, config=config, visited_next=visited_next, pending=pending
            )
            return batch.commit(self.conn, read, batch.fold(read))
        except Exception as error:
            if is_transient(error) or not self.observer.tenant_failed(tenant_id, error):
                raise
            self.failed.add(tenant_id)
            return None

    def _read_ahead(
        self,
        fetcher: Fetcher,
        read: BatchRead,
        *,
        config: WriterConfig,
        visited_next: str | None,
        pending: dict[str, int],
    ) -> None:
        """While a batch folds and commits, the fetcher's thread reads the batch the drain needs
        next: the first of the tenant the pass visits next (from where the frontier cache says
        it stands), unless it has one read ahead; otherwise, in a drain until idle, this
        tenant's own next one when the outbox holds more."""
        if visited_next in pending and not self.ahead.has(visited_next):
            self.ahead.start(fetcher, visited_next, after=pending[visited_next], config=config)
        elif self.policy.until_idle and read.more:
            self.ahead.start(fetcher, read.tenant_id, after=read.batch_end, config=config)

    def _goes_on(self, idle: bool, pass_started: float) -> bool:
        """Whether another pass follows the one that started at `pass_started`; a polling drain
        waits here for the rest of its interval."""
        policy = self.policy
        if policy.max_seconds is not None and time.monotonic() - self.started >= policy.max_seconds:
            return False
        # A batch below the lag limit that changes nothing neither commits nor refuses anew,
        # so a drained tenant ends the loop; rows waiting behind a gap do not keep it running.
        if not policy.until_idle or (idle and policy.poll_seconds is None):
            return False
        if policy.poll_seconds is not None and policy.max_seconds is not None:
            # At most one pass per poll_seconds: a trickle of ops makes passes of a few ops
            # each, which cost nearly as much as full ones (a standing run spinning on them
            # took a core at 200 ops/s); waiting the rest of the interval batches them.
            now = time.monotonic()
            rest = min(
                policy.poll_seconds - (now - pass_started),
                policy.max_seconds - (now - self.started),
            )
            if rest > 0:
                time.sleep(rest)
        return True


class _CutAhead:
    """The next pass's cut, made on a connection of its own while the pass's batches commit.

    Over a backlog, each pass of a drain until idle cut its rows (an UPDATE of every outbox row
    it numbers: 1.5-2.9 s per 100,000 rows here) before its first batch, and the drain waited;
    made ahead, Postgres numbers them on the other core while the writer drains the rows
    already sequenced (ADR 0055). Started only when a pass's cut left rows waiting and another
    pass follows; a later pass takes it (`_Drain._cut`), and the drain is not idle until it has
    (`untaken`). A cut is its own transaction under the sequencer's lock, as every other cut (the
    sensor's, another drain's): its rows are sequenced whether or not this drain drains them."""

    def __init__(self, conn: psycopg.Connection, max_batch: int):
        self._conninfo = second_conninfo(conn)
        self._max_batch = max_batch
        self._conn: psycopg.Connection | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[SequencerReport] | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="oml-cut")
        self._future = self._pool.submit(self._cut)

    def _cut(self) -> SequencerReport:
        if self._conn is None:  # a failed cut ends the drain's try: no reconnecting here
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
        return sequencer.sequence_for_batches(self._conn, self._max_batch)

    def under_way(self) -> bool:
        """Whether a cut was started and has not ended."""
        return self._future is not None and not self._future.done()

    def untaken(self) -> bool:
        """Whether a cut was started and not taken yet (`take`)."""
        return self._future is not None

    def take(self) -> SequencerReport | None:
        """The cut started last, once it ends (its error, if it failed); None when none was."""
        future, self._future = self._future, None
        return None if future is None else future.result()

    def close(self) -> None:
        # Waits for a cut under way: its connection is closed only once the cut has ended.
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()


class _BatchesAhead:
    """The batches read ahead, at most one per tenant, each on the fetcher's thread, so
    Postgres builds the batch the drain needs next on the other core instead of the drain
    waiting for it. A batch read from the wrong place (a stale frontier) is read again by the
    batch's read, so a stale guess costs a fetch, never a verdict."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, Future[Batch]] = {}

    def keep_only(self, targets: list[str]) -> None:
        # A batch read ahead for a tenant this pass leaves alone is not kept for later.
        self.by_tenant = {t: f for t, f in self.by_tenant.items() if t in targets}

    def has(self, tenant_id: str) -> bool:
        return tenant_id in self.by_tenant

    def start(self, fetcher: Fetcher, tenant_id: str, *, after: int, config: WriterConfig) -> None:
        self.by_tenant[tenant_id] = fetcher.fetch_async(
            tenant_id, after=after, max_ops=config.max_batch, max_bytes=config.max_batch_bytes
        )

    def take(self, tenant_id: str) -> Batch | None:
        """The tenant's batch read ahead, once read (its error, if the read failed)."""
        future = self.by_tenant.pop(tenant_id, None)
        return None if future is None else future.result()


def drain_riding_through(
    connect: Callable[[], psycopg.Connection],
    lake: Lake,
    tenants: list[str] | None = None,
    *,
    retry: RetryPolicy,
    policy: DrainPolicy | None = None,
    observer: DrainObserver | None = None,
    counters: WriterCounters | None = None,
) -> list[DrainPass]:
    """`drain` over a connection from `connect()`, riding through transient faults (ADR 0045): a
    lost PostgreSQL session or an object-store fault ends the try, and after a jittered backoff
    (`observer.retrying` told of it first) a new try opens a new connection and fresh tables and
    drains on from what the lake and Postgres record. A try cut short by a fault whose outcome
    is unknown (a commit PUT reset after the store applied it) is safe to repeat: each table's
    txn version fences its commits, so the next try skips what landed. A try that committed a
    batch restarts the streak; `retry` bounds a streak, past which TransientFaultsOutlasted
    propagates. `policy.max_seconds` counts from the first try. The passes returned are every
    completed pass of every try (idle passes after the first dropped in a standing drain, as
    `drain` does). `counters`, when given, count the commits, retries and batch times and are
    flushed to PostgreSQL as the drain goes and when it ends (ADR 0066)."""
    policy = policy or DrainPolicy()
    riding = _RidingThrough(observer or DrainObserver(), policy, counters)
    started = time.monotonic()

    def attempt() -> None:
        left = policy.max_seconds
        if left is not None:
            left = max(0.0, left - (time.monotonic() - started))
        with connect() as conn:
            drain(
                conn,
                lake,
                tenants,
                policy=dataclasses.replace(policy, max_seconds=left),
                observer=riding,
            )

    try:
        retrying(attempt, retry, on_retry=riding.retrying, progressed=riding.progressed)
    finally:
        if counters is not None:
            counters.flush()
    return riding.passes


class _RidingThrough(DrainObserver):
    """The caller's observer, as every try of `drain_riding_through` tells it, keeping the
    passes of every try and whether a batch moved since the last fault."""

    def __init__(
        self, caller: DrainObserver, policy: DrainPolicy, counters: WriterCounters | None = None
    ):
        self.caller, self.policy, self.counters = caller, policy, counters
        self.passes: list[DrainPass] = []
        self.moved = False  # whether a batch committed or refused since the last fault

    def busy_tenants(self) -> Collection[str]:
        return self.caller.busy_tenants()

    def batch_ended(self, result: BatchResult) -> None:
        self.moved |= bool(result.committed or result.refused)
        if self.counters is not None:
            self.counters.batch_ended(result)
        self.caller.batch_ended(result)

    def table_commits(self) -> CommitObserver | None:
        return self.caller.table_commits()

    def pass_ended(self, drained: DrainPass) -> None:
        if drained.progressed or self.policy.poll_seconds is None or not self.passes:
            self.passes.append(drained)
        if self.counters is not None:
            self.counters.pass_ended()
        self.caller.pass_ended(drained)

    def tenant_failed(self, tenant_id: str, error: Exception) -> bool:
        return self.caller.tenant_failed(tenant_id, error)

    def retrying(self, fault: Fault, failures: int, wait: float) -> None:
        if self.counters is not None:
            self.counters.retried(fault)
        self.caller.retrying(fault, failures, wait)

    def progressed(self) -> bool:
        got_somewhere, self.moved = self.moved, False
        return got_somewhere
