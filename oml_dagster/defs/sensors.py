"""`outbox_sensor`: each tick runs the sequencer's stable-prefix cut, adds a partition for every
tenant Postgres knows that the instance does not (with or without pending ops, drained by Dagster
or only by the CLI: maintenance and evidence schedules iterate the partitions), and requests one
lake-writer run per shard of tenants (every shard when shard runs stand, ADR 0032; those with
sequenced ops not yet drained otherwise), or one per such tenant when shards are off.

A tick's cost does not grow with a per-tenant loop of queries: one cut, one aggregate query over
the sequencer and the frontier cache (and one more for the pending tenants' last drain time), one
listing of the known tenant ids, one read of the instance's partitions and one of its in-flight
lake-writer runs, whatever the tenant count. What the daemon does with a tick's result does grow
with it, one storage connection per new partition and per event, so a tick adds at most
MOST_NEW_PARTITIONS_PER_TICK partitions and reports the outbox of at most
MOST_OUTBOX_EVENTS_PER_TICK tenants, taking turns from tick to tick (the cursor names where the
next tick's turn starts); the rest come on the next ticks.
"""

import datetime as dt
import hashlib
from dataclasses import dataclass

from dagster import (
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    RunRecord,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from oml_dagster.lake import queries
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.ingest.sequencer import SequencerReport
from oml_dagster.lake.policy import known_tenants
from oml_dagster.lake.queries import cross_scope

from .assets import OUTBOX
from .jobs import LAKE_ASSET_KEYS, lake_writer_job
from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import DeploymentSettings, PostgresResource, WriterResource, WriterSettings
from .shards import IN_FLIGHT, PARTITION_TAG, SHARD_TAG, lake_writer_shard_job, shard_of, shard_tag

# What one tick hands the daemon, at most. Dagster checks each new partition key and
# stores each event with a storage connection of its own (dagster-postgres holds none open): a
# tick that added 1,000 tenants kept the daemon 106 s, and one that reported 1,000 tenants'
# outbox 70 s, on a loaded two-core machine, and no other tick ran meanwhile.
MOST_NEW_PARTITIONS_PER_TICK = 100
MOST_OUTBOX_EVENTS_PER_TICK = 100


def taking_turns(tenants: list[str], after: str | None, most: int) -> list[str]:
    """At most `most` of `tenants` (sorted ids), starting after `after` and wrapping around:
    successive calls, each after the last id of the one before, visit every tenant in turn."""
    if len(tenants) <= most:
        return tenants
    start = next((i for i, t in enumerate(tenants) if after is not None and t > after), 0)
    return (tenants[start:] + tenants[:start])[:most]


def run_key(
    tenant_id: str, drained_through: int, last_seq: int, drained_at: dt.datetime | None
) -> str:
    """A batch as the sensor sees it: the tenant, how far the lake is drained, how far the outbox
    is sequenced, and when the last run finished.

    A tick that sees the same batch again (its run still to come, or failed: Dagster retries it
    by run_retries, an operator by a backfill) asks under the same key, which Dagster launches
    once. Every finished run changes the key, so a backlog longer than one batch, or a lost
    tenant rebuilt one batch per run by a backfill, gets its next run on the next tick even when
    the drained and sequenced ends repeat an earlier state."""
    stamp = int(drained_at.timestamp() * 1_000_000) if drained_at else 0
    return f"{tenant_id}:{drained_through}:{last_seq}:{stamp}"


def tenants_in_flight(instance: DagsterInstance) -> set[str]:
    """Tenants with a lake-writer run queued or running, from one query of the run storage."""
    runs = instance.get_runs(RunsFilter(job_name=lake_writer_job.name, statuses=IN_FLIGHT))
    return {run.tags[PARTITION_TAG] for run in runs if PARTITION_TAG in run.tags}


def shard_runs_in_flight(instance: DagsterInstance) -> dict[str, list[RunRecord]]:
    """The shard runs queued or running, by `oml/shard` tag, from one query of the run storage."""
    found: dict[str, list[RunRecord]] = {}
    for record in instance.get_run_records(
        RunsFilter(job_name=lake_writer_shard_job.name, statuses=IN_FLIGHT)
    ):
        if SHARD_TAG in record.dagster_run.tags:
            found.setdefault(record.dagster_run.tags[SHARD_TAG], []).append(record)
    return found


def shards_in_flight(instance: DagsterInstance) -> set[str]:
    """`oml/shard` tags of the shard runs queued or running."""
    return set(shard_runs_in_flight(instance))


def writers_in_flight(instance: DagsterInstance, tenants: set[str]) -> set[str]:
    """Those of `tenants` a queued or running lake-writer run writes: its own tenant run, or the
    shard run of its shard."""
    busy = tenants_in_flight(instance) & tenants
    for tag in shards_in_flight(instance):
        shard, shards = (int(part) for part in tag.split("/"))
        busy |= {t for t in tenants if shard_of(t, shards) == shard}
    return busy


def shard_requests(
    instance: DagsterInstance,
    pending: list[tuple[str, int, int]],
    drained_at: dict,
    shards: int,
    *,
    standing: bool = False,
    handover_after: float | None = None,
    now: dt.datetime | None = None,
) -> list[RunRequest]:
    """One shard run per shard with no run in flight: every shard when runs stand (ADR 0032),
    else those with pending tenants. The key is the shard and its pending tenants' batch keys
    (`run_key`), so it changes whenever one of them moves; a standing shard with none pending
    is keyed by the tick's time (its run is asked for only while none is in flight).

    With `handover_after` (standing runs: their cap less a tick and a margin), a shard whose only
    run in flight started that many seconds ago gets its successor now, keyed by the running
    run's id (asked once): it waits in the queue behind the shard's lease and starts as soon as
    its predecessor ends, instead of at the next tick after it."""
    now = now or dt.datetime.now(dt.UTC)
    members: dict[int, list[str]] = {k: [] for k in range(shards)} if standing else {}
    for tenant_id, last_seq, drained in pending:
        key = run_key(tenant_id, drained, last_seq, drained_at.get(tenant_id))
        members.setdefault(shard_of(tenant_id, shards), []).append(key)
    in_flight = shard_runs_in_flight(instance)
    requests = []
    for shard, keys in sorted(members.items()):
        tag = shard_tag(shard, shards)
        runs = in_flight.get(tag, [])
        if not runs:
            parts = keys or [f"standing@{now.isoformat()}"]
            digest = hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:24]
            key = f"shard:{tag}:{digest}"
        elif (
            handover_after is not None
            and len(runs) == 1
            and runs[0].start_time is not None
            and now.timestamp() - runs[0].start_time >= handover_after
        ):
            key = f"shard:{tag}:after:{runs[0].dagster_run.run_id}"
        else:
            continue
        requests.append(
            RunRequest(
                job_name=lake_writer_shard_job.name,
                run_key=key,
                run_config={"ops": {"drain_shard": {"config": {"shard": shard, "shards": shards}}}},
                tags={SHARD_TAG: tag, "oml/pending_tenants": str(len(keys))},
            )
        )
    return requests


