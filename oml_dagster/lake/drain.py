"""Drain passes: sequence, then one batch per tenant with pending ops; the same loop serves
`oml-lake drain`, the benchmarks, the tests and each lake-writer run of the Dagster layer (one
tenant, until idle or a time cap: ADR 0021)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import psycopg

from . import sequencer
from .faults import Fault, RetryPolicy, is_transient, retrying
from .fetch import Batch, Fetcher
from .memory import MemoryGovernor, release_memory
from .sequencer import SequencerReport
from .storage import Lake, OpenTables
from .writer import BatchResult, ReadAhead, WriterConfig, drain_tenant

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
    def progressed(self) -> bool:
        return self.sequenced_here > 0 or any(b.committed or b.refused for b in self.batches)


def drain(
    conn: psycopg.Connection,
    lake: Lake,
    tenants: list[str] | None = None,
    *,
    until_idle: bool = False,
    config: WriterConfig | None = None,
    on_pass: Callable[[DrainPass], None] | None = None,
    max_passes: int = 100_000,
    max_seconds: float | None = None,
    owns: Callable[[str], bool] | None = None,
    skip: Callable[[], set[str]] | None = None,
    on_error: Callable[[str, Exception], None] | None = None,
    poll_seconds: float | None = None,
    governor: MemoryGovernor | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
) -> list[DrainPass]:
    """Run passes until one neither sequences nor applies anything (or just one pass), or until
    a pass ends `max_seconds` after the start (the pass under way always finishes: its batches
    are committed or not, never cut).

    Named tenants are always visited (their Delta logs decide what is left); otherwise the
    tenants the frontier cache shows behind the sequencer are, those `owns` accepts when given
    (a shard of tenants: only their rows count as progress). `skip()`, asked once per pass,
    names tenants to leave alone in that pass (another run writes them). With `on_error`, a
    tenant whose batch raises is handed to it with the error and left alone for the rest of
    the drain, so one broken tenant does not stop the others (a shard run); without, the error
    propagates. A transient fault (`faults.is_transient`: a lost connection, a store's 5xx)
    always propagates: it is no tenant's fault, and `drain_riding_through` starts over.

    With `poll_seconds` (a standing shard run, ADR 0032) an idle pass does not end the drain,
    which passes again until `max_seconds`, at most once per `poll_seconds`: ops arriving after a
    quiet spell are sequenced and drained by a writer already running, and a trickle is drained
    in batches of half a second's ops rather than one pass per op. Idle passes after the first
    are not kept in the passes returned.

    Each batch takes at most `config.max_batch` ops, fewer when the memory budget
    (`config.memory_budget_mib`, measured by `governor`, one made here when none is given) calls
    for it (ADR 0034). `on_batch` is told of each tenant batch as it ends, before its pass does."""
    if max_seconds is not None and not max_seconds >= 0:
        raise ValueError(f"max_seconds must be >= 0, got {max_seconds!r}")
    if poll_seconds is not None and (not poll_seconds > 0 or max_seconds is None):
        raise ValueError(
            f"poll_seconds must be > 0 and bounded by max_seconds, got {poll_seconds!r} "
            f"with max_seconds {max_seconds!r}"
        )
    started = time.monotonic()
    config = config or WriterConfig()
    scope = frozenset(tenants).__contains__ if tenants else owns
    passes: list[DrainPass] = []
    # One fetcher (one ADBC connection) for every tenant: a connection per tenant would hold
    # one Postgres connection per tenant of a shard for the whole run. While a batch commits,
    # the fetcher's thread reads the batch the drain needs next: the first of the tenant the
    # pass visits next, or after the pass's last tenant its own next one (until idle), so
    # Postgres builds that batch on the other core instead of the drain waiting for it.
    fetcher: Fetcher | None = None
    following: dict[str, Future[Batch]] = {}
    failed: set[str] = set()
    # The tenants' tables stay open from one pass to the next (brought up to date per batch).
    tables = OpenTables(lake)
    # Batches as large as the memory budget allows (ADR 0034), up to the configured cap.
    governor = governor or MemoryGovernor(config.memory_budget_mib or None)
    try:
        for _ in range(max_passes):
            pass_started = time.monotonic()
            cut = sequencer.sequence_for_batches(conn, config.max_batch)
            current = DrainPass(cut, scope=scope)
            # Each pending tenant's frontier (the frontier cache's), where its next batch starts:
            # the targets, and where the tenant visited next is read ahead from; a drain of one
            # named tenant needs neither.
            pending: dict[str, int] = {}
            if not tenants or len(tenants) > 1:
                pending = {t: at for t, _, at in sequencer.pending_tenants(conn, tenants)}
            targets = tenants or list(pending)
            if owns is not None and not tenants:
                targets = [t for t in targets if owns(t)]
            if skip is not None and targets:
                busy = skip()
                targets = [t for t in targets if t not in busy]
            targets = [t for t in targets if t not in failed]
            # A batch read ahead for a tenant this pass leaves alone is not kept for later.
            following = {t: f for t, f in following.items() if t in targets}
            for k, tenant_id in enumerate(targets):
                fetcher = fetcher or Fetcher(conn)
                cap = governor.cap(config.max_batch)
                visited_next = targets[k + 1] if k + 1 < len(targets) else None
                then = None
                if visited_next in pending and visited_next not in following:
                    then = (visited_next, pending[visited_next])
                try:
                    result = drain_tenant(
                        conn,
                        lake,
                        tenant_id,
                        config if cap == config.max_batch else config.capped(cap),
                        fetcher=fetcher,
                        prefetched=following.pop(tenant_id, None),
                        tables=tables,
                        read_ahead=ReadAhead(own=until_idle, then=then),
                    )
                except Exception as error:
                    if on_error is None or is_transient(error):
                        raise
                    failed.add(tenant_id)
                    on_error(tenant_id, error)
                    continue
                if result.next_batch is not None:
                    following[result.next_tenant] = result.next_batch
                # The pass keeps the result, not the batch read ahead: the passes would
                # otherwise pin every batch of the backlog until the drain ends.
                result.next_batch = None
                current.batches.append(result)
                if on_batch is not None:
                    on_batch(result)
                governor.observed(result.ops)
                if result.ops >= RELEASE_AFTER_OPS:
                    release_memory()
            idle = not current.progressed
            if not idle or poll_seconds is None or not passes:
                passes.append(current)
            if on_pass is not None:
                on_pass(current)
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                break
            # A batch below the lag limit that changes nothing neither commits nor refuses anew,
            # so a drained tenant ends the loop; rows waiting behind a gap do not keep it running.
            if not until_idle or (idle and poll_seconds is None):
                break
            if poll_seconds is not None:
                # At most one pass per poll_seconds: a trickle of ops makes passes of a few ops
                # each, which cost nearly as much as full ones (a standing run spinning on them
                # took a core at 200 ops/s); waiting the rest of the interval batches them.
                now = time.monotonic()
                rest = min(poll_seconds - (now - pass_started), max_seconds - (now - started))
                if rest > 0:
                    time.sleep(rest)
    except BaseException:
        # The fetcher's connection may be the one that was lost: closing it must not hide why.
        if fetcher is not None:
            with contextlib.suppress(Exception):
                fetcher.close()
        raise
    if fetcher is not None:
        fetcher.close()
    return passes


def drain_riding_through(
    connect: Callable[[], psycopg.Connection],
    lake: Lake,
    tenants: list[str] | None = None,
    *,
    retry: RetryPolicy,
    on_retry: Callable[[Fault, int, float], None] | None = None,
    on_pass: Callable[[DrainPass], None] | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    max_seconds: float | None = None,
    poll_seconds: float | None = None,
    **options,
) -> list[DrainPass]:
    """`drain` over a connection from `connect()`, riding through transient faults (ADR 0045): a
    lost PostgreSQL session or an object-store fault ends the try, and after a jittered backoff
    a new try opens a new connection and fresh tables and drains on from what the lake and
    Postgres record. A try cut short by a fault whose outcome is unknown (a commit PUT reset
    after the store applied it) is safe to repeat: each table's txn version fences its commits,
    so the next try skips what landed. A try that committed a batch restarts the streak;
    `retry` bounds a streak, past which TransientFaultsOutlasted propagates. `max_seconds`
    counts from the first try. The passes returned are every completed pass of every try (idle
    passes after the first dropped in a standing drain, as `drain` does)."""
    started = time.monotonic()
    passes: list[DrainPass] = []
    moved = [False]  # whether a batch committed or refused since the last fault

    def landed(current: DrainPass) -> None:
        if current.progressed or poll_seconds is None or not passes:
            passes.append(current)
        if on_pass is not None:
            on_pass(current)

    def batch_ended(result: BatchResult) -> None:
        moved[0] |= bool(result.committed or result.refused)
        if on_batch is not None:
            on_batch(result)

    def attempt() -> None:
        left = None
        if max_seconds is not None:
            left = max(0.0, max_seconds - (time.monotonic() - started))
        with connect() as conn:
            drain(
                conn,
                lake,
                tenants,
                max_seconds=left,
                poll_seconds=poll_seconds,
                on_pass=landed,
                on_batch=batch_ended,
                **options,
            )

    def progressed() -> bool:
        got_somewhere, moved[0] = moved[0], False
        return got_somewhere

    retrying(attempt, retry, on_retry=on_retry, progressed=progressed)
    return passes
