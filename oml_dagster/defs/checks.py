"""The reconciler in Dagster: its checks on the lake assets and the per-tenant erasure evidence
asset, all stored per tenant partition, all thin wrappers of the core (`lake.reconcile`,
`lake.erasure`), so the UI and `oml-lake reconcile` / `erasure-evidence` say the same thing.

One multi-asset check (`reconciler`) runs the core's checks for the tenant once and reports each
on its asset: every row's tenant_id is the partition's; the frontier cache equals each table's
Delta txn version; the journal chain verifies from bronze alone; silver bodies match their digests
and the journal; silver, lineage and areas equal what the outbox folds to; open dead letters (an
erase among them is an erasure-SLO breach in progress); erased rows carry no body; curated rows
are their silver rows and none is simulation-tainted. `erasure_slo_holds` is the tenant's erasure
evidence as one verdict; the `reconciler/erasure_evidence` asset lists every erased claim version
with its deadline and the files still holding its ciphertext.

They scan whole tables, so the outbox sensor's runs leave them out (a run's cost stays one
batch); the reconcile schedule runs them alone, per tenant, in the lake-writer job (under the
same lease), and a backfill or a run from the UI runs them after the drain.
"""

import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg

from oml_dagster.lake.audit import reconcile as rc
from oml_dagster.lake.audit.doctor import AT_RISK, HOLDS, erasure_verdict
from oml_dagster.lake.audit.erasure import erased_artifacts
from oml_dagster.lake.write import deadletter

from .assets import CURATED, OUTBOX, SILVER, TABLE_OF
from .jobs import ERASURE_EVIDENCE
from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import DeploymentSettings, LakeResource, PostgresResource

