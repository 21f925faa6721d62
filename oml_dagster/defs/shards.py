"""Shard runs (ADR 0027): under a steady stream over many tenants, a run per tenant cannot keep
up (each run is a process: seconds of CPU to start, while a tenant's share of the stream is a few
ops a second), so the outbox sensor can instead keep one long run per shard of tenants. Each
tenant belongs to exactly one of `shards` shards (`shard_of`); a shard run drains the pending
tenants of its shard, pass after pass, until they are idle or the run's time cap passes, and
reports each tenant's commits to that tenant's partition of the lake assets.

The lease: shard runs carry `oml/shard` = `<k>/<shards>`, which the run queue limits to one run
per value (dagster.yaml), so a shard has one writer. A tenant-partitioned run (a backfill, a run
from the UI, maintenance) writing one of the shard's tenants is left alone: each pass skips the
tenants such a run holds; one that starts in the middle of a pass overlaps the shard run for at
most a batch, which the fenced commits make safe (DESIGN §3).

Standing runs (ADR 0032, OML_SHARD_STANDING, on by default): the sensor keeps a run in flight for
every shard whether or not it has pending tenants, and a shard run out of work polls the outbox
every POLL_SECONDS until its cap, so the first ops after a quiet spell meet a running writer
instead of waiting for a sensor tick and a process start."""

import functools
import os
import time
import uuid
from typing import Any

from dagster import (
    AssetKey,
    AssetMaterialization,
    Config,
    DagsterEvent,
    DagsterInstance,
    DagsterRunStatus,
    Failure,
    OpExecutionContext,
    RunsFilter,
    in_process_executor,
    job,
    op,
)
from dagster._core.events import DagsterEventBatchMetadata, generate_event_batch_id

from oml_dagster.lake.audit.run_report import run_report
from oml_dagster.lake.faults import describe
from oml_dagster.lake.write.counters import WriterCounters
from oml_dagster.lake.write.drain import DrainPass, DrainPolicy, drain_riding_through
from oml_dagster.lake.write.writer import BatchResult

from .assets import TABLE_OF, run_metadata
from .failures import RunDrainObserver, failing_clearly, with_retry
from .resources import LakeResource, PostgresResource, WriterResource

