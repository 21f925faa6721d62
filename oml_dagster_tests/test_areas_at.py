"""`oml-lake areas-at`: the workarea tree replayed from bronze's area events equals gold.areas at
the present, and at a past instant equals gold.areas as the writer left it then; refused area
acts stay out of the replay; a gold.areas that disagrees with bronze is reported."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from oml_dagster import cli
from oml_dagster.lake.analytics import areas, sandbox
from oml_dagster.lake.model.tables import GOLD_AREAS
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import acts, producer
from oml_dagster.simulate.runner import run
from oml_dagster.simulate.workload import WorkloadConfig

from .conftest import table_rows
from .helpers import drain_all, make_tree, new_id


def gold_now(lake, tenant_id: str) -> dict[str, dict]:
    """gold.areas through delta-rs (the writer's own reader), in the replay's columns."""
    return {
        r["workarea_id"]: {c: r[c] for c in areas.AREA_COLUMNS}
        for r in table_rows(lake, tenant_id, GOLD_AREAS)
    }


def replay(lake, tenant_id: str, as_of: dt.datetime | None = None, refused=frozenset()):
    with sandbox.tenant_connection(lake, tenant_id) as tc:
        return areas.replay_areas(
            tenant_id, areas.area_events(tc), as_of=as_of, refused_journal_seqs=refused
        )


def areas_at(capsys, tenant_id: str, *date: str) -> tuple[int, dict]:
    code = cli.main(
        ["areas-at", "--tenant", tenant_id, "--json", *(("--date", *date) if date else ())]
    )
    return code, json.loads(capsys.readouterr().out)


def test_past_instants_equal_gold_areas_as_it_was_then(capsys, conn, lake, tenant):
    tree = make_tree(conn, tenant)
    acts.upsert_area(conn, tenant, tree.b, crew_name="crew-b", crew_external_manager="m-1")
    drain_all(conn, lake)
    first = gold_now(lake, tenant.tenant_id)
    time.sleep(0.01)
    t1 = dt.datetime.now(dt.UTC)
    time.sleep(0.01)

    # The tree changes: a re-parent (the subtree's paths move), a status change, a validation,
    # a new node, a crew update.
    acts.reparent_area(conn, tenant, tree.a, tree.b, "u.b.a")
    acts.upsert_area(conn, tenant, tree.b, status="committed")
    acts.upsert_area(conn, tenant, tree.a1, status="committed")
    acts.validate_area(conn, tenant, tree.a1)
    leaf = new_id()
    acts.upsert_area(conn, tenant, leaf, parent_id=tree.a1, path="u.b.a.a1.l", status="development")
    drain_all(conn, lake)
    second = gold_now(lake, tenant.tenant_id)
    time.sleep(0.01)
    t2 = dt.datetime.now(dt.UTC)
    time.sleep(0.01)
    acts.upsert_area(conn, tenant, leaf, crew_name="late")
    drain_all(conn, lake)
    present = gold_now(lake, tenant.tenant_id)

    assert first != second != present
    assert second[tree.a1]["path"] == "u.b.a.a1" and second[tree.a1]["status"] == "validated"
    assert replay(lake, tenant.tenant_id, t1).areas == first
    assert replay(lake, tenant.tenant_id, t2).areas == second
    assert replay(lake, tenant.tenant_id).areas == present
    before = replay(lake, tenant.tenant_id, t1 - dt.timedelta(days=1))
    assert before.areas == {} and before.events_applied == 0

    # The command line: a past instant is not checked against gold.areas; the present is.
    code, out = areas_at(capsys, tenant.tenant_id, t1.isoformat())
    assert code == 0 and not out["checked_against_gold_areas"]
    assert {a["workarea_id"]: a["path"] for a in out["areas"]} == {
        k: v["path"] for k, v in first.items()
    }
    code, out = areas_at(capsys, tenant.tenant_id)
    assert code == 0 and out["checked_against_gold_areas"] and out["differences"] == []
    assert len(out["areas"]) == 5
    # A date is the end of that UTC day.
    code, out = areas_at(capsys, tenant.tenant_id, t1.date().isoformat())
    assert code == 0 and len(out["areas"]) == 5
    code, out = areas_at(capsys, tenant.tenant_id, (t1.date() - dt.timedelta(days=1)).isoformat())
    assert code == 0 and out["areas"] == []


def test_refused_area_acts_stay_out_of_the_replay(capsys, conn, lake, tenant):
    tree = make_tree(conn, tenant)
    acts.reparent_area(conn, tenant, tree.a, new_id(), "u.z.a")  # unknown parent: refused
    acts.reparent_area(conn, tenant, tree.a, tree.a1, "u.a.a1.a")  # a cycle: refused
    acts.upsert_area(conn, tenant, new_id(), crew_name="no path")  # new node without path
    drain_all(conn, lake)
    refused = conn.execute(
        "SELECT count(*) FROM oml.lake_dead_letter WHERE op LIKE 'area.%%'"
    ).fetchone()[0]
    assert refused == 3

    by_rules = replay(lake, tenant.tenant_id)
    assert len(by_rules.skipped) == 3
    assert by_rules.areas == gold_now(lake, tenant.tenant_id)
    dead = areas.refused_area_acts(conn, tenant.tenant_id)
    assert len(dead) == 3
    assert replay(lake, tenant.tenant_id, refused=dead).areas == gold_now(lake, tenant.tenant_id)
    code, out = areas_at(capsys, tenant.tenant_id)
    assert code == 0 and out["differences"] == [] and len(out["skipped"]) == 3


def test_a_gold_areas_that_disagrees_with_bronze_is_reported(capsys, conn, lake, tenant):
    tree = make_tree(conn, tenant)
    drain_all(conn, lake)
    DeltaTable(lake.table_uri(tenant.tenant_id, GOLD_AREAS)).update(
        updates={"status": "'validated'"}, predicate=f"workarea_id = '{tree.b}'"
    )
    code, out = areas_at(capsys, tenant.tenant_id)
    assert code == 1
    assert any(d.startswith(f"{tree.b} status") for d in out["differences"])
    code = cli.main(["areas-at", "--tenant", tenant.tenant_id])
    text = capsys.readouterr().out
    assert code == 1 and "differs from gold.areas" in text and tree.b in text


def test_a_simulated_workload_replays_to_gold_areas(conn, lake):
    run(os.environ["OML_PG_DSN"], WorkloadConfig(tenants=2, claims=60, seed=9, bad_ratio=0.05))
    drain_all(conn, lake)
    tenants = [str(t) for (t,) in conn.execute("SELECT DISTINCT tenant_id FROM oml.outbox")]
    for tenant_id in tenants:
        found = replay(lake, tenant_id)
        assert found.events_applied >= 4
        assert areas.area_differences(found.areas, gold_now(lake, tenant_id)) == []


def test_bad_dates_are_refused_by_name(capsys, tenant):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["areas-at", "--tenant", tenant.tenant_id, "--date", "yesterday"])
    assert exit_.value.code == 2
    assert "'yesterday'" in capsys.readouterr().err
    assert areas.parse_instant("2026-03-01") == dt.datetime(
        2026, 3, 1, 23, 59, 59, 999999, tzinfo=dt.UTC
    )
    assert areas.parse_instant("2026-03-01T10:00:00") == dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC)


def test_an_act_the_catalog_refuses_is_skipped_with_the_catalog_s_reason(
    capsys, conn, lake, tenant
):
    """The replay is the catalog's: a field it does not declare and a status it does not know
    are refused there (dead-lettered by the writer), so `areas-at` skips them too, with the
    reason the writer recorded."""
    tree = make_tree(conn, tenant)
    acts.upsert_area(conn, tenant, tree.b, crew_name="crew-b", colour="red")
    acts.upsert_area(conn, tenant, tree.a, status="archived")
    drain_all(conn, lake)
    recorded = [
        r
        for (r,) in conn.execute(
            "SELECT reason FROM oml.lake_dead_letter WHERE op LIKE 'area.%%' ORDER BY seq"
        )
    ]
    assert len(recorded) == 2

    by_rules = replay(lake, tenant.tenant_id)
    assert [reason for _, reason in by_rules.skipped] == recorded
    assert by_rules.areas == gold_now(lake, tenant.tenant_id)
    assert by_rules.areas[tree.b]["crew_name"] is None
    code, out = areas_at(capsys, tenant.tenant_id)
    assert code == 0 and out["differences"] == [] and len(out["skipped"]) == 2


# Area acts, lawful or not, after a lawful root: each names nodes by index into a small pool, so
# refusals (unknown nodes and parents, cycles, second roots, paths off the parent, moves down the
# ladder, validations of uncommitted areas, moving the root, fields or statuses the catalog does
# not know) come up as often as lawful acts.
POOL = 5
_node = st.integers(0, POOL - 1)
_status = st.sampled_from(["development", "committed"])
_acts = st.lists(
    st.one_of(
        st.tuples(st.just("new"), _node, st.none() | _node, _status, st.booleans()),
        st.tuples(st.just("status"), _node, _status),
        st.tuples(st.just("crew"), _node, st.sampled_from(["crew-1", "crew-2", None])),
        st.tuples(st.just("reparent"), _node, _node, st.booleans()),
        st.tuples(st.just("validate"), _node),
        st.tuples(st.just("junk"), _node, st.sampled_from(["unknown field", "unknown status"])),
    ),
    min_size=1,
    max_size=14,
)


# Each rule refused at least once, whatever the random draw: a validation of an area in
# development, a re-parent with a path off its new parent, a move down the ladder, a second root,
# moving the root, a cycle, an upsert that moves a node, fields the catalog refuses; and a lawful
# mix.
RULE_EXAMPLES = [
    [("new", 1, 0, "development", True), ("validate", 1)],
    [("new", 1, 0, "committed", True), ("new", 2, 0, "committed", True), ("reparent", 1, 2, False)],
    [("new", 1, 0, "committed", True), ("status", 1, "development")],
    [("new", 1, None, "committed", True)],
    [("new", 1, 0, "development", True), ("reparent", 0, 1, True)],
    [
        ("new", 1, 0, "committed", True),
        ("new", 2, 1, "development", True),
        ("reparent", 1, 2, True),
    ],
    [("new", 1, 0, "committed", True), ("new", 1, 0, "committed", False)],
    [("new", 1, 0, "committed", True), ("junk", 1, "unknown field"), ("junk", 0, "unknown status")],
    [
        ("new", 1, 0, "committed", True),
        ("new", 2, 1, "development", True),
        ("new", 3, 0, "development", True),
        ("reparent", 1, 3, True),
        ("validate", 1),
        ("crew", 2, "crew-1"),
        ("status", 3, "committed"),
    ],
]


def _with_examples(test):
    for script in RULE_EXAMPLES:
        test = example(script=script)(test)
    return test


def script_acts(script: list[tuple], start: dt.datetime) -> list[acts.Act]:
    """The script's acts after a lawful root, one second apart from `start`."""
    ids = [new_id() for _ in range(POOL)]
    # What the script believes the paths are (node 0 is the root); wrong after some refusals,
    # which is the point.
    paths: dict[int, str] = {0: "n0"}
    found = [acts.upsert_area_act(ids[0], start, parent_id=None, path="n0", status="committed")]

    def path_under(parent: int | None, node: int, extends: bool) -> str:
        if parent is None:
            return f"n{node}"
        return f"{paths.get(parent, 'zz')}.n{node}" if extends else f"off.n{node}"

    for i, act in enumerate(script, start=1):
        at = start + dt.timedelta(seconds=i)
        kind, node = act[0], ids[act[1]]
        if kind == "new":
            _, index, parent, status, extends = act
            path = path_under(parent, index, extends)
            parent_id = None if parent is None else ids[parent]
            found.append(
                acts.upsert_area_act(node, at, parent_id=parent_id, path=path, status=status)
            )
            paths.setdefault(index, path)
        elif kind == "status":
            found.append(acts.upsert_area_act(node, at, status=act[2]))
        elif kind == "crew":
            found.append(acts.upsert_area_act(node, at, crew_name=act[2]))
        elif kind == "reparent":
            _, index, parent, extends = act
            path = path_under(parent, index, extends)
            found.append(acts.reparent_area_act(node, ids[parent], path, at))
            if extends:
                paths[index] = path
        elif kind == "junk":
            junk = {"colour": "red"} if act[2] == "unknown field" else {"status": "archived"}
            found.append(acts.upsert_area_act(node, at, **junk))
        else:
            found.append(acts.validate_area_act(node, at))
    return found


def _as_json(rows: dict[str, dict]) -> dict[str, dict]:
    return json.loads(json.dumps(rows, default=lambda v: v.isoformat()))


@pytest.mark.slow
@_with_examples
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=_acts)
def test_areas_at_the_last_act_equals_gold_areas_after_a_drain(capsys, conn, lake, script):
    """For any sequence of area acts: drained, `oml-lake areas-at` at the instant of the last
    act prints gold.areas exactly and finds no difference; the replay by the catalog's rules
    alone (no dead letters at hand) gives the same tree."""
    keys = producer.create_tenant(conn)
    start = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    producer.commit_acts(conn, keys, script_acts(script, start))
    drain(conn, lake, [keys.tenant_id], policy=DrainPolicy(until_idle=True))
    gold = gold_now(lake, keys.tenant_id)

    last = start + dt.timedelta(seconds=len(script))
    code, out = areas_at(capsys, keys.tenant_id, last.isoformat())
    assert (code, out["checked_against_gold_areas"], out["differences"]) == (0, True, [])
    assert {a["workarea_id"]: a for a in out["areas"]} == _as_json(gold)
    assert replay(lake, keys.tenant_id).areas == gold
