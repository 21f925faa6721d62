"""The simulator without a database: a seed fixes every act the workload generates (a digest of
the op stream, taken before the generator was split into its parts, holds it to the same acts),
and the verifier's area fold catches each unlawful move."""

from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from oml_dagster.simulate import acts, verify
from oml_dagster.simulate.faults import FAULTS
from oml_dagster.simulate.producer import Act, TenantKeys
from oml_dagster.simulate.workload import TenantWorkload, WorkloadConfig, tenant_specs

_INSTANTS = {"at", "created_at", "promoted_at", "proposed_at", "ratified_at", "retracted_at"}


def _logical(value):
    """A value without its wall-clock instants: everything else derives from the seed."""
    if isinstance(value, dict):
        return {k: _logical(v) for k, v in sorted(value.items()) if k not in _INSTANTS}
    if isinstance(value, list | tuple):
        return [_logical(v) for v in value]
    return value


def _keys(spec) -> TenantKeys:
    """The keys `producer.create_tenant` derives from a spec's key seed, without Postgres."""
    seed = spec.key_seed
    private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    api_key_id = f"key-{spec.tenant_id[:8]}-{seed.hex()[:8]}"
    return TenantKeys(spec.tenant_id, api_key_id, private, spec.principal)


def _act(tenant_id: str, act: Act) -> list:
    event = act.event
    return _logical(
        [
            tenant_id,
            act.journal_seq,
            act.event_id,
            event.event_type,
            event.payload,
            [event.artifact_id, event.version, event.workarea_id, event.simulation_id],
            event.provenance,
            act.ops,
            [
                [b.artifact_id, b.version, b.ciphertext.hex(), b.dek.hex(), b.plaintext_digest]
                for b in act.store_bodies
            ],
            [[b.artifact_id, b.version, b.ciphertext.hex(), b.dek.hex()] for b in act.keep_deks],
            act.shred,
            [[f.signer.tenant_id, f.event_id, f.marks] for f in act.forgeries],
        ]
    )


def workload_acts(config: WorkloadConfig, chunk: int = 7):
    """Every tenant's acts in journal order, with each workload's fault tally at its end."""
    specs = tenant_specs(config)
    keys = [_keys(s) for s in specs]
    for i, spec in enumerate(specs):
        workload = TenantWorkload(spec, config, keys[i], keys[:i] + keys[i + 1 :])
        while batch := workload.take(chunk):
            for act in batch:
                yield spec.tenant_id, act
        assert workload.done
        yield spec.tenant_id, ("faults", sorted(workload.faults.items()), workload.started)


def _digest(config: WorkloadConfig, chunk: int = 7) -> tuple[int, str]:
    h, count = hashlib.sha256(), 0
    for tenant_id, item in workload_acts(config, chunk):
        logical = _act(tenant_id, item) if isinstance(item, Act) else list(item)
        h.update(json.dumps(logical, sort_keys=True).encode())
        count += 1
    return count, h.hexdigest()


# Digests of the op streams as the single-class generator wrote them (same seed, same acts).
# A deliberate change to what the workload writes changes these: recompute them then.
DIGESTS = [
    (
        WorkloadConfig(tenants=3, claims=300, seed=0),
        2758,
        "dd35192449b4b2faaf23e13db67f964b1af5da6a60dbaa4852793e2505f96983",
    ),
    (
        WorkloadConfig(tenants=2, claims=500, seed=7, bad_ratio=0.1),
        2983,
        "61b3875919a560652622b2e0094ce627b97172906918f0e6fa532cd4cb3b1426",
    ),
    (
        WorkloadConfig(tenants=1, claims=200, seed=3, bad_ratio=0.3),
        614,
        "3b5bf9eb94066377a00ab385c831a6d6f65465c932558de7e81939b551264abe",
    ),
]


