"""Workloads the tests and the benchmarks drain: a workarea tree, claims written through the
producer, a mixed lifecycle, and a tenant's lake as rows to compare."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.simulate import acts


def new_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Tree:
    root: str
    a: str
    b: str
    a1: str


def make_tree(conn, keys) -> Tree:
    """root(u) → a(u.a) → a1(u.a.a1); root → b(u.b)."""
    tree = Tree(new_id(), new_id(), new_id(), new_id())
    acts.upsert_area(conn, keys, tree.root, path="u", status="development", parent_id=None)
    acts.upsert_area(conn, keys, tree.a, path="u.a", status="development", parent_id=tree.root)
    acts.upsert_area(conn, keys, tree.b, path="u.b", status="development", parent_id=tree.root)
    acts.upsert_area(conn, keys, tree.a1, path="u.a.a1", status="development", parent_id=tree.a)
    return tree


def claim(workarea_id: str, path: str = "u.a", version: int = 1, **kw) -> acts.Claim:
    return acts.Claim(new_id(), version, workarea_id, path, **kw)


def promoted(conn, keys, workarea_id: str, path: str = "u.a", **kw) -> acts.Claim:
    c = claim(workarea_id, path, **kw)
    acts.promote(conn, keys, c, f"body of {c.artifact_id}".encode())
    return c


def mixed_workload(conn, keys, claims: int = 12) -> Tree:
    """A little of everything: promotions, retracts, edges, a validation, area changes."""
    tree = make_tree(conn, keys)
    made = [promoted(conn, keys, tree.a if i % 2 else tree.b) for i in range(claims)]
    for i, c in enumerate(made):
        if i % 5 == 0:
            acts.demote(conn, keys, c)
        elif i % 5 == 1:
            acts.erase(conn, keys, c)
        elif i % 5 == 2 and c.workarea_id == tree.b:
            acts.reassign(conn, keys, c, tree.a1, held=True)
    acts.ratify(conn, keys, acts.Edge(new_id(), made[0].artifact_id, made[1].artifact_id))
    acts.upsert_area(conn, keys, tree.a, status="committed")
    acts.validate_area(conn, keys, tree.a)
    for c in made:
        if c.workarea_id == tree.a and c is not made[3]:
            acts.demote(conn, keys, c)
    acts.upsert_area(conn, keys, tree.b, crew_name="crew-b")
    acts.reparent_area(conn, keys, tree.a1, tree.b, "u.b.a1")
    return tree


def lake_snapshot(lake, tenant_id: str) -> dict[str, list[dict]]:
    """Every existing table of the tenant as rows in a stable order. No column depends on when
    a drain ran (curated_at is the validation's instant), so a rebuild must equal it exactly."""
    return {
        str(table_id): sorted(read_rows(lake.open(uri), spec), key=repr)
        for table_id, spec, uri in tenant_tables(lake, tenant_id)
    }