# A standing shard run's successor is asked for this long (plus one sensor tick) before the
# running one reaches its cap, so that a tick falls in the window and the successor is queued.
HANDOVER_MARGIN_SECONDS = 15.0


@dataclass(frozen=True)
class OutboxTick:
    """What one tick reads of PostgreSQL: the sequencing cut it made, the tenants with sequenced
    ops not yet drained (tenant, last seq, drained through), when each of those last finished a
    drain, and every tenant PostgreSQL knows."""

    cut: SequencerReport
    pending: list[tuple[str, int, int]]
    drained_at: dict[str, dt.datetime]
    tenants: set[str]

    @property
    def pending_ids(self) -> set[str]:
        return {t for t, _, _ in self.pending}


def read_outbox(postgres: PostgresResource) -> OutboxTick:
    """The tick's one cut and its three queries, whatever the tenant count."""
    with postgres.connect() as conn:
        cut = sequencer.sequence(conn)
        pending = sequencer.pending_tenants(conn)
        with cross_scope(conn):
            drained_at = queries.drained_at(conn, sorted({t for t, _, _ in pending}))
        tenants = set(known_tenants(conn))
    return OutboxTick(cut, pending, drained_at, tenants)


@dataclass(frozen=True)
class TickPartitions:
    """The tenant partitions as this tick leaves them: those the instance knows, those it adds
    (`new`, at most MOST_NEW_PARTITIONS_PER_TICK) and how many wait for the next ticks."""

    known: set[str]
    new: list[str]
    later: int

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self.known or tenant_id in self.new


def keep_partitions(context: SensorEvaluationContext, tick: OutboxTick) -> TickPartitions:
    """A partition for every tenant PostgreSQL knows, a page per tick. One listing of the
    partitions, through the tick's caching loader when it has one: Dagster checks each run
    request's partition key against that loader, one storage query per key unless the loader
    already knows it (1,000 pending tenants: 1,000 queries, seconds), so the pending keys are
    told to it in one bounded query."""
    loader = context.caching_dynamic_partitions_loader
    known = set(
        loader.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
        if loader is not None
        else context.instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
    )
    unknown = sorted((tick.tenants | tick.pending_ids | set(tick.cut.tenants)) - known)
    if loader is not None:
        pending_known = sorted(known & tick.pending_ids)
        loader.get_existing_dynamic_partitions(TENANT_PARTITIONS_NAME, pending_known)
    new = unknown[:MOST_NEW_PARTITIONS_PER_TICK]
    return TickPartitions(known, new, len(unknown) - len(new))


def tenant_requests(
    instance: DagsterInstance, tick: OutboxTick, partitions: TickPartitions
) -> list[RunRequest]:
    """One lake-writer run per pending tenant with a partition and no run in flight."""
    busy = tenants_in_flight(instance)
    return [
        RunRequest(
            job_name=lake_writer_job.name,
            run_key=run_key(tenant_id, drained, last_seq, tick.drained_at.get(tenant_id)),
            partition_key=tenant_id,
            asset_selection=LAKE_ASSET_KEYS,
            asset_check_keys=[],
            tags={"oml/drained_through": str(drained), "oml/last_seq": str(last_seq)},
        )
        for tenant_id, last_seq, drained in tick.pending
        if tenant_id not in busy and tenant_id in partitions
    ]