@pytest.mark.parametrize(("config", "count", "digest"), DIGESTS)
def test_a_seed_fixes_the_op_stream(config, count, digest):
    assert _digest(config) == (count, digest)


def test_batching_does_not_change_the_op_stream():
    config = DIGESTS[1][0]
    assert _digest(config, chunk=1) == _digest(config, chunk=64)


def test_the_digested_streams_cover_every_op_and_fault():
    ops, faults = set(), set()
    for config, _, _ in DIGESTS:
        for _, item in workload_acts(config):
            if isinstance(item, Act):
                ops.update(name for name, _ in item.ops)
            else:
                faults.update(name for name, _ in item[1])
    assert ops == {
        "claim.promote",
        "claim.demote",
        "claim.erase",
        "claim.reassign",
        "claim.repair",
        "claim.archive",  # the unknown-op fault
        "simulation.end",
        "edge.ratify",
        "edge.demote",
        "area.upsert",
        "area.reparent",
        "area.validate",
    }
    assert faults == set(FAULTS)


# --- the verifier's area fold ------------------------------------------------------------------


def _rows(acts_in_order, first_seq: int = 1) -> list[tuple]:
    """Outbox rows (id, journal_seq, op, payload) as Postgres returns them."""
    rows = []
    for journal_seq, act in enumerate(acts_in_order, start=first_seq):
        for name, payload in act.ops:
            rows.append((len(rows) + 1, journal_seq, name, json.loads(json.dumps(payload))))
    return rows


def _area_fold(tenant_id: str, rows) -> verify.TenantVerification:
    report = verify.TenantVerification(tenant_id)
    verify._check_areas(report, verify._parsed(report, rows))
    return report


@pytest.mark.parametrize(("config", "validated"), [(DIGESTS[0][0], 3), (DIGESTS[1][0], 4)])
def test_the_workload_passes_the_area_fold(config, validated):
    streams: dict[str, list] = {}
    for tenant_id, item in workload_acts(config):
        if isinstance(item, Act):
            streams.setdefault(tenant_id, []).append(item)
    reports = [_area_fold(t, _rows(s)) for t, s in streams.items()]
    assert [r.errors for r in reports] == [[]] * len(reports)
    assert sum(r.validated_areas for r in reports) == validated
    assert all(r.refused_rows == 0 for r in reports) == (config.bad_ratio == 0)


TENANT = "00000000-0000-4000-8000-000000000000"


def _id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


ROOT, A, B = _id(1), _id(2), _id(3)
SIM = _id(9)


def _tree() -> list[Act]:
    return [
        acts.upsert_area_act(ROOT, parent_id=None, path="u", status="committed"),
        acts.upsert_area_act(A, parent_id=ROOT, path="u.a", status="committed"),
        acts.upsert_area_act(B, parent_id=ROOT, path="u.b", status="committed"),
    ]


def _claim(n: int, area: str = A, **kw) -> acts.Claim:
    return acts.Claim(
        _id(100 + n), 1, area, "u.a", plaintext_digest="a" * 64, ciphertext_digest="b" * 64, **kw
    )


def test_area_fold_flags_a_promotion_into_a_validated_area():
    c = _claim(1)
    report = _area_fold(TENANT, _rows([*_tree(), acts.validate_area_act(A), acts.promote_act(c)]))
    assert report.validated_areas == 1
    (error,) = report.errors
    assert "promotes" in error and f"into validated workarea {A}" in error


def test_area_fold_flags_a_move_across_a_validated_area():
    c = _claim(1)
    moves = [acts.promote_act(c), acts.validate_area_act(A), acts.reassign_act(c, B, False)]
    (error,) = _area_fold(TENANT, _rows([*_tree(), *moves])).errors
    assert f"from {A} to {B} across a validated workarea" in error


