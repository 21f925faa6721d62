"""The lake-writer job: the five lake assets, the erasure evidence and the reconciler checks,
partitioned by tenant so that every run carries the `dagster/partition` tag the run queue's
per-tenant limit (the leader lease) keys on.

Runs pick what they execute: the outbox sensor's runs drain only (a run's cost is the drain: its
tenant until idle or the run's time cap, never a whole-table check),
the reconcile schedule's run only the checks and the evidence, and a backfill or a run from the UI
does all."""

from dagster import AssetKey, AssetSelection, define_asset_job, in_process_executor

from .assets import TABLE_OF

# The reconciler's evidence asset (defined with the checks, `checks.py`), under the same lease.
ERASURE_EVIDENCE = AssetKey(["reconciler", "erasure_evidence"])

LAKE_ASSET_KEYS: list[AssetKey] = list(TABLE_OF)

# One process per run: the run's single asset step drains its tenant, batch after batch.
lake_writer_job = define_asset_job(
    name="lake_writer_job",
    selection=AssetSelection.assets(*LAKE_ASSET_KEYS, ERASURE_EVIDENCE),
    executor_def=in_process_executor,
    description=(
        "Fold the tenant's sequenced ops into its five lake tables until it is idle or the run's"
        " time cap passes, and check them."
        " The reconciler's runs check the tables and list the erasure evidence."
    ),
)
