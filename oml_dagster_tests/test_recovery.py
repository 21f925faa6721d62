"""A lost table, or a lost tenant prefix, is rebuilt from the outbox by the same drain: each table
re-drains from its own txn version (0 when absent) and the result equals what was lost."""

from __future__ import annotations

import shutil

import pytest

from oml_dagster.lake.errors import LostCuratedTable
from oml_dagster.lake.model.tables import CORE_TABLES, GOLD_CURATED
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.write.drain import DrainObserver, DrainPass, DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster_tests.conftest import table_rows
from oml_dagster_tests.helpers import lake_snapshot
from oml_dagster_tests.test_commit_fence import mixed_workload

SMALL = WriterConfig(max_batch=9, txn_lag_limit=4)


def _validated_area(lake, tenant_id) -> str:
    from oml_dagster.lake.model.tables import GOLD_AREAS

    (area,) = [a for a in table_rows(lake, tenant_id, GOLD_AREAS) if a["status"] == "validated"]
    return area["workarea_id"]


@pytest.mark.parametrize("lost", [s.name for s in CORE_TABLES] + ["prefix"])
def test_a_lost_table_is_rebuilt_identically(conn, lake, tenant, lost):
    mixed_workload(conn, tenant)
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    before = lake_snapshot(lake, tenant.tenant_id)
    if lost == "prefix":
        shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    elif lost == "gold.curated":
        shutil.rmtree(
            lake.table_uri(tenant.tenant_id, GOLD_CURATED, _validated_area(lake, tenant.tenant_id))
        )
    else:
        spec = next(s for s in CORE_TABLES if s.name == lost)
        shutil.rmtree(lake.table_uri(tenant.tenant_id, spec))
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    assert lake_snapshot(lake, tenant.tenant_id) == before


def test_a_lost_curated_table_alone_asks_for_the_prefix_to_be_rebuilt(conn, lake, tenant):
    mixed_workload(conn, tenant)
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    before = lake_snapshot(lake, tenant.tenant_id)
    area = _validated_area(lake, tenant.tenant_id)
    shutil.rmtree(lake.table_uri(tenant.tenant_id, GOLD_CURATED, area))
    with pytest.raises(LostCuratedTable, match=f"gold.curated/{area} is missing"):
        drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    assert lake_snapshot(lake, tenant.tenant_id) == before


def test_a_prefix_removed_between_passes_of_one_drain_is_rebuilt_not_continued(conn, lake, tenant):
    """A drain keeps its tables open from pass to pass; a prefix removed under it (an operator
    rebuilding the tenant) must be noticed, not written on from the old state, which would
    commit past versions the new log does not have."""
    mixed_workload(conn, tenant)
    removed = []

    class RemoveOnce(DrainObserver):
        def pass_ended(self, drained: DrainPass) -> None:
            if not removed and drained.batches:
                shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
                removed.append(drained.batches[-1].batch_end)

    drain(
        conn,
        lake,
        [tenant.tenant_id],
        policy=DrainPolicy(until_idle=True, config=SMALL),
        observer=RemoveOnce(),
    )
    assert removed
    rebuilt = lake_snapshot(lake, tenant.tenant_id)
    for _, spec, uri in tenant_tables(lake, tenant.tenant_id):
        versions = [c["version"] for c in lake.open(uri).history()]
        assert sorted(versions) == list(range(len(versions))), (spec.name, versions)
    shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=SMALL))
    assert lake_snapshot(lake, tenant.tenant_id) == rebuilt