def test_area_fold_flags_validating_an_area_with_tainted_rows():
    tainted = _claim(1, simulation_id=SIM, provenance="simulation")
    report = _area_fold(
        TENANT, _rows([*_tree(), acts.promote_act(tainted), acts.validate_area_act(A)])
    )
    errors = report.errors
    assert len(errors) == 2
    assert f"validates {A} holding 1 simulation-tainted" in errors[0]
    assert f"holds tainted promoted row ('{tainted.artifact_id}', 1)" in errors[1]


def test_area_fold_clean_when_tainted_rows_are_demoted_or_closed_first():
    tainted = _claim(1, simulation_id=SIM, provenance="simulation")
    derived = _claim(2, sim_derived_ids=[SIM])
    held = _claim(3, simulation_id=SIM, provenance="simulation")
    steps = [
        acts.promote_act(tainted),
        acts.promote_act(derived),
        acts.promote_act(held),
        acts.reassign_act(held, A, True),
        acts.simulation_end_act(SIM, True),
        acts.validate_area_act(A),
        acts.validate_area_act(A),  # validating twice counts once
    ]
    report = _area_fold(TENANT, _rows([*_tree(), *steps]))
    assert report.errors == [] and report.validated_areas == 1


def test_area_fold_without_closure_leaves_derived_rows_live():
    derived = _claim(2, sim_derived_ids=[SIM])
    steps = [acts.promote_act(derived), acts.simulation_end_act(SIM, False)]
    report = _area_fold(TENANT, _rows([*_tree(), *steps, acts.validate_area_act(A)]))
    assert len(report.errors) == 2 and "validates" in report.errors[0]


def test_area_fold_skips_ops_not_newer_than_a_repair():
    tainted = _claim(1, simulation_id=SIM, provenance="simulation")
    promote = acts.promote_act(tainted)
    # A repair at journal_seq 5 saying the row is demoted, with fold_seq 7: the erase at 6 and
    # the closure at 7 are not newer than it, so they change nothing; the row stays demoted.
    repair = acts.repair_act(tainted, 7, "demoted")
    later = [acts.erase_act(tainted), acts.simulation_end_act(SIM, True)]
    report = _area_fold(
        TENANT, _rows([*_tree(), promote, repair, *later, acts.validate_area_act(A)])
    )
    assert report.errors == [] and report.validated_areas == 1
    # A repair that says promoted leaves the tainted row live: validating then is flagged.
    repair = acts.repair_act(tainted, 7, "promoted")
    report = _area_fold(
        TENANT, _rows([*_tree(), promote, repair, *later, acts.validate_area_act(A)])
    )
    assert any("validates" in e for e in report.errors)
    # An older repair (lower fold_seq) than the one held is ignored.
    older = acts.repair_act(tainted, 6, "promoted")
    steps = [promote, acts.repair_act(tainted, 7, "demoted"), older, acts.validate_area_act(A)]
    assert _area_fold(TENANT, _rows([*_tree(), *steps])).errors == []


def test_area_fold_erase_is_terminal_and_upsert_cannot_unvalidate():
    c = _claim(1, simulation_id=SIM, provenance="simulation")
    steps = [
        acts.promote_act(c),
        acts.erase_act(c),
        acts.repair_act(c, 9, "promoted"),  # an erased row is not repaired back
        acts.validate_area_act(A),
        acts.upsert_area_act(A, status="committed"),
        acts.promote_act(_claim(2)),
    ]
    report = _area_fold(TENANT, _rows([*_tree(), *steps]))
    (error,) = report.errors
    assert "promotes" in error and "into validated workarea" in error


def test_area_fold_counts_refused_rows_and_leaves_them_out():
    bad = acts.demote_act(_claim(1))
    bad.ops = [("claim.demote", {"artifact_id": "x", "version": 1})]
    unknown = acts.demote_act(_claim(1))
    unknown.ops = [("claim.archive", {})]
    report = _area_fold(TENANT, _rows([*_tree(), bad, unknown]))
    assert report.refused_rows == 2 and report.errors == []