SHARD_TAG = "oml/shard"
# How often a standing shard run out of work looks at the outbox again (a cut and one query).
POLL_SECONDS = 0.5
# How often a shard run reports its tenants' commits (and once at its end).
REPORT_SECONDS = 30.0
PARTITION_TAG = "dagster/partition"
# Dagster stores the events of one batch (one asset's partitions, as it does for a partitioned
# output) in one INSERT and one index transaction when DAGSTER_EVENT_BATCH_SIZE is set; one by one,
# dagster-postgres opens two connections per event (its engine pools none), which cost a shard
# run more CPU than its drain did for many tenants (bench/RESULTS.md, issue 43's profile).
EVENT_BATCH_SIZE = "1000"
IN_FLIGHT = [
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def shard_of(tenant_id: str, shards: int) -> int:
    """The shard (0 .. shards-1) that holds a tenant: its UUID's number modulo the count, so a
    tenant's shard is fixed for a given count and tenants spread evenly."""
    return uuid.UUID(tenant_id).int % shards


def shard_tag(shard: int, shards: int) -> str:
    return f"{shard}/{shards}"


def tenants_held(instance: DagsterInstance) -> set[str]:
    """Tenants that a queued or running tenant-partitioned run (any job) writes."""
    runs = instance.get_runs(RunsFilter(statuses=IN_FLIGHT))
    return {run.tags[PARTITION_TAG] for run in runs if PARTITION_TAG in run.tags}


class ShardConfig(Config):
    shard: int
    shards: int


@op(
    description=(
        "Drains the pending tenants of one shard, pass after pass, until the shard run's time "
        "cap (OML_SHARD_RUN_SECONDS) passes, polling the outbox while idle (a standing run, "
        "OML_SHARD_STANDING), or until they are idle; reports each tenant's commits to its "
        "partition of the lake assets as it goes."
    )
)
def drain_shard(
    context: OpExecutionContext,
    config: ShardConfig,
    postgres: PostgresResource,
    lake: LakeResource,
    writer: WriterResource,
) -> None:
    if not 0 <= config.shard < config.shards:
        raise ValueError(f"shard {config.shard} is not one of 0..{config.shards - 1}")
    settings = writer.settings
    cap, retry = settings.shard_run_seconds, settings.retry
    tag = shard_tag(config.shard, config.shards)
    with failing_clearly():
        store = with_retry(context, retry, lake.get_lake)
        report = _Report(context, postgres, store, retry)
        shard = _ShardDrain(context, report)
        passes = drain_riding_through(
            postgres.connect,
            store,
            retry=retry,
            policy=DrainPolicy(
                until_idle=cap > 0,
                max_seconds=cap,
                poll_seconds=POLL_SECONDS if settings.standing else None,
                owns=lambda t: shard_of(t, config.shards) == config.shard,
                config=settings.config,
            ),
            observer=shard,
            counters=WriterCounters(postgres.connect),
        )
        report.flush()
    errors = shard.errors
    context.log.info(
        f"shard {tag}: {len(passes)} passes, {len(report.tenants)} tenants, "
        f"{sum(b.ops for p in passes for b in p.batches)} ops read, "
        f"{sum(p.sequenced_here for p in passes)} ops sequenced for the shard, "
        f"{report.flushes} reports"
    )
    if errors:
        raise Failure(
            description=(
                f"shard {tag}: {len(errors)} tenant(s) failed and were left alone; the others "
                f"were drained: " + "; ".join(f"{t}: {e}" for t, e in sorted(errors.items()))
            ),
            metadata={"failed_tenants": sorted(errors)},
        )


class _Report:
    """Each tenant's commits since the last report, logged as materializations of its partition
    every REPORT_SECONDS of the run and at its end: a long shard run shows its progress in the UI
    as it goes, and the report's cost stays a small part of the run."""

    def __init__(self, context: OpExecutionContext, postgres, store, policy):
        self.context, self.postgres, self.store, self.policy = context, postgres, store, policy
        self.waiting: dict[str, list[BatchResult]] = {}
        self.tenants: set[str] = set()
        self.flushes = 0
        self.last = time.monotonic()

    def on_pass(self, drained: DrainPass) -> None:
        for result in drained.batches:
            self.waiting.setdefault(result.tenant_id, []).append(result)
        if time.monotonic() - self.last >= REPORT_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Each waiting tenant's report, as one batch of materializations per asset."""
        if not self.waiting:
            self.last = time.monotonic()
            return
        waiting = sorted(self.waiting.items())
        metadata = with_retry(self.context, self.policy, functools.partial(self._metadata, waiting))
        # Read by Dagster when each event is handled; a run worker runs one run.
        os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", EVENT_BATCH_SIZE)
        step = self.context.get_step_execution_context()
        for key in TABLE_OF:
            batch = generate_event_batch_id()
            for i, (tenant_id, _) in enumerate(waiting):
                DagsterEvent.asset_materialization(
                    step,
                    AssetMaterialization(
                        asset_key=key, partition=tenant_id, metadata=metadata[tenant_id][key]
                    ),
                    DagsterEventBatchMetadata(batch, is_end=i == len(waiting) - 1),
                )
        self.tenants.update(tenant_id for tenant_id, _ in waiting)
        self.flushes += 1
        self.waiting = {}
        self.last = time.monotonic()

    def _metadata(
        self, waiting: list[tuple[str, list[BatchResult]]]
    ) -> dict[str, dict[AssetKey, dict[str, Any]]]:
        # A connection of its own per report (the drain's may have been lost and replaced), one
        # for every tenant of the report.
        with self.postgres.connect() as conn:
            return {
                tenant_id: run_metadata(run_report(conn, results), self.store)
                for tenant_id, results in waiting
            }


class _ShardDrain(RunDrainObserver):
    """What a shard run's drain tells it: each pass goes to the report; the tenants a
    tenant-partitioned run holds are left alone each pass; a tenant that fails is left for the
    rest of the run and named when it ends."""

    def __init__(self, context: OpExecutionContext, report: _Report):
        super().__init__(context)
        self.report = report
        self.errors: dict[str, str] = {}

    def busy_tenants(self) -> set[str]:
        return tenants_held(self.context.instance)

    def pass_ended(self, drained: DrainPass) -> None:
        self.report.on_pass(drained)

    def tenant_failed(self, tenant_id: str, error: Exception) -> bool:
        # One broken tenant must not stop its shard: it is left for the rest of the run, the
        # others go on, and the run fails at its end naming it (its freshness check flags it).
        # Transient faults never come here: the drain starts over (`drain_riding_through`).
        self.errors[tenant_id] = describe(error)[0]
        self.context.log.error(f"tenant {tenant_id}: {self.errors[tenant_id]}")
        return True


@job(
    name="lake_writer_shard_job",
    executor_def=in_process_executor,
    description=(
        "One shard of tenants drained by one run (the outbox sensor's runs when OML_DRAIN_SHARDS "
        "is set); materializations go to each tenant's partition."
    ),
)
def lake_writer_shard_job():
    drain_shard()
