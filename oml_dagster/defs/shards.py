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
most a batch, which the fenced commits make safe (DESIGN §3)."""

import uuid

from dagster import (
    AssetMaterialization,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    OpExecutionContext,
    RunsFilter,
    in_process_executor,
    job,
    op,
)

from oml_dagster.lake.drain import drain

from .assets import TABLE_OF, run_metadata
from .resources import LakeResource, PostgresResource, WriterResource

SHARD_TAG = "oml/shard"
PARTITION_TAG = "dagster/partition"
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
        "Drains the pending tenants of one shard, pass after pass, until they are idle or the "
        "run's time cap (OML_RUN_DRAIN_SECONDS) passes; reports each tenant's commits to its "
        "partition of the lake assets."
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
    store = lake.get_lake()
    cap = writer.drain_seconds()
    with postgres.connect() as conn:
        passes = drain(
            conn,
            store,
            until_idle=cap > 0,
            config=writer.config(),
            max_seconds=cap,
            owns=lambda t: shard_of(t, config.shards) == config.shard,
            skip=lambda: tenants_held(context.instance),
        )
        by_tenant: dict[str, list] = {}
        for result in (b for p in passes for b in p.batches):
            by_tenant.setdefault(result.tenant_id, []).append(result)
        reported = {t: run_metadata(conn, store, results) for t, results in by_tenant.items()}
    for tenant_id, metadata in sorted(reported.items()):
        for key in TABLE_OF:
            context.log_event(
                AssetMaterialization(asset_key=key, partition=tenant_id, metadata=metadata[key])
            )
    ops = sum(b.ops for p in passes for b in p.batches)
    context.log.info(
        f"shard {shard_tag(config.shard, config.shards)}: {len(passes)} passes, "
        f"{len(reported)} tenants, {ops} ops read, "
        f"{sum(p.sequenced_here for p in passes)} ops sequenced for the shard"
    )


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
