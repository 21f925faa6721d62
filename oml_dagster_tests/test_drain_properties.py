"""The drain's rules for every input, not just the cases thought of: random sequences of valid and
malformed acts (every op kind, cycles, replays, repairs inside validated areas, bad fields),
drained with random batch cuts and crashes between table commits, then checked:

- the drain terminates (a fold watchdog bounds every batch) and ends idle;
- every op is decided: applied, or dead-lettered with a reason; certainly-bad ops are refused;
- silver and every curated table agree, and no curated row is simulation-tainted;
- an erased row never changes again;
- gold.areas is a tree: one root, no cycle, every path its parent's path plus a label;
- bronze holds one row per journal_seq, exactly the events that were not refused;
- re-draining the outbox into an empty lake, cut differently, gives identical tables.

`OML_PROPERTY_EXAMPLES` sets the number of examples (CI runs the default).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import GOLD_CURATED
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.helpers import BeforeEachCommit, lake_snapshot

EXAMPLES = int(os.environ.get("OML_PROPERTY_EXAMPLES", "12"))

KINDS = (
    "area",
    "area",
    "area_bad_path",
    "area_self_parent",
    "area_unknown_parent",
    "area_second_root",
    "area_move_by_upsert",
    "reparent",
    "reparent",
    "status",
    "validate",
    "validate",
    "promote",
    "promote",
    "promote",
    "promote_tainted",
    "promote_self_signed",
    "promote_unknown_area",
    "repromote",
    "repromote_other_digest",
    "demote",
    "erase",
    "erase",
    "reassign",
    "reassign_held",
    "repair",
    "repair",
    "repair_stale",
    "sim_end",
    "edge",
    "edge_wrong_label",
    "edge_area",
    "edge_demote",
    "replay_event",
    "forged_event",
    "malformed",
    "unknown_op",
)
STATES = ("promoted", "demoted", "erased", "held")
# Kinds that act on a claim already written; with none yet they write a crew update instead.
CLAIM_KINDS = {
    "repromote",
    "repromote_other_digest",
    "demote",
    "erase",
    "reassign",
    "reassign_held",
    "repair",
    "repair_stale",
    "edge",
    "edge_wrong_label",
    "malformed",
}

step = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 50),
    st.integers(0, 50),
    st.booleans(),
)
cut = st.tuples(st.integers(2, 12), st.one_of(st.none(), st.integers(1, 8)))


class _Crash(Exception):
    """A writer dying between two table commits."""


@dataclass
class Model:
    """What the producer wrote, to pick targets from (the lake decides what is lawful)."""

    root: str
    areas: list[tuple[str, str]] = field(default_factory=list)  # (workarea_id, path)
    claims: list[acts.Claim] = field(default_factory=list)
    sims: list[str] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)
    labels: int = 0


def _id() -> str:
    return str(uuid.uuid4())


def _pick(items, i):
    return items[i % len(items)] if items else None


def _label(model: Model) -> str:
    model.labels += 1
    return f"n{model.labels}"


def _commit(conn, keys, act: acts.Act, **edits) -> None:
    (name, payload), *rest = act.ops
    act.ops = [(name, {**payload, **edits}), *rest]
    producer.commit_acts(conn, keys, [act])


def _raw_event(conn, tenant_id: str, journal_seq: int, payload: dict) -> None:
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
        " VALUES (%s, %s, 'journal.event', %s::jsonb)",
        (tenant_id, journal_seq, json.dumps(payload)),
    )


def write(conn, keys, model: Model, kind: str, a: int, b: int, flag: bool) -> None:
    """Write one act of `kind`, its targets picked by `a` and `b`."""
    area = _pick(model.areas, a)
    other = _pick(model.areas, b)
    claim = _pick(model.claims, a)
    if kind == "area":
        label = _label(model)
        node = (_id(), f"{area[1]}.{label}")
        acts.upsert_area(conn, keys, node[0], path=node[1], status="development", parent_id=area[0])
        model.areas.append(node)
    elif kind == "area_bad_path":
        acts.upsert_area(
            conn, keys, _id(), path=f"{other[1]}.x.{_label(model)}", parent_id=area[0],
            status="development",
        )  # fmt: skip
    elif kind == "area_self_parent":
        node = _id()
        acts.upsert_area(
            conn, keys, node, path=f"{area[1]}.s", status="development", parent_id=node
        )
    elif kind == "area_unknown_parent":
        acts.upsert_area(conn, keys, _id(), path="u.q", status="development", parent_id=_id())
    elif kind == "area_second_root":
        acts.upsert_area(
            conn, keys, _id(), path=_label(model), status="development", parent_id=None
        )
    elif kind == "area_move_by_upsert":
        acts.upsert_area(conn, keys, area[0], parent_id=other[0])
    elif kind == "reparent":
        acts.reparent_area(conn, keys, area[0], other[0], f"{other[1]}.{area[1].rsplit('.')[-1]}")
    elif kind == "status":
        acts.upsert_area(conn, keys, area[0], status="committed" if flag else "development")
    elif kind == "validate":
        if flag:
            acts.upsert_area(conn, keys, area[0], status="committed")
        acts.validate_area(conn, keys, area[0])
    elif kind.startswith("promote"):
        where = _id() if kind == "promote_unknown_area" else area[0]
        sim = None
        if kind == "promote_tainted":
            if flag or not model.sims:
                model.sims.append(_id())
            sim = model.sims[-1]
        c = acts.Claim(
            _id(),
            1 + b % 3,
            where,
            area[1],
            provenance="simulation" if sim and flag else "agent",
            simulation_id=sim if flag else None,
            sim_derived_ids=[sim] if sim and not flag else None,
            body_ref="object" if b % 5 == 0 else "lake",
        )
        body = producer.seal(c.artifact_id, c.version, f"body {a} {b}".encode())
        self_signed = kind == "promote_self_signed"
        acts.promote(conn, keys, c, body=body, self_signed=self_signed)
        if not self_signed:
            model.claims.append(c)
    elif claim is None and kind in CLAIM_KINDS:
        acts.upsert_area(conn, keys, area[0], crew_name=f"crew-{a}")
    elif kind == "repromote":
        acts.repromote(conn, keys, claim)
    elif kind == "repromote_other_digest":
        _commit(conn, keys, acts.repromote_act(claim), plaintext_digest="f" * 64)
    elif kind == "demote":
        acts.demote(conn, keys, claim)
    elif kind == "erase":
        acts.erase(conn, keys, claim)
    elif kind in ("reassign", "reassign_held"):
        acts.reassign(conn, keys, claim, other[0], held=kind == "reassign_held")
    elif kind in ("repair", "repair_stale"):
        head = conn.execute(
            "SELECT journal_seq FROM oml_sim.chain_head WHERE tenant_id = %s", (keys.tenant_id,)
        ).fetchone()[0]
        fold_seq = 1 if kind == "repair_stale" else head + 1
        moved = acts.Claim(
            **{**claim.__dict__, "workarea_id": other[0] if flag else claim.workarea_id}
        )
        acts.repair(conn, keys, moved, fold_seq=fold_seq, state=STATES[b % 4])
    elif kind == "sim_end":
        sim = _pick(model.sims, b)
        if sim is not None:
            acts.simulation_end(conn, keys, sim, demote_tainted=flag)
    elif kind in ("edge", "edge_wrong_label"):
        dst = _pick(model.claims, b)
        label = "mirrors" if kind == "edge_wrong_label" else "derives_from"
        edge = acts.Edge(
            _id(), claim.artifact_id, dst.artifact_id, edge_label=label,
            src_version=claim.version, dst_version=dst.version,
        )  # fmt: skip
        acts.ratify(conn, keys, edge)
        model.edges.append(edge.edge_id)
    elif kind == "edge_area":
        edge = acts.Edge(_id(), area[0], other[0], graph="workarea", edge_label="continues")
        edge.src_version = edge.dst_version = None
        acts.ratify(conn, keys, edge)
        model.edges.append(edge.edge_id)
    elif kind == "edge_demote":
        edge_id = _pick(model.edges, b)
        if edge_id is not None:
            acts.demote_edge(conn, keys, edge_id)
    elif kind in ("replay_event", "forged_event"):
        rows = conn.execute(
            "SELECT journal_seq, payload FROM oml.outbox WHERE tenant_id = %s"
            " AND op = 'journal.event' ORDER BY id",
            (keys.tenant_id,),
        ).fetchall()
        journal_seq, payload = rows[a % len(rows)]
        if kind == "forged_event":
            payload = dict(payload, event_id=_id())
        _raw_event(conn, keys.tenant_id, journal_seq, payload)
    elif kind == "malformed":
        bad = {"at": "20261101T120000Z"} if flag else {"version": "1", "note": "x"}
        _commit(conn, keys, acts.demote_act(claim), **bad)
    elif kind == "unknown_op":
        unknown = acts.Act(acts.Event("claim.archived", {}), [("claim.archive", {"at": "x"})])
        producer.commit_acts(conn, keys, [unknown])


def drain_rounds(conn, lake: Lake, tenant_id: str, cuts) -> list[dict]:
    """Drain with each (max_batch, crash_at) in turn, crashing at the crash_at-th table commit
    of that round; returns the erased rows seen after each round, by table and key."""
    seen: list[dict] = []
    for max_batch, crash_at in cuts:
        config = WriterConfig(
            max_batch=max_batch, txn_lag_limit=max(1, max_batch // 2), fold_timeout_seconds=60
        )
        commits = 0

        def hook(_table: str, crash_at=crash_at) -> None:
            nonlocal commits
            commits += 1
            if commits == crash_at:
                raise _Crash

        sequencer.sequence(conn)
        for _ in range(500):
            try:
                result = drain_tenant(
                    conn, lake, tenant_id, config=config, commits=BeforeEachCommit(hook)
                )
            except _Crash:
                break
            if not result.committed and not result.refused:
                break
        else:
            pytest.fail(f"tenant {tenant_id} never went idle at max_batch {max_batch}")
        seen.append(erased_rows(lake, tenant_id))
    return seen


def erased_rows(lake: Lake, tenant_id: str) -> dict:
    found = {}
    for table_id, spec, uri in tenant_tables(lake, tenant_id):
        if spec.merge_key == ("artifact_id", "version"):
            for row in read_rows(lake.open(uri), spec):
                if row["state"] == "erased":
                    found[(str(table_id), row["artifact_id"], row["version"])] = row
    return found


def check_lake(conn, lake: Lake, tenant_id: str, rounds: list[dict]) -> None:
    snapshot = lake_snapshot(lake, tenant_id)
    max_seq = conn.execute(
        "SELECT max(seq) FROM oml.outbox WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()[0]
    decided = conn.execute(
        "SELECT decided_through FROM oml.lake_verdicts WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()[0]
    assert decided == max_seq, "every sequenced op has a verdict"
    letters = conn.execute(
        "SELECT seq, op, journal_seq, reason, payload FROM oml.lake_dead_letter"
        " WHERE tenant_id = %s",
        (tenant_id,),
    ).fetchall()
    assert all(reason for *_, reason, _ in letters), "every refusal has a reason"
    refused_ops = {(op, journal_seq) for _, op, journal_seq, _, _ in letters}
    certainly_bad = conn.execute(
        "SELECT op, journal_seq FROM oml.outbox WHERE tenant_id = %s AND (op = 'claim.archive'"
        " OR (payload ->> 'self_signed')::boolean OR payload ? 'note'"
        " OR payload ->> 'at' = '20261101T120000Z')",
        (tenant_id,),
    ).fetchall()
    assert set(certainly_bad) <= refused_ops, "certainly-bad ops are dead-lettered"

    # Silver and every curated table agree.
    silver = {(r["artifact_id"], r["version"]): r for r in snapshot.get("silver.claims", [])}
    for name, rows in snapshot.items():
        if not name.startswith(GOLD_CURATED.name):
            continue
        workarea_id = name.split("/", 1)[1]
        for row in rows:
            twin = silver[(row["artifact_id"], row["version"])]
            assert row["workarea_id"] == twin["workarea_id"] == workarea_id
            for column, value in twin.items():
                if column != "applied_seq":
                    assert row[column] == value, (name, column, row["artifact_id"])
            assert not row["simulation_id"] and not row["sim_derived_ids"]

    # An erased row never changes again (its body and attachments gone).
    for earlier in rounds:
        for (name, artifact_id, version), row in earlier.items():
            later = next(
                r
                for r in snapshot[name]
                if (r["artifact_id"], r["version"]) == (artifact_id, version)
            )
            assert later == row, (name, artifact_id, version)
            assert row["body_ciphertext"] is None and row["attachments"] is None

    # gold.areas is a tree.
    areas = {r["workarea_id"]: r for r in snapshot.get("gold.areas", [])}
    roots = [a for a in areas.values() if a["parent_id"] is None]
    assert len(roots) == 1
    for area in areas.values():
        seen, node = set(), area
        while node["parent_id"] is not None:
            assert node["workarea_id"] not in seen, "a cycle in gold.areas"
            seen.add(node["workarea_id"])
            parent = areas[node["parent_id"]]
            assert node["path"].rpartition(".")[0] == parent["path"]
            node = parent

    # Bronze: one row per journal_seq, exactly the events not refused.
    bronze = [r["journal_seq"] for r in snapshot["bronze.events"]]
    assert len(bronze) == len(set(bronze)), "one bronze row per journal_seq"
    events = conn.execute(
        "SELECT DISTINCT journal_seq FROM oml.outbox o WHERE tenant_id = %s"
        " AND op = 'journal.event' AND NOT EXISTS (SELECT 1 FROM oml.lake_dead_letter d"
        " WHERE d.seq = o.seq)",
        (tenant_id,),
    ).fetchall()
    assert set(bronze) == {js for (js,) in events}


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(step, min_size=5, max_size=45),
    cuts=st.lists(cut, min_size=1, max_size=4),
    rebuild_batch=st.integers(2, 40),
)
def test_every_input_drains_to_a_consistent_lake_that_a_rebuild_reproduces(
    conn, writer_conn, steps, cuts, rebuild_batch
):
    # The writer drains over a deployment's writer role (row-level security on, ADR 0049); the
    # producer and the checks use the tables' owner.
    keys = producer.create_tenant(conn)
    root = _id()
    acts.upsert_area(conn, keys, root, path="u", status="committed", parent_id=None)
    model = Model(root, areas=[(root, "u")])
    for kind, a, b, flag in steps:
        write(conn, keys, model, kind, a, b, flag)
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(os.path.join(tmp, "lake"))
        rounds = drain_rounds(writer_conn, lake, keys.tenant_id, [*cuts, (12, None)])
        check_lake(conn, lake, keys.tenant_id, rounds)
        again = drain_tenant(
            writer_conn, lake, keys.tenant_id, config=WriterConfig(max_batch=12, txn_lag_limit=6)
        )
        assert not again.committed and not again.refused, "the lake ends idle"

        rebuilt = Lake(os.path.join(tmp, "rebuilt"))
        drain_rounds(writer_conn, rebuilt, keys.tenant_id, [(rebuild_batch, None)])
        assert lake_snapshot(rebuilt, keys.tenant_id) == lake_snapshot(lake, keys.tenant_id)