def run_requests(
    instance: DagsterInstance,
    tick: OutboxTick,
    partitions: TickPartitions,
    writer: WriterSettings,
    *,
    interval_seconds: float,
) -> list[RunRequest]:
    """Shard runs when the writer keeps shards (a standing run's successor asked for a tick
    and a margin before its cap), else one run per pending tenant."""
    if not writer.shards:
        return tenant_requests(instance, tick, partitions)
    lead = interval_seconds + HANDOVER_MARGIN_SECONDS
    return shard_requests(
        instance,
        tick.pending,
        tick.drained_at,
        writer.shards,
        standing=writer.standing,
        handover_after=max(0.0, writer.shard_run_seconds - lead) if writer.standing else None,
    )


def outbox_events(
    context: SensorEvaluationContext, cut: SequencerReport, partitions: TickPartitions
) -> tuple[list[str], list[AssetMaterialization | AssetObservation]]:
    """(the tenants whose newly sequenced rows this tick reports, taking turns past the cursor;
    the events: those reports, and an observation of each gap that holds rows back)."""
    reported = taking_turns(
        sorted(t for t in cut.tenants if t in partitions),
        context.cursor or None,
        MOST_OUTBOX_EVENTS_PER_TICK,
    )
    events: list[AssetMaterialization | AssetObservation] = [
        AssetMaterialization(
            asset_key=OUTBOX,
            partition=c.tenant_id,
            description="rows sequenced by the outbox sensor",
            metadata={
                "rows_sequenced": c.sequenced,
                "first_seq": c.first_seq,
                "last_seq": c.last_seq,
                "last_journal_seq": c.last_journal_seq,
            },
        )
        for c in (cut.tenants[t] for t in reported)
    ]
    for gap in cut.gaps:
        context.log.warning(
            f"tenant {gap.tenant_id}: {gap.waiting_rows} rows wait behind journal_seq "
            f"{gap.missing_journal_seq} for {gap.age_seconds:.0f}s"
        )
        if gap.tenant_id in partitions:
            events.append(
                AssetObservation(
                    asset_key=OUTBOX,
                    partition=gap.tenant_id,
                    metadata={
                        "rows_waiting_behind_gap": gap.waiting_rows,
                        "missing_journal_seq": gap.missing_journal_seq,
                        "gap_age_seconds": gap.age_seconds,
                    },
                )
            )
    return reported, events


def tick_summary(
    tick: OutboxTick,
    partitions: TickPartitions,
    requests: list[RunRequest],
    reported: list[str],
    shards: int,
) -> str:
    cut = tick.cut
    if shards:
        waiting = f"{len(tick.pending)} tenants pending over {shards} shards"
    else:
        waiting = f"{len(tick.pending) - len(requests)} tenants pending behind an in-flight run"
    unreported = len(cut.tenants) - len(reported)
    return (
        f"sequenced {cut.sequenced} rows for {len(cut.tenants)} tenants"
        + (f" (the outbox reported for {len(reported)} this tick)" if unreported else "")
        + f"; {len(partitions.new)} new tenants"
        + (f" ({partitions.later} more on the next ticks)" if partitions.later else "")
        + f"; {len(requests)} runs requested; {waiting}"
    )


def build_outbox_sensor(settings: DeploymentSettings) -> SensorDefinition:
    """`outbox_sensor`, ticking every `settings.sensor_interval_seconds`."""

    @sensor(
        name="outbox_sensor",
        jobs=[lake_writer_job, lake_writer_shard_job],
        minimum_interval_seconds=settings.sensor_interval_seconds,
        default_status=settings.sensor_status,
        description=(
            "Sequences the outbox, adds every tenant Postgres knows as a partition and requests "
            "one run per shard of tenants (OML_DRAIN_SHARDS) with none in flight: every shard "
            "when shard runs stand (OML_SHARD_STANDING), else those with pending ops; or one "
            "lake-writer run per tenant with pending ops when OML_DRAIN_SHARDS is 0."
        ),
    )
    def outbox_sensor(
        context: SensorEvaluationContext, postgres: PostgresResource, writer: WriterResource
    ) -> SensorResult:
        tick = read_outbox(postgres)
        partitions = keep_partitions(context, tick)
        requests = run_requests(
            context.instance,
            tick,
            partitions,
            writer.settings,
            interval_seconds=settings.sensor_interval_seconds,
        )
        reported, events = outbox_events(context, tick.cut, partitions)
        context.log.info(tick_summary(tick, partitions, requests, reported, writer.settings.shards))
        if not requests and not partitions.new and not events:
            return SensorResult(skip_reason="no pending ops")
        unreported = len(tick.cut.tenants) > len(reported)
        return SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=(
                [tenant_partitions.build_add_request(partitions.new)] if partitions.new else []
            ),
            asset_events=events,
            cursor=reported[-1] if unreported and reported else context.cursor,
        )

    return outbox_sensor