# Checks stored per tenant partition need `partitions_def`, which this Dagster release flags as a
# preview; the warning is known and accepted here.
warnings.filterwarnings(
    "ignore", "Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

SAMPLE = 5
# Per-version rows shown in the evidence asset's metadata (`erasure-evidence --json` lists all).
EVIDENCE_ROWS = 200

ASSET_OF_TABLE: dict[str, dg.AssetKey] = {spec.name: key for key, spec in TABLE_OF.items()}
DESCRIPTIONS = {
    rc.TENANT_ID: "Every row's tenant_id is the partition's tenant.",
    rc.FRONTIER: "The Postgres frontier cache equals the table's Delta txn version.",
    rc.CHAIN: (
        "From bronze alone and the public keys: journal_seq 1..n once each, hash = "
        "SHA-256(prev_hash || signed_bytes), prev_hash the previous hash, every Ed25519 sig valid."
    ),
    rc.ERASED: "An erased row has neither body_ciphertext nor attachments.",
    rc.BODIES: (
        "SHA-256(body_ciphertext) = ciphertext_digest, the digest the journal event carried."
    ),
    rc.OUTBOX: "Every row equals what the outbox ops up to the table's txn version fold to.",
    rc.DEAD_LETTERS: (
        "No open dead letter; a dead-lettered erase is an erasure-SLO breach in progress."
    ),
    rc.CURATED: (
        "Every curated row is its silver row (state, body and the rest), and every promoted "
        "silver row of a validated area is curated."
    ),
    rc.TAINT: "No simulation-tainted row in any curated table.",
}


def _spec(table: str, name: str) -> dg.AssetCheckSpec:
    key = ASSET_OF_TABLE[table]
    deps = {rc.CURATED: [SILVER], rc.OUTBOX: [OUTBOX], rc.DEAD_LETTERS: [OUTBOX]}.get(name, [])
    return dg.AssetCheckSpec(
        name,
        asset=key,
        description=DESCRIPTIONS[name],
        additional_deps=deps or None,
        partitions_def=tenant_partitions,
    )


RECONCILER_SPECS = [_spec(table, name) for table, name in rc.CHECKS]
_CHECK_OF_KEY = {
    dg.AssetCheckKey(ASSET_OF_TABLE[table], name): (table, name) for table, name in rc.CHECKS
}


@dg.multi_asset_check(
    name="reconciler",
    specs=RECONCILER_SPECS,
    can_subset=True,
    description="The key-less reconciler's checks for the tenant, one pass over its tables.",
)
def reconciler(
    context: dg.AssetCheckExecutionContext, postgres: PostgresResource, lake: LakeResource
) -> Iterator[dg.AssetCheckResult]:
    selected = [_CHECK_OF_KEY[k] for k in context.selected_asset_check_keys]
    with postgres.connect() as conn:
        result = rc.reconcile(conn, lake.get_lake(), context.partition_key, only=selected)
        rc.record(conn, result)  # what the metrics exporter serves as the last results
        # Dead letters an operator closed (`oml-lake deadletter resolve`): no longer findings,
        # shown beside the open ones with who closed them and why.
        resolved = [
            f"seq {d.seq} {d.op}: resolved by {d.resolved_by}: {d.resolution}"
            for d in deadletter.list_dead_letters(conn, context.partition_key, True)
            if d.resolved_at is not None
        ]
    for r in result.results:
        metadata: dict[str, Any] = {
            "checked": r.checked,
            "findings": len(r.findings),
            "sample_findings": r.samples(SAMPLE),
        }
        if r.name == rc.DEAD_LETTERS:
            metadata.update(resolved=len(resolved), sample_resolved=resolved[:SAMPLE])
        yield dg.AssetCheckResult(
            asset_key=ASSET_OF_TABLE[r.table],
            check_name=r.name,
            passed=r.passed,
            metadata=metadata,
        )


def _evidence(read, context, postgres: PostgresResource, lake: LakeResource):
    """(the maintenance cadence the erasure SLO allows, `read`'s evidence of the partition's
    tenant under it): `read` is `erasure_verdict` or `erased_artifacts`."""
    cadence = lake.settings.erasure_cadence
    with postgres.connect() as conn:
        return cadence, read(conn, lake.get_lake(), context.partition_key, cadence=cadence)


@dg.asset_check(
    asset=SILVER,
    name="erasure_slo_holds",
    partitions_def=tenant_partitions,
    additional_deps=[CURATED],
)
def erasure_slo_holds(
    context: dg.AssetCheckExecutionContext, postgres: PostgresResource, lake: LakeResource
) -> dg.AssetCheckResult:
    """The erasure SLO verdict `oml-lake erasure-evidence` and `oml-lake doctor` print
    (`lake.doctor.erasure_verdict`): fails as an error when breached (an erased body past its
    deadline still in the lake, an erased row with a body, an erase waiting past the deadline),
    as a warning when at risk (a dead-lettered erase, a body within one cadence of its
    deadline)."""
    cadence, verdict = _evidence(erasure_verdict, context, postgres, lake)
    evidence = verdict.evidence
    return dg.AssetCheckResult(
        passed=verdict.state == HOLDS,
        severity=dg.AssetCheckSeverity.WARN
        if verdict.state == AT_RISK
        else dg.AssetCheckSeverity.ERROR,
        description=verdict.headline(),
        metadata={
            "verdict": verdict.state,
            "erasure_bound_seconds": evidence.bound.total_seconds(),
            "cadence_seconds": cadence.total_seconds(),
            "erased_rows": sum(t.erased_rows for t in evidence.tables),
            "unreferenced_files": sum(t.unreferenced_files for t in evidence.tables),
            "overdue_files": sum(len(t.overdue_files) for t in evidence.tables),
            "overdue_log_entries": sum(len(t.overdue_log_entries) for t in evidence.tables),
            "dead_lettered_erases": len(evidence.dead_lettered_erases),
            "pending_erases": len(evidence.pending_erases),
            "breaches": len(verdict.breaches),
            "at_risk": len(verdict.risks),
            "findings": (verdict.breaches + verdict.risks)[:SAMPLE],
        },
    )


@dg.asset(
    key=ERASURE_EVIDENCE,
    group_name="reconciler",
    deps=[SILVER, CURATED],
    partitions_def=tenant_partitions,
    kinds={"deltalake"},  # reads the Delta tables; writes nothing to the lake
    description=(
        "Erasure evidence per tenant: every erased claim version, its SLO deadline (drain lag + "
        "erasure bound + one maintenance cadence), and each file of each copy class (live, "
        "superseded or orphan Parquet, log entry, checkpoint) still holding its ciphertext."
    ),
)
def erasure_evidence_asset(
    context: dg.AssetExecutionContext, postgres: PostgresResource, lake: LakeResource
) -> dg.MaterializeResult:
    cadence, evidence = _evidence(erased_artifacts, context, postgres, lake)
    report = evidence.as_dict()
    with_copies = [a for a in evidence.artifacts if a.copies]
    return dg.MaterializeResult(
        metadata={
            "bound_seconds": evidence.bound.total_seconds(),
            "cadence_seconds": cadence.total_seconds(),
            "erased_versions": len(evidence.artifacts),
            "versions_with_copies": len(with_copies),
            "copies": sum(len(a.copies) for a in evidence.artifacts),
            "overdue_versions": len(evidence.overdue),
            "at_risk_versions": len(evidence.at_risk()),
            "artifacts_shown": min(len(evidence.artifacts), EVIDENCE_ROWS),
            "artifacts": dg.MetadataValue.json(
                dict(report, artifacts=report["artifacts"][:EVIDENCE_ROWS])
            ),
        }
    )


LAKE_CHECKS: list[dg.AssetChecksDefinition] = [reconciler, erasure_slo_holds]
LAKE_CHECK_KEYS: list[dg.AssetCheckKey] = [key for c in LAKE_CHECKS for key in c.check_keys]


def reconcile_requests(
    context: dg.ScheduleEvaluationContext,
) -> Iterator[dg.SkipReason | dg.RunRequest]:
    tenants = context.instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
    if not tenants:
        yield dg.SkipReason("no tenant partitions yet")
        return
    tick = context.scheduled_execution_time.isoformat()
    for t in tenants:
        yield dg.RunRequest(
            run_key=f"{t}:{tick}",
            partition_key=t,
            asset_selection=[ERASURE_EVIDENCE],
            asset_check_keys=LAKE_CHECK_KEYS,
        )


def build_reconcile_schedule(settings: DeploymentSettings) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="reconcile_schedule",
        job_name="lake_writer_job",
        cron_schedule=settings.reconcile_cron,
        execution_timezone=settings.schedule_timezone,
        execution_fn=reconcile_requests,
        default_status=settings.schedule_status,
        description="Runs the reconciler checks and the erasure evidence once per tenant partition.",
    )
