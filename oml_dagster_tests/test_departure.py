"""A tenant's departure (DESIGN "A tenant's departure"; ADR 0075, 0076): the export of its live
tables with a manifest that `verify-export` checks, and the purge of its prefix and of the
writer's records of it, with a receipt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oml_dagster.lake.audit import export
from oml_dagster.lake.errors import ExportTargetRefused
from oml_dagster.lake.model.tables import BRONZE_EVENTS, SILVER_CLAIMS
from oml_dagster.lake.store.layout import Lake
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.helpers import claim, drain_all, holds, make_tree


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` that holds `needle` (raw, or in a decoded Parquet value)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and holds(p.read_bytes(), needle)
    )


def populated(conn, lake, tenant_id: str | None = None):
    """A tenant with claims in two areas (one validated: a curated table), an erased claim and
    a demoted one, drained. Returns (keys, erased ciphertext, kept ciphertexts)."""
    keys = producer.create_tenant(conn, tenant_id)
    tree = make_tree(conn, keys)
    made, bodies = [], {}
    for i in range(5):
        workarea, path = (tree.a, "u.a") if i % 2 == 0 else (tree.b, "u.b")
        c = claim(workarea, path)
        bodies[c.artifact_id] = acts.promote(
            conn, keys, c, f"secret {i} {c.artifact_id}".encode()
        ).ciphertext
        made.append(c)
        drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.b, status="committed")
    acts.validate_area(conn, keys, tree.b)
    drain_all(conn, lake)
    acts.erase(conn, keys, made[1])
    acts.demote(conn, keys, made[2])
    drain_all(conn, lake)
    erased = bodies.pop(made[1].artifact_id)
    return keys, erased, [v for k, v in bodies.items() if k != made[2].artifact_id]


def test_an_export_holds_the_live_rows_only_and_verifies(conn, lake, tmp_path):
    keys, erased, kept = populated(conn, lake)
    tenant_id = keys.tenant_id
    # The lake still holds the erased ciphertext in superseded files (no VACUUM yet).
    assert any(
        holds(p.read_bytes(), erased)
        for p in Path(lake.tenant_uri(tenant_id)).rglob("*")
        if p.is_file()
    )
    target = tmp_path / "export"
    result = export.export_tenant(conn, lake, tenant_id, Lake(str(target)))
    manifest = result.manifest
    names = {t["name"] for t in manifest["tables"]}
    assert {"bronze.events", "silver.claims", "gold.lineage", "gold.areas"} <= names
    assert any(n.startswith("gold.curated/") for n in names)
    assert files_holding(target, erased) == []
    for ciphertext in kept:
        assert files_holding(target, ciphertext), "a live body is exported"
    # Fresh tables: one commit each, no history.
    for t in manifest["tables"]:
        assert t["export_version"] == 0
        log = target / tenant_id / t["path"] / "_delta_log"
        assert sorted(p.name for p in log.glob("*.json")) == [f"{0:020d}.json"]
    bronze = next(t for t in manifest["tables"] if t["name"] == BRONZE_EVENTS.name)
    assert manifest["journal_head"]["journal_seq"] == bronze["rows"]
    check = export.verify_export(Lake(str(target)))
    assert check.ok, check.findings
    assert check.journal_head == manifest["journal_head"]


def test_verify_export_names_a_tampered_file(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"
    manifest = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target))).manifest
    silver = next(t for t in manifest["tables"] if t["name"] == SILVER_CLAIMS.name)
    victim = next(f["path"] for f in silver["files"] if f["path"].endswith(".parquet"))
    data = bytearray((target / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (target / victim).write_bytes(bytes(data))
    check = export.verify_export(Lake(str(target)))
    assert not check.ok
    assert any(line.startswith(victim) and "SHA-256" in line for line in check.findings)


def test_verify_export_catches_a_forged_journal_even_with_a_matching_manifest(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"
    export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target)))
    # Another key in the manifest: the chain no longer verifies under the keys it names.
    loaded = json.loads((target / export.MANIFEST).read_text())
    loaded["public_keys"] = {k: bytes(32).hex() for k in loaded["public_keys"]}
    (target / export.MANIFEST).write_text(json.dumps(loaded))
    check = export.verify_export(Lake(str(target)))
    assert any("journal_chain_verifies" in line for line in check.findings), check.findings


def test_an_export_target_must_be_empty_and_outside_the_lake(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    with pytest.raises(ExportTargetRefused, match="lake root"):
        export.export_tenant(conn, lake, keys.tenant_id, Lake(os.path.join(lake.root, "exports")))
    full = tmp_path / "full"
    full.mkdir()
    (full / "something.txt").write_text("x")
    with pytest.raises(ExportTargetRefused, match="something.txt"):
        export.export_tenant(conn, lake, keys.tenant_id, Lake(str(full)))
    assert sorted(p.name for p in full.iterdir()) == ["something.txt"]


def test_an_interrupted_export_resumes_without_a_row_twice(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"

    class Crash(Exception):
        pass

    seen: list[str] = []

    def crash_after_two(name: str) -> None:
        seen.append(name)
        if len(seen) == 2:
            raise Crash(name)

    with pytest.raises(Crash):
        export.export_tenant(
            conn, lake, keys.tenant_id, Lake(str(target)), after_table=crash_after_two
        )
    assert not (target / export.MANIFEST).exists()
    # A table whose write died before its commit leaves files but no table.
    third = target / keys.tenant_id / "gold" / "lineage"
    if not (third / "_delta_log").exists():
        third.mkdir(parents=True, exist_ok=True)
        (third / "part-00000-orphan.parquet").write_bytes(b"PAR1 half written")
    # More ops after the first run: the resumed export keeps the first run's snapshot.
    make_tree(conn, keys)
    drain_all(conn, lake)
    result = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target)))
    assert result.resumed and len(result.written) == len(result.manifest["tables"]) - 2
    check = export.verify_export(Lake(str(target)))
    assert check.ok, check.findings
    fresh = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(tmp_path / "again")))
    first_rows = {t["name"]: t["rows"] for t in result.manifest["tables"]}
    later_rows = {t["name"]: t["rows"] for t in fresh.manifest["tables"]}
    assert later_rows[BRONZE_EVENTS.name] > first_rows[BRONZE_EVENTS.name]
