"""gold.curated/<workarea>: created at validation from silver's promoted rows as of the op, in one
commit; afterwards only demote and erase reach it, under the same batch as silver."""

from __future__ import annotations

import datetime as dt

from oml_dagster.lake.model.tables import GOLD_CURATED, SILVER_CLAIMS
from oml_dagster.simulate import acts
from oml_dagster_tests.conftest import by_key, curated_rows
from oml_dagster_tests.helpers import LakeView, dead_letters, drain_all, make_tree, new_id, promoted


def _curated(lake, tenant, workarea_id) -> dict:
    return by_key(curated_rows(lake, tenant.tenant_id, workarea_id), "artifact_id", "version")


def test_validation_creates_curated_from_promoted_rows_in_one_commit(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    keep, demoted, elsewhere = (promoted(conn, tenant, tree.a) for _ in range(3))
    acts.demote(conn, tenant, demoted)
    acts.reassign(conn, tenant, elsewhere, tree.b, held=False)
    drain_all(conn, lake)
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    passes = drain_all(conn, lake)

    curated = _curated(lake, tenant, tree.a)
    assert set(curated) == {(keep.artifact_id, 1)}
    row = curated[(keep.artifact_id, 1)]
    silver = LakeView(lake, tenant.tenant_id).claim(keep)
    assert {k: v for k, v in row.items() if k not in ("curated_at", "applied_seq")} == {
        k: v for k, v in silver.items() if k != "applied_seq"
    }
    assert row["body_ciphertext"] is not None and row["curated_at"] is not None
    assert LakeView(lake, tenant.tenant_id).areas[tree.a]["status"] == "validated"

    table = lake.open(lake.table_uri(tenant.tenant_id, GOLD_CURATED, tree.a))
    assert table.version() == 0, "created and populated in one commit"
    history = table.history()
    batch = [b for p in passes for b in p.batches if b.ops][0]
    assert table.transaction_version("oml-lakewriter") == batch.batch_end
    assert history[0]["oml.batch_end"] == str(batch.batch_end)


def test_curated_is_as_of_the_validate_op_not_the_batch_end(conn, lake, tenant):
    """Ops after area.validate in the same batch: a demote reaches curated (it holds the row),
    a promotion into the area is refused by freeze."""
    tree = make_tree(conn, tenant)
    first = promoted(conn, tenant, tree.a)
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    acts.demote(conn, tenant, first, at=dt.datetime(2026, 11, 2, tzinfo=dt.UTC))
    late = acts.Claim(new_id(), 1, tree.a, "u.a")
    acts.promote(conn, tenant, late, b"late")
    drain_all(conn, lake)  # one batch holds all of it

    curated = _curated(lake, tenant, tree.a)
    assert set(curated) == {(first.artifact_id, 1)}
    assert curated[(first.artifact_id, 1)]["state"] == "demoted"
    assert curated[(first.artifact_id, 1)]["retracted_at"] == dt.datetime(
        2026, 11, 2, tzinfo=dt.UTC
    )
    refused = [r for op, r in dead_letters(conn).values() if op == "claim.promote"]
    assert len(refused) == 1 and "refused by freeze" in refused[0]


def test_demote_and_erase_reach_curated_and_silver_under_the_same_batch(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    d, e, untouched = (promoted(conn, tenant, tree.a) for _ in range(3))
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    drain_all(conn, lake)
    acts.demote(conn, tenant, d)
    acts.erase(conn, tenant, e)
    passes = drain_all(conn, lake)
    batch = [b for p in passes for b in p.batches if b.committed][0]

    curated = _curated(lake, tenant, tree.a)
    silver = LakeView(lake, tenant.tenant_id)
    for c, state in ((d, "demoted"), (e, "erased"), (untouched, "promoted")):
        assert curated[(c.artifact_id, 1)]["state"] == silver.claim(c)["state"] == state
    assert curated[(e.artifact_id, 1)]["body_ciphertext"] is None
    assert curated[(untouched.artifact_id, 1)]["body_ciphertext"] is not None
    curated_table = lake.open(lake.table_uri(tenant.tenant_id, GOLD_CURATED, tree.a))
    silver_table = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    assert curated_table.transaction_version("oml-lakewriter") == batch.batch_end
    assert silver_table.transaction_version("oml-lakewriter") == batch.batch_end


def test_reassign_into_or_out_of_a_validated_area_is_refused(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    inside, outside = promoted(conn, tenant, tree.a), promoted(conn, tenant, tree.b)
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    acts.reassign(conn, tenant, inside, tree.b, held=False)
    acts.reassign(conn, tenant, outside, tree.a, held=False)
    drain_all(conn, lake)
    reasons = sorted(r for _, r in dead_letters(conn).values())
    assert len(reasons) == 2
    assert any("out of validated workarea" in r for r in reasons)
    assert any("into validated workarea" in r for r in reasons)
    view = LakeView(lake, tenant.tenant_id)
    assert (
        view.claim(inside)["workarea_id"] == tree.a and view.claim(outside)["workarea_id"] == tree.b
    )


def test_validation_with_tainted_rows_is_refused(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    promoted(conn, tenant, tree.a, sim_derived_ids=[new_id()])
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    acts.upsert_area(conn, tenant, tree.b, status="committed")
    acts.validate_area(conn, tenant, tree.b)
    drain_all(conn, lake)
    ((op, reason),) = dead_letters(conn).values()
    assert op == "area.validate" and "simulation-tainted" in reason and tree.a in reason
    areas = LakeView(lake, tenant.tenant_id).areas
    assert areas[tree.a]["status"] == "committed" and areas[tree.b]["status"] == "validated"
    assert curated_rows(lake, tenant.tenant_id, tree.a) == []
    assert lake.open(lake.table_uri(tenant.tenant_id, GOLD_CURATED, tree.b)) is not None


def test_a_second_validation_changes_nothing(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    promoted(conn, tenant, tree.a)
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    drain_all(conn, lake)
    before = curated_rows(lake, tenant.tenant_id, tree.a)
    acts.validate_area(conn, tenant, tree.a)
    drain_all(conn, lake)
    assert curated_rows(lake, tenant.tenant_id, tree.a) == before
    assert lake.open(lake.table_uri(tenant.tenant_id, GOLD_CURATED, tree.a)).version() == 0


def test_held_rows_count_for_taint_and_cannot_be_promoted_back_into_a_validated_area(
    conn, lake, tenant
):
    tree = make_tree(conn, tenant)
    tainted = promoted(conn, tenant, tree.b, path="u.b", sim_derived_ids=[new_id()])
    clean = promoted(conn, tenant, tree.b, path="u.b")
    acts.reassign(conn, tenant, tainted, tree.a, held=True)
    acts.reassign(conn, tenant, clean, tree.a1, held=True)
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)  # a held tainted row is in a: refused
    acts.upsert_area(conn, tenant, tree.a1, status="committed")
    acts.validate_area(conn, tenant, tree.a1)  # only a clean held row: validated, curated empty
    acts.repromote(conn, tenant, clean)  # back to promoted inside a validated area: refused
    drain_all(conn, lake)
    reasons = sorted(r for _, r in dead_letters(conn).values())
    assert len(reasons) == 2, reasons
    assert any("simulation-tainted" in r and tainted.artifact_id in r for r in reasons)
    assert any(f"claim.promote into validated workarea {tree.a1}" in r for r in reasons)
    view = LakeView(lake, tenant.tenant_id)
    assert view.claim(clean)["state"] == "held"
    assert view.areas[tree.a]["status"] == "committed"
    assert curated_rows(lake, tenant.tenant_id, tree.a1) == []
